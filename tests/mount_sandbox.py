#!/usr/bin/env python3
"""Private mount namespaces for the tests of the pipeline format's own definitions.

Apptainer cannot be installed here, and the format's definitions name host folders this machine
lacks (``/data/sentiment-dataset``, ``/output``). Both are stood in for by real bind mounts in
private mount namespaces (``unshare --mount``, then ``mount --bind``), so nothing changes on the
machine's own ``/``:

    python tests/mount_sandbox.py host --bind SRC:DST ... --report FILE -- CMD ...
        runs CMD in a root of its own that holds every top-level folder of ``/`` and, in addition,
        SRC at DST; afterwards FILE (JSON) lists the top-level names CMD created in that root
        (the "host's" ``/shared``, say).
    python tests/mount_sandbox.py apptainer exec [--nv] [--bind|-B SRC[:DST[:ro]][,...]] ... IMAGE CMD ...
        what ``apptainer exec`` does with binds: CMD runs in a root of its own, read-only like a
        SIF image, holding the system folders (standing in for the image's operating system),
        apptainer's default binds ($HOME, /tmp, /proc, /sys, /dev, the current folder), the
        entries of ``APPTAINER_BINDPATH`` and each ``--bind``, in that order, ``:ro`` read-only.
        A destination that the image lacks is made in the image's root (apptainer's underlay);
        one inside a bound host folder that does not exist is refused (that would write on the
        host). ``--nv`` is recorded, not acted on (there is no GPU here). With
        ``MOUNT_SANDBOX_LOG`` set, each call appends a JSON line (argv, binds, nv, image, cwd) to it.

Needs root and ``unshare``: :func:`unavailable` says why not, in one line, where it cannot run.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

#: mounted over only inside the private namespace, where the new root is assembled
STAGING = "/mnt"
#: the folders of the host that stand in for an image's operating system
IMAGE_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "opt", "var")
LOG_ENV = "MOUNT_SANDBOX_LOG"
NAMESPACE_FLAG = "--in-private-namespace"

Bind = Tuple[str, str, bool]  # source, destination, read-only


def unavailable() -> Optional[str]:
    """None where private bind mounts work here, else why not (one line)."""
    if os.geteuid() != 0:
        return "needs root to bind folders in a private mount namespace (unshare --mount), as CI runs"
    try:
        probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                                f"mount -t tmpfs probe {STAGING} && mount --bind /tmp {STAGING}"],
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as error:
        return f"cannot run unshare --mount: {error}"
    if probe.returncode != 0:
        return f"unshare --mount with mount --bind fails here: {' '.join(probe.stderr.split())[:200]}"
    return None


def _mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise OSError(f"mount {' '.join(args)}: {done.stderr.strip()}")


def _die_with_parent() -> None:
    ctypes.CDLL("libc.so.6").prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG


def _copy_entry(name: str, root: str) -> None:
    """``/name`` into ``root``: a folder bound (with what is mounted under it), a link copied."""
    source, target = "/" + name, os.path.join(root, name)
    if os.path.islink(source):
        os.symlink(os.readlink(source), target)
    elif os.path.isdir(source):
        os.mkdir(target)
        _mount("--rbind", source, target)


def _mount_point(root: str, destination: str, source: str) -> str:
    """The path of ``destination`` in ``root``, made where it is missing, on the root's own file
    system only (never inside a bound host folder)."""
    target = os.path.join(root, destination.lstrip("/"))
    if os.path.lexists(target):
        return target
    existing = os.path.dirname(target)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if os.stat(existing).st_dev != os.stat(root).st_dev:
        raise OSError(f"mount point {destination} does not exist in the image and lies in the host folder "
                      f"{existing[len(root):] or '/'}: not made there")
    if os.path.isdir(source):
        os.makedirs(target)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        Path(target).touch()
    return target


def _bind(root: str, binds: Sequence[Bind], unless_there: bool = False) -> None:
    """Each bind in order; with ``unless_there``, only those whose destination the root lacks."""
    for source, destination, readonly in binds:
        if unless_there and os.path.exists(os.path.join(root, destination.lstrip("/"))):
            continue
        if not os.path.exists(source):
            raise OSError(f"mount source {source} doesn't exist")
        target = _mount_point(root, destination, source)
        _mount("--bind", source, target)
        if readonly:
            _mount("-o", "remount,bind,ro", target)


def _parse_bind(spec: str) -> List[Bind]:
    """apptainer's ``SRC[:DST[:OPTS]]``, several separated by ','."""
    binds = []
    for entry in filter(None, spec.split(",")):
        parts = entry.split(":")
        source = parts[0]
        destination = parts[1] if len(parts) > 1 and parts[1] else source
        options = parts[2].split(";") if len(parts) > 2 else []
        binds.append((source, destination, "ro" in options))
    return binds


