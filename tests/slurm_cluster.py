"""A throw-away single-node Slurm (munge + slurmctld + slurmd) in a temporary folder.

Used by the Slurm tests (the ``slurm`` fixture below): no systemd, no cgroups, no fixed
ports, nothing outside its folder. Run ``python tests/slurm_cluster.py`` to start one by hand;
it prints ``export SLURM_CONF=...`` and stops when you press Enter.
"""
from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "scontrol", "squeue", "sinfo", "scancel")
#: seconds a requeued job waits before it may start again (Slurm's default is 120)
REQUEUE_DELAY = 5


def unavailable_reason() -> Optional[str]:
    """Why a throw-away Slurm cannot be started here, or ``None`` if it can."""
    if os.geteuid() != 0:
        return "the throw-away Slurm needs root (slurmd runs jobs as their user)"
    missing = [name for name in DAEMONS + CLIENTS if shutil.which(name) is None
               and not Path("/usr/sbin", name).exists()]
    if missing:
        return f"Slurm/munge not installed (missing {', '.join(missing)}; apt-get install slurmctld slurmd slurm-client munge)"
    return None


def _binary(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class SlurmCluster:
    """One node, one partition ``debug``, ``cpus`` CPUs; ``env`` is what clients need."""

    def __init__(self, root: Path, cpus: int = 2):
        self.root = Path(root)
        self.cpus = cpus
        self.node = socket.gethostname()
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "socket"
        self._pid_files: List[Path] = []

    @property
    def env(self) -> Dict[str, str]:
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf)
        for name in [key for key in env if key.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))]:
            if name != "SLURM_CONF":
                del env[name]
        return env

    # ----- start / stop -----
    def start(self, timeout: float = 30.0) -> "SlurmCluster":
        self._start_munge()
        self._write_conf()
        env = self.env
        self._run([_binary("slurmctld"), "-c", "-f", str(self.conf)], env)
        self._pid_files.append(self.root / "slurmctld.pid")
        self._run([_binary("slurmd"), "-f", str(self.conf)], env)
        self._pid_files.append(self.root / "slurmd.pid")
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True)
            state = out.stdout.strip()
            if state == "idle":
                return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"Slurm did not become idle in {timeout:.0f} s (sinfo says {state!r}); logs in {self.root}")

    def cancel_all(self, timeout: float = 20.0) -> None:
        """Cancel every job of this throw-away cluster (all are ours) and wait until none is left."""
        subprocess.run(["scancel", "--user", str(os.geteuid())], env=self.env, capture_output=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = subprocess.run(["squeue", "-h", "-o", "%i"], env=self.env, capture_output=True, text=True)
            if out.returncode != 0 or not out.stdout.strip():
                return
            time.sleep(0.5)

    def stop(self) -> None:
        """Stop the daemons by the pids in their pid files (slurmd first, munged last)."""
        for pid_file in reversed(self._pid_files):
            try:
                pid = int(pid_file.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            for _ in range(100):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
            else:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self._pid_files.clear()

    def __enter__(self) -> "SlurmCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ----- helpers for tests -----
    def job_field(self, job_id: str, name: str) -> str:
        """One field of ``scontrol show job`` (e.g. ``JobState``, ``Restarts``)."""
        out = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=self.env,
                             capture_output=True, text=True).stdout
        for word in out.split():
            if word.startswith(name + "="):
                return word.split("=", 1)[1]
        return ""

    # ----- internals -----
    def _run(self, command: List[str], env: Dict[str, str]) -> None:
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            self.stop()
            raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()}; logs in {self.root}")

    def _start_munge(self) -> None:
        folder = self.root / "munge"
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        os.chmod(folder, 0o755)  # munged refuses a socket folder others can write to
        key = folder / "munge.key"
        self._run([_binary("mungekey"), "--create", f"--keyfile={key}"], dict(os.environ))
        os.chmod(key, 0o600)
        self._run([_binary("munged"), f"--socket={self.munge_socket}", f"--key-file={key}",
                   f"--log-file={folder / 'munged.log'}", f"--pid-file={folder / 'munged.pid'}",
                   f"--seed-file={folder / 'munged.seed'}"], dict(os.environ))
        self._pid_files.append(folder / "munged.pid")

    def _write_conf(self) -> None:
        root = self.root
        for sub in ("state", "spool"):
            (root / sub).mkdir(exist_ok=True)
        lines = [
            "ClusterName=throwaway",
            f"SlurmctldHost={self.node}(127.0.0.1)",  # no name lookup needed
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket},cred_expire={REQUEUE_DELAY}",
            f"StateSaveLocation={root / 'state'}",
            f"SlurmdSpoolDir={root / 'spool'}",
            f"SlurmctldPidFile={root / 'slurmctld.pid'}",
            f"SlurmdPidFile={root / 'slurmd.pid'}",
            f"SlurmctldLogFile={root / 'slurmctld.log'}",
            f"SlurmdLogFile={root / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SlurmdParameters=config_overrides",  # trust CPUs= below even on a smaller machine
            "ReturnToService=2",
            "JobRequeue=1",
            "MpiDefault=none",
            "MailProg=/bin/true",
            "SchedulerParameters=sched_interval=2,bf_interval=1",  # start requeued jobs promptly
            "KillWait=5",
            # job ids unlike any earlier cluster's: MPICH names its shared-memory segments after the
            # PMI job id, and a segment a SIGKILLed rank left in /dev/shm must not meet a new job 2
            f"FirstJobId={random.randint(1_000, 60_000_000)}",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN",
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")


def _cpus() -> int:
    """Two at least: the tests run a 2-rank job (slurmd trusts this with config_overrides)."""
    return max(2, len(os.sched_getaffinity(0)))


try:
    import pytest
except ImportError:  # the module also runs by hand without pytest
    pytest = None

if pytest is not None:

    @pytest.fixture(scope="session")
    def slurm():
        """A running throw-away Slurm for the whole session, stopped by pid afterwards."""
        reason = unavailable_reason()
        if reason:
            pytest.skip(reason)
        root = Path(tempfile.mkdtemp(prefix="slurm-"))  # short path: the munge socket name has a limit
        cluster = SlurmCluster(root, cpus=_cpus()).start()
        try:
            yield cluster
        finally:
            cluster.cancel_all()
            cluster.stop()
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    reason = unavailable_reason()
    if reason:
        raise SystemExit(reason)
    with tempfile.TemporaryDirectory(prefix="slurm-") as tmp, SlurmCluster(Path(tmp), cpus=_cpus()) as cluster:
        print(f"export SLURM_CONF={cluster.conf}")
        input("Slurm is up; press Enter to stop it. ")
