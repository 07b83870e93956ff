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
from typing import Dict, List, Optional, Sequence, Tuple

import psutil

#: what a throw-away Slurm needs installed (Debian: slurmctld slurmd slurm-client munge)
SLURM_PROGRAMS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue", "sinfo", "scancel")
#: seconds a requeued job waits before it may start again (Slurm's default is 120)
REQUEUE_DELAY = 5


def missing_programs() -> List[str]:
    """The Slurm and munge programs that are not installed here."""
    return [name for name in SLURM_PROGRAMS if shutil.which(name) is None and not Path("/usr/sbin", name).exists()]


def unavailable_reason() -> Optional[str]:
    """Why a throw-away Slurm cannot be started here, or ``None`` if it can."""
    if os.geteuid() != 0:
        return "the throw-away Slurm needs root (slurmd runs jobs as their user)"
    missing = missing_programs()
    if missing:
        return f"Slurm/munge not installed (missing {', '.join(missing)}; apt-get install slurmctld slurmd slurm-client munge)"
    return None


def binary(name: str) -> str:
    """The path of a Slurm or munge program (daemons live in /usr/sbin, often not on PATH)."""
    return shutil.which(name) or str(Path("/usr/sbin", name))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def scontrol_field(job_line: str, name: str) -> str:
    """One field (``JobState``, ``Restarts``, ...) of ``scontrol show job -o``'s line, or ""."""
    for word in job_line.split():
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return ""


class SlurmFiles:
    """Every file of a throw-away Slurm under one folder, and the one slurm.conf writer: used by
    the single-node Slurm here and by the virtual cluster's (tests/vcluster.py), so both run the
    same configuration. ``root`` must be short: the munge socket's path has a length limit."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.etc = self.root / "etc"  # the virtual cluster's nodes see it as /etc/slurm
        self.conf = self.etc / "slurm.conf"
        self.munge = self.root / "munge"
        self.munge_key = self.munge / "munge.key"
        self.munge_socket = self.munge / "munge.sock"
        self.state = self.root / "state"
        self.spool = self.root / "spool"  # one folder per node
        self.log = self.root / "log"
        self.run = self.root / "run"  # pid files

    def pid_file(self, daemon: str, node: Optional[str] = None) -> Path:
        """``munged``, ``slurmctld`` or, with its node, ``slurmd``."""
        return self.run / (f"{daemon}-{node}.pid" if node else f"{daemon}.pid")

    def create_munge_key(self) -> None:
        """The folders and a fresh munge key (munged refuses a socket folder others can write to)."""
        for folder in (self.etc, self.munge, self.state, self.spool, self.log, self.run):
            folder.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        os.chmod(self.munge, 0o755)
        subprocess.run([binary("mungekey"), "--create", f"--keyfile={self.munge_key}"], check=True, capture_output=True)
        os.chmod(self.munge_key, 0o600)

    def munged_command(self) -> List[str]:
        """munged on this cluster's own socket, key, log and pid file."""
        return [binary("munged"), f"--socket={self.munge_socket}", f"--key-file={self.munge_key}",
                f"--log-file={self.log / 'munged.log'}", f"--pid-file={self.pid_file('munged')}",
                f"--seed-file={self.munge / 'munged.seed'}"]

    def write_conf(self, name: str, nodes: Sequence[Tuple[str, str]], cpus: int, gpus_per_node: int = 0,
                   ports: Optional[Tuple[int, int]] = None, settings: Sequence[str] = ()) -> None:
        """slurm.conf (and gres.conf with ``gpus_per_node`` fake GPUs, character devices with no
        driver behind them) for ``nodes`` (name, address), the first running slurmctld, each
        ``cpus`` CPUs in one partition ``debug``. ``ports``: slurmctld's and slurmd's (else Slurm's
        defaults, for nodes with a network of their own); ``settings``: more lines."""
        controller, address = nodes[0]
        for node, _ in nodes:
            (self.spool / node).mkdir(parents=True, exist_ok=True)
        gres = ""
        if gpus_per_node:
            devices = self.root / "dev"
            devices.mkdir(exist_ok=True)
            for gpu in range(gpus_per_node):
                device = devices / f"nvidia{gpu}"
                if not device.is_char_device():
                    os.mknod(device, 0o666 | 0o020000, os.makedev(195, gpu))
            (self.etc / "gres.conf").write_text(f"Name=gpu File={devices}/nvidia[0-{gpus_per_node - 1}]\n")
            gres = f" Gres=gpu:{gpus_per_node}"
        lines = [
            f"ClusterName={name}",
            f"SlurmctldHost={controller}({address})",  # no name lookup needed
            *([f"SlurmctldPort={ports[0]}", f"SlurmdPort={ports[1]}"] if ports else []),
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket},cred_expire={REQUEUE_DELAY}",
            f"StateSaveLocation={self.state}",
            f"SlurmdSpoolDir={self.spool}/%n",
            f"SlurmctldPidFile={self.pid_file('slurmctld')}",
            f"SlurmdPidFile={self.run}/slurmd-%n.pid",
            f"SlurmctldLogFile={self.log / 'slurmctld.log'}",
            f"SlurmdLogFile={self.log}/slurmd-%n.log",
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
            *settings,
            # job ids unlike any earlier cluster's: MPICH names its shared-memory segments after the
            # PMI job id, and a segment a SIGKILLed rank left in /dev/shm must not meet a new job 2
            f"FirstJobId={random.randint(1_000, 60_000_000)}",
            *(["GresTypes=gpu"] if gpus_per_node else []),
            *[f"NodeName={node} NodeAddr={node_address} CPUs={cpus}{gres} State=UNKNOWN" for node, node_address in nodes],
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")