def _in_namespace(argv: List[str]) -> "os.NoReturn":
    """Run this script again in a private mount namespace: mounts made there are its own."""
    os.execvp("unshare", ["unshare", "--mount", "--propagation", "private", sys.executable, __file__,
                          NAMESPACE_FLAG, *argv])


def host(argv: List[str]) -> int:
    """``host --bind SRC:DST ... --report FILE -- CMD ...``: see the module's docstring."""
    binds: List[Bind] = []
    report = None
    while argv and argv[0] != "--":
        option, value, argv = argv[0], argv[1], argv[2:]
        if option == "--bind":
            binds += _parse_bind(value)
        elif option == "--report":
            report = value
        else:
            raise SystemExit(f"mount_sandbox host: unknown option {option}")
    command = argv[1:]
    root = STAGING
    _mount("-t", "tmpfs", "-o", "mode=755", "sandbox-host", root)
    for name in sorted(os.listdir("/")):
        if name == os.path.basename(STAGING):
            os.mkdir(os.path.join(root, name))  # the next sandbox (the stand-in apptainer) assembles its root there
            continue
        try:
            _copy_entry(name, root)
        except OSError as error:  # a folder of the machine's own that cannot be bound: left out
            print(f"mount_sandbox host: left out /{name}: {error}", file=sys.stderr)
    _bind(root, binds)
    before = set(os.listdir(root))
    cwd = os.getcwd()

    def enter() -> None:
        _die_with_parent()
        os.chroot(root)
        os.chdir(cwd)

    code = subprocess.call(command, preexec_fn=enter)
    if report:
        Path(report).write_text(json.dumps({"new_top_level": sorted(set(os.listdir(root)) - before)}))
    return code


def apptainer(argv: List[str]) -> int:
    """``apptainer exec [options] IMAGE CMD ...``: see the module's docstring."""
    if not argv or argv[0] != "exec":
        print("stand-in apptainer: only 'exec' is supported", file=sys.stderr)
        return 255
    args, binds, nv = argv[1:], [], False
    while args and args[0].startswith("-"):
        if args[0] == "--nv":
            nv, args = True, args[1:]
        elif args[0] in ("--bind", "-B"):
            binds, args = binds + _parse_bind(args[1]), args[2:]
        else:
            print(f"stand-in apptainer: unknown option {args[0]}", file=sys.stderr)
            return 255
    image, command = args[0], args[1:]
    cwd = os.getcwd()
    if os.environ.get(LOG_ENV):
        with open(os.environ[LOG_ENV], "a") as log:
            log.write(json.dumps({"argv": argv, "binds": binds, "nv": nv, "image": image, "cwd": cwd}) + "\n")
    if not os.path.isfile(image):
        print(f"FATAL:   could not open image {image}: no such file", file=sys.stderr)
        return 255
    root = STAGING
    _mount("-t", "tmpfs", "-o", "mode=755", "sandbox-image", root)
    for name in IMAGE_DIRS:
        if os.path.lexists("/" + name):
            _copy_entry(name, root)
    defaults = [(path, path, False) for path in ("/proc", "/sys", "/dev", "/tmp", os.environ.get("HOME", "/root"), cwd)]
    from_environment = _parse_bind(os.environ.get("APPTAINER_BINDPATH") or os.environ.get("SINGULARITY_BINDPATH") or "")
    try:
        _bind(root, defaults, unless_there=True)
        _bind(root, from_environment + binds)
        _mount("-o", "remount,ro", root)  # a SIF image is read-only: no write lands outside a bind
    except OSError as error:
        print(f"FATAL:   container creation failed: {error}", file=sys.stderr)
        return 255
    os.chroot(root)
    os.chdir(cwd)
    os.execvp(command[0], command)


def main(argv: List[str]) -> int:
    if not argv or argv[0] != NAMESPACE_FLAG:
        _in_namespace(argv)
    mode, rest = argv[1], argv[2:]
    return host(rest) if mode == "host" else apptainer(rest)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
