"""Logging on stderr, each line prefixed with where it comes from: rank, host."""
from __future__ import annotations

import logging
import socket
import sys

log = logging.getLogger("multinode_gpu")


def setup_logging(rank: int, level: int = logging.INFO) -> None:
    host = socket.gethostname().split(".")[0]
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"[rank {rank} {host}] %(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False


def add_file_log(path: str) -> None:
    """Also keep the rank's log in the results folder."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