class SlurmCluster:
    """One node, one partition ``debug``, ``cpus`` CPUs; ``env`` is what clients need."""

    def __init__(self, root: Path, cpus: int = 2):
        self.files = SlurmFiles(root)
        self.root = self.files.root
        self.cpus = cpus
        self.node = socket.gethostname()
        self.conf = self.files.conf
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
        files = self.files
        files.create_munge_key()
        self._run(files.munged_command(), dict(os.environ))
        self._pid_files.append(files.pid_file("munged"))
        # its own ports: the host's network is shared with whatever else runs here
        files.write_conf("throwaway", [(self.node, "127.0.0.1")], self.cpus, ports=(free_port(), free_port()))
        env = self.env
        self._run([binary("slurmctld"), "-c", "-f", str(self.conf)], env)
        self._pid_files.append(files.pid_file("slurmctld"))
        self._run([binary("slurmd"), "-f", str(self.conf)], env)
        self._pid_files.append(files.pid_file("slurmd", self.node))
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True)
            state = out.stdout.strip()
            if state == "idle":
                return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"Slurm did not become idle in {timeout:.0f} s (sinfo says {state!r}); logs in {self.files.log}")

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
        """Stop the daemons by the pids in their pid files (slurmd first, munged last). A pid whose
        process is not that daemon (it died, and other tests, which run meanwhile, started thousands
        of processes since) is left alone."""
        for pid_file in reversed(self._pid_files):
            try:
                pid = int(pid_file.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            daemon = pid_file.stem.split("-")[0]  # slurmd-NODE.pid -> slurmd
            try:
                if psutil.Process(pid).name() != daemon:
                    continue
            except psutil.Error:
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
        return scontrol_field(out, name)

    # ----- internals -----
    def _run(self, command: List[str], env: Dict[str, str]) -> None:
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            self.stop()
            raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()}; logs in {self.files.log}")


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
        try:
            input("Slurm is up; press Enter to stop it. ")
        except EOFError:  # standard input closed (started in the background): stop it the same way
            pass
