"""A real multi-node cluster on this one machine, built from Linux namespaces (root only).

Each node is a network namespace with its own address on a bridge (in a separate "switch"
namespace), and a UTS + mount namespace held open by a ``sleep`` process: its own hostname,
/etc/hosts, boot_id and machine-id (UCX joins processes that share a boot_id through shared
memory, so nothing would cross the network), a private /tmp and /dev/shm. MPI goes over TCP between
them: MPICH's hydra reaches a node through an "ssh" that enters its namespaces, and a real Slurm
(munged and slurmctld on node1, one slurmd per node, 2 fake GPUs per node as character devices)
schedules jobs on them.

Safety: the nodes' subnet is private and unrouted; before anything starts the host gets an
``unreachable`` route for it, so nothing can leave the machine; no daemon or client ever runs in
the host's namespaces; teardown goes by pid and namespace identity, never by process name.
Run ``python tests/vcluster.py`` to bring one up by hand (Enter tears it down).

In tests: the session fixture ``vcluster`` (made available by tests/conftest.py: import it there
only, or each importing module gets a cluster of its own) is a VirtualCluster of node1..node3
with Slurm where installed. Everything runs inside a node, never on the host:
``run``/``popen`` a command there (cwd: the checkout), ``hydra`` builds the mpiexec command for
node1, ``sbatch``/``job_state``/``wait_job``/``job_output``/``squeue`` drive Slurm (``require_slurm``
first). Faults: ``kill_node_processes``, ``kill_python``, ``kill_node``/``revive``,
``cut_link``/``restore_link``, ``stop_slurmd``/``start_slurmd``. ``shared`` is a folder every node
sees (results go there); ``logs()`` is for assertion messages.
"""
from __future__ import annotations

import atexit
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import textwrap
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from slurm_cluster import SlurmFiles, binary, missing_programs, scontrol_field

REPO = Path(__file__).resolve().parents[1]
#: folder every node sees at the same path (the nodes' /tmp is their own)
SHARED_ROOT = Path("/var/tmp/multinode-gpu-vcluster")
#: the daemons kill_node_processes(only_job=True) leaves alone
DAEMONS = ("slurmd", "slurmstepd", "slurmctld", "slurmscriptd", "munged")

_SSH = r"""#!/bin/sh
# "ssh [options] HOST COMMAND..." for MPICH hydra: runs COMMAND in HOST's namespaces.
while [ $# -gt 0 ]; do
  case $1 in
    -[oplicFEJLRDWbemw]) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
host=${1#*@}; host=${host%%.*}; shift
cpus=$(cat "@DIR@/$host.cpus" 2>/dev/null || true)
exec ${cpus:+taskset -c "$cpus"} nsenter -t "$(cat "@DIR@/$host.pid")" -n -u -m --wdns="${PWD:-/}" -- /bin/sh -c "$*"
"""

_HOLDER = r"""
set -e
hostname "$NODE"
mount --bind "$DIR/hosts" /etc/hosts
mkdir -p "$DIR/cg-$NODE"
mount --rbind /sys/fs/cgroup "$DIR/cg-$NODE"
umount -l /sys && mount -t sysfs sysfs /sys
mount --move "$DIR/cg-$NODE" /sys/fs/cgroup
cat /proc/sys/kernel/random/uuid > "$DIR/$NODE.boot_id"
mount --bind "$DIR/$NODE.boot_id" /proc/sys/kernel/random/boot_id
cat /proc/sys/kernel/random/uuid | tr -d - > "$DIR/$NODE.machine-id"
mount --bind "$DIR/$NODE.machine-id" /etc/machine-id
if [ "$PRIVATE_TMP" = 1 ]; then
  # folders under /tmp every node must still see (a checkout in /tmp): held aside, then bound back
  i=0; for keep in $KEEP; do i=$((i + 1)); mkdir -p "$DIR/keep-$NODE-$i"; mount --rbind "$keep" "$DIR/keep-$NODE-$i"; done
  mount -t tmpfs -o mode=1777,size=2g "tmp-$NODE" /tmp
  mount -t tmpfs -o mode=1777,size=1g "shm-$NODE" /dev/shm
  i=0; for keep in $KEEP; do
    i=$((i + 1)); mkdir -p "$keep"; mount --rbind "$DIR/keep-$NODE-$i" "$keep"; umount -l "$DIR/keep-$NODE-$i"
  done
fi
if [ -d /etc/slurm ]; then mount --bind "$DIR/slurm/etc" /etc/slurm; fi
echo $$ > "$DIR/$NODE.pid"
exec sleep infinity
"""


def unavailable_reason(slurm: bool = False) -> Optional[str]:
    """Why a virtual cluster cannot be built here (or Slurm on it), or None."""
    if os.geteuid() != 0:
        return "the virtual cluster needs root (network namespaces)"
    for program in ("ip", "nsenter", "unshare", "mount"):
        if shutil.which(program) is None:
            return f"the virtual cluster needs {program} (apt-get install iproute2 util-linux)"
    probe = subprocess.run(["unshare", "--net", "--uts", "--mount", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"namespaces are not allowed here ({probe.stderr.strip() or probe.returncode})"
    if slurm:
        missing = missing_programs()
        if missing:
            return f"Slurm/munge not installed (missing {', '.join(missing)})"
    return None


_made = itertools.count()  # clusters made by this process: the second and later ones get
_instances = itertools.count(1)  # a suffix in their tag


def sweep_stale() -> List[str]:
    """Remove the clusters whose owning process died without its teardown (SIGKILL): every process
    in their network namespaces (by namespace identity), the namespaces, the host route, the
    folder. A cluster whose owner lives is never touched. Returns what was removed."""
    removed = []
    host_net = os.stat("/proc/self/ns/net").st_ino
    for record_file in sorted(SHARED_ROOT.glob("*/cluster.json")):
        try:
            record = json.loads(record_file.read_text())
            state = Path(f"/proc/{int(record['owner'])}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if state != "Z":
                continue  # its owner lives: not ours to remove
        except FileNotFoundError:
            pass  # its owner is gone
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            continue
        inodes = set()
        for netns in record.get("netns", []):
            try:
                inodes.add(os.stat(f"/run/netns/{netns}").st_ino)
            except OSError:
                pass
        inodes.discard(host_net)
        for entry in os.listdir("/proc"):
            try:
                if entry.isdigit() and os.stat(f"/proc/{entry}/ns/net").st_ino in inodes:
                    os.kill(int(entry), signal.SIGKILL)
            except OSError:
                pass
        for netns in reversed(record.get("netns", [])):
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        if record.get("subnet"):
            subprocess.run(["ip", "route", "del", "unreachable", f"{record['subnet']}.0/24"], capture_output=True)
        shutil.rmtree(record_file.parent, ignore_errors=True)
        removed.append(record_file.parent.name)
    return removed


class VirtualCluster:
    """``nodes`` nodes named node1..nodeN; ``shared`` is seen by every node at the same path.

    ``private_tmp``: each node its own tmpfs /tmp and /dev/shm (the shared folder and the project
    are elsewhere, so every node still sees them). ``cpus``: a CPU list per node for ``taskset``
    (say ``["0", "1", "1"]``), so each rank sees its share of the machine; None: every CPU.
    ``keep``: folders under /tmp or /dev/shm that every node must see all the same (the checkout
    is kept by itself where it lies there); each node sees the host's folder at the same path.
    """

    def __init__(self, nodes: int = 3, tag: Optional[str] = None, private_tmp: bool = True,
                 cpus: Optional[Sequence[str]] = None, keep: Sequence[Path] = ()):
        self.count = nodes
        self.private_tmp = private_tmp
        # what lies under a node's private /tmp or /dev/shm but every node must see: the checkout
        self.keep = [str(path) for path in (REPO, *keep) if path.resolve().parts[1:2] in (("tmp",), ("dev",))]
        self.cpus = dict(zip((f"node{i}" for i in range(1, nodes + 1)), cpus or ()))
        # unique among live processes and clusters (a second one in this process gets its own
        # namespaces and folder); port names stay under 16 bytes
        self.tag = tag or f"mg{os.getpid():x}" + (f"x{next(_instances)}" if next(_made) else "")
        self.subnet = f"10.213.{random.randint(1, 250)}"
        self.nodes = [f"node{i}" for i in range(1, nodes + 1)]
        self.dir = SHARED_ROOT / self.tag
        self.shared = self.dir / "shared"
        self.switch = f"{self.tag}sw"
        self.ssh = self.dir / "ssh"
        self.slurm_files = SlurmFiles(self.dir / "slurm")  # the nodes' /etc/slurm is its etc/
        self._holders: Dict[str, int] = {}
        self._netns: List[str] = []  # the namespaces we made (and only those are deleted)
        self._route = False
        self._daemons: List[Path] = []  # pid files, in start order
        self.slurm_reason: Optional[str] = "Slurm was not started"  # why Slurm tests skip, or None
        self.slurm_failed: Optional[str] = None  # Slurm is installed but did not come up

    # ----- bring-up -----
    def up(self) -> "VirtualCluster":
        atexit.register(self.down)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._claim_subnet()
        self._record()
        self.slurm_files.etc.mkdir(parents=True, exist_ok=True)
        self.shared.mkdir(parents=True, exist_ok=True)
        (self.dir / "hosts").write_text("127.0.0.1 localhost\n" + "".join(
            f"{self.address(node)} {node}\n" for node in self.nodes))
        self.ssh.write_text(_SSH.replace("@DIR@", str(self.dir)))
        self.ssh.chmod(0o755)
        self._add_netns(self.switch)
        self._ip("-n", self.switch, "link", "set", "lo", "up")
        self._ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        self._ip("-n", self.switch, "link", "set", "br0", "up")
        for node in self.nodes:
            netns = self.netns(node)
            self._add_netns(netns)
            self._ip("link", "add", self.port(node), "netns", self.switch, "type", "veth", "peer", "name", "eth0",
                     "netns", netns)
            self._ip("-n", self.switch, "link", "set", self.port(node), "master", "br0", "up")
            self._ip("-n", netns, "link", "set", "lo", "up")
            self._ip("-n", netns, "addr", "add", f"{self.address(node)}/24", "dev", "eth0")
            self._ip("-n", netns, "link", "set", "eth0", "up")
            if node in self.cpus:
                (self.dir / f"{node}.cpus").write_text(self.cpus[node])
            env = dict(os.environ, NODE=node, DIR=str(self.dir), PRIVATE_TMP=str(int(self.private_tmp)),
                       KEEP=" ".join(self.keep))
            subprocess.Popen(["nsenter", f"--net=/run/netns/{netns}", "unshare", "--uts", "--mount",
                              "--propagation", "private", "sh", "-c", _HOLDER], env=env, stdin=subprocess.DEVNULL,
                             stdout=open(self.dir / f"{node}.holder.log", "w"), stderr=subprocess.STDOUT,
                             start_new_session=True)
        for node in self.nodes:
            pid_file = self.dir / f"{node}.pid"
            deadline = time.monotonic() + 10
            while not pid_file.exists() or not pid_file.read_text().strip():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{node} did not come up: {(self.dir / f'{node}.holder.log').read_text()}")
                time.sleep(0.05)
            self._holders[node] = int(pid_file.read_text())
        return self

    def start_slurm(self, gpus_per_node: int = 2, cpus: int = 2) -> None:
        """munged and slurmctld on node1, a slurmd on every node, ``gpus_per_node`` fake GPUs each: the
        single-node Slurm's configuration (slurm_cluster.SlurmFiles), with a node declared DOWN after
        30 s of silence (Slurm's default: 300) so that the fault tests see it happen."""
        files = self.slurm_files
        files.create_munge_key()
        self.run("node1", files.munged_command(), check=True)
        self._daemons.append(files.pid_file("munged"))
        files.write_conf("vc", [(node, self.address(node)) for node in self.nodes], cpus, gpus_per_node,
                         settings=["SlurmdTimeout=30", "MessageTimeout=5"])
        self.run("node1", [binary("slurmctld"), "-c"], check=True)
        self._daemons.append(files.pid_file("slurmctld"))
        for node in self.nodes:
            self.run(node, [binary("slurmd")], check=True)
            self._daemons.append(files.pid_file("slurmd", node))
        deadline = time.monotonic() + 60
        states = ""
        while time.monotonic() < deadline:
            states = self.run("node1", ["sinfo", "-h", "-N", "-o", "%N %T"]).stdout
            if states.count(" idle") == self.count:
                self.slurm_reason = None
                return
            time.sleep(0.3)
        raise RuntimeError(f"Slurm did not come up: {states!r}; logs in {files.log}")

    # ----- using it -----
    def netns(self, node: str) -> str:
        return f"{self.tag}{node}"

    def port(self, node: str) -> str:
        return f"{self.tag}p{node[4:]}"

    def address(self, node: str) -> str:
        return f"{self.subnet}.{10 + int(node[4:])}"

    def enter(self, node: str) -> List[str]:
        """The words that run a command inside ``node`` (working folder: the current one)."""
        pinned = ["taskset", "-c", self.cpus[node]] if node in self.cpus else []
        return [*pinned, "nsenter", "-t", str(self._holders[node]), "-n", "-u", "-m", f"--wdns={os.getcwd()}", "--"]

    def run(self, node: str, argv: Sequence[str], *, timeout: float = 300, check: bool = False,
            env: Optional[Dict[str, str]] = None, cwd: Path = REPO) -> subprocess.CompletedProcess:
        done = subprocess.run(self.enter(node)[:-2] + [f"--wdns={cwd}", "--", *argv], capture_output=True, text=True,
                              timeout=timeout, env=self._env(env))
        if check and done.returncode != 0:
            raise RuntimeError(f"{node}: {' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
        return done

    def popen(self, node: str, argv: Sequence[str], *, env: Optional[Dict[str, str]] = None, cwd: Path = REPO,
              **popen_args) -> subprocess.Popen:
        """``argv`` started in ``node``; its output piped unless ``popen_args`` say otherwise (a long
        run that prints much should write to a file: ``stdout=handle, stderr=subprocess.STDOUT``)."""
        options = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        return subprocess.Popen(self.enter(node)[:-2] + [f"--wdns={cwd}", "--", *argv], env=self._env(env),
                                **{**options, **popen_args})

    def hydra(self, program: Sequence[str], hosts: Sequence[str], *, env: Optional[Dict[str, str]] = None) -> List[str]:
        """The mpiexec command (to give :meth:`run` or :meth:`popen` on node1) that starts one rank
        on each of ``hosts`` through the ``ssh`` that enters a node: ``program`` follows ``python``;
        ``env`` is set in every rank (-genv; the rest of mpiexec's environment goes along too)."""
        settings = [word for name, value in (env or {}).items() for word in ("-genv", name, value)]
        return [str(REPO / ".venv" / "bin" / "mpiexec"), "-launcher", "ssh", "-launcher-exec", str(self.ssh),
                *settings, "-hosts", ",".join(hosts), "-ppn", "1", "-n", str(len(hosts)),
                str(REPO / ".venv" / "bin" / "python"), *program]

    def processes(self, node: str) -> List[int]:
        """Every process living in ``node``'s namespaces except its holder (found by namespace identity)."""
        holder = self._holders.get(node)
        if holder is None:
            return []
        try:
            uts = os.readlink(f"/proc/{holder}/ns/uts")
        except OSError:
            return []
        if uts == os.readlink("/proc/self/ns/uts"):
            return []  # never the host's own processes
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != holder:
                try:
                    if os.readlink(f"/proc/{entry}/ns/uts") == uts:
                        found.append(int(entry))
                except OSError:
                    pass
        return found

    def kill_python(self, node: str, sig: int = signal.SIGKILL) -> List[int]:
        """``sig`` to the node's Python processes (an MPI rank and its workers): the job dies there."""
        hit = []
        for pid in self.processes(node):
            try:
                if Path(f"/proc/{pid}/comm").read_text().startswith("python"):
                    os.kill(pid, sig)
                    hit.append(pid)
            except OSError:
                pass
        return hit

    def kill_node(self, node: str) -> None:
        """The whole node dies: every process in it (slurmd too), its link down."""
        self.cut_link(node)
        for pid in self.processes(node):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def revive(self, node: str) -> None:
        """After :meth:`kill_node`: its link up and its slurmd started again (Slurm returns it to service)."""
        self.restore_link(node)
        if not self.slurm_reason and not any(Path(f"/proc/{pid}/comm").read_text().strip() == "slurmd"
                                             for pid in self.processes(node) if Path(f"/proc/{pid}/comm").exists()):
            self.run(node, [binary("slurmd")])

    def cut_link(self, node: str) -> None:
        self._ip("-n", self.switch, "link", "set", self.port(node), "down")

    def restore_link(self, node: str) -> None:
        self._ip("-n", self.switch, "link", "set", self.port(node), "up")

    def job_field(self, job_id: str, name: str) -> str:
        return scontrol_field(self.run("node1", ["scontrol", "show", "job", "-o", job_id]).stdout, name)

    def require_slurm(self) -> None:
        """In a test: skip it where Slurm is not installed, fail it where Slurm did not come up."""
        if self.slurm_failed:
            pytest.fail(self.slurm_failed)
        if self.slurm_reason:
            pytest.skip(self.slurm_reason)

    def kill_node_processes(self, node: str, sig: int = signal.SIGKILL, only_job: bool = True) -> List[int]:
        """``sig`` to the processes in ``node``'s namespaces (by namespace identity, never by name):
        with ``only_job`` all but the Slurm and munge daemons (an MPI rank, its workers, hydra's
        proxy, a batch shell), else every one (the node dies; its holder stays). Returns the pids."""
        hit = []
        for pid in self.processes(node):
            try:
                if only_job and Path(f"/proc/{pid}/comm").read_text().strip() in DAEMONS:
                    continue
                os.kill(pid, sig)
                hit.append(pid)
            except OSError:
                pass
        return hit

    def slurmd(self, node: str) -> Optional[int]:
        """The pid of ``node``'s slurmd, or None."""
        for pid in self.processes(node):
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "slurmd":
                    return pid
            except OSError:
                pass
        return None

    def stop_slurmd(self, node: str, sig: int = signal.SIGKILL) -> None:
        """``node``'s slurmd stops (SIGKILL: it dies; the jobs' steps live on, as on a real node)."""
        pid = self.slurmd(node)
        if pid is not None:
            os.kill(pid, sig)

    def start_slurmd(self, node: str) -> None:
        """``node``'s slurmd again, unless one runs (ReturnToService=2 brings the node back)."""
        if self.slurmd(node) is None:
            self.run(node, [binary("slurmd")], check=True)

    def sbatch(self, script, *args: str, wait: bool = False, timeout: float = 600) -> str:
        """Submit ``script`` (a path, or the text of one) from node1 with ``args`` after it; its
        output goes to ``shared/slurm-JOB.out`` (:meth:`job_output`). Returns the job id; with
        ``wait``, once the job has ended (see :meth:`job_state` for how)."""
        if isinstance(script, str) and "\n" in script:
            text, script = script, self.shared / f"job-{time.monotonic_ns()}.sbatch"
            script.write_text(text)
        done = self.run("node1", ["sbatch", "--parsable", f"--output={self.shared}/slurm-%j.out", str(script), *args],
                        timeout=60)
        job = done.stdout.strip().split(";")[0]
        if not job.isdigit():
            raise RuntimeError(f"sbatch failed ({done.returncode}): {done.stderr.strip()}")
        if wait:  # polled here: sbatch --wait polls at up to 10 s intervals
            self.wait_job(job, timeout)
        return job

    def job_state(self, job: str) -> str:
        """PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, NODE_FAIL, REQUEUED, ... ("" once forgotten)."""
        return self.job_field(job, "JobState")

    def wait_job(self, job: str, timeout: float = 600) -> str:
        """Wait until ``job`` has ended; returns its last state."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.job_state(job)
            if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED"):
                return state
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job} still {state} after {timeout} s\n{self.logs()}")
            time.sleep(0.5)

    def wait_nodes_up(self, timeout: float = 120) -> None:
        """Until every node is back in service (after a fault test cut or killed one): a node
        Slurm set DOWN is resumed once its slurmd answers again."""
        deadline = time.monotonic() + timeout
        restarted = set()
        while True:
            states = dict(line.split() for line in self.run("node1", ["sinfo", "-h", "-N", "-o", "%N %T"]).stdout.splitlines()
                          if line.strip())
            for node, state in states.items():
                # not responding although its link is back: a slurmd registers only when it starts
                if state.endswith("*") and node not in restarted:
                    restarted.add(node)
                    self.stop_slurmd(node, signal.SIGTERM)
                    time.sleep(1)
                    self.stop_slurmd(node)
                    self.start_slurmd(node)
            if all(state.rstrip("*") in ("idle", "mixed", "allocated") and not state.endswith("*")
                   for state in states.values()):
                return
            for node, state in states.items():
                if state.startswith(("down", "drain")) and not state.endswith("*"):
                    self.run("node1", ["scontrol", "update", f"nodename={node}", "state=resume"])
            if time.monotonic() > deadline:
                raise TimeoutError(f"nodes not back in service after {timeout} s: {states}\n{self.logs()}")
            time.sleep(0.5)

    def job_output(self, job: str) -> str:
        """What the batch script printed (its stdout and stderr)."""
        path = self.shared / f"slurm-{job}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def squeue(self) -> str:
        return self.run("node1", ["squeue", "-h", "-o", "%i %T %N %r"]).stdout

    def logs(self, lines: int = 30) -> str:
        """The last ``lines`` of every log the cluster keeps (holders, munged, slurmctld, each
        slurmd) and the nodes' Slurm states: for an assertion's message."""
        parts = []
        for path in sorted(self.dir.glob("*.holder.log")) + sorted(self.slurm_files.log.glob("*.log")):
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"== {path.name}\n" + "\n".join(tail))
        if not self.slurm_reason:
            parts.append("== sinfo\n" + self.run("node1", ["sinfo", "-h", "-N", "-o", "%N %T %E"], timeout=30).stdout)
        return "\n".join(parts)

    # ----- teardown -----
    def down(self) -> None:
        """Everything stopped and removed, whatever state it is in (safe to call twice)."""
        for pid_file in reversed(self._daemons):
            try:
                pid = int(pid_file.read_text().split()[0])
                if self._node_of(pid):  # a pid file names a pid: only ever one of our nodes' processes
                    os.kill(pid, signal.SIGTERM)
            except (OSError, ValueError, IndexError):
                pass
        self._daemons.clear()
        time.sleep(0.2 if self._holders else 0)
        for node in list(self._holders):
            for pid in self.processes(node):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            try:
                os.kill(self._holders.pop(node), signal.SIGKILL)
            except OSError:
                pass
        for netns in reversed(self._netns):
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        self._netns.clear()
        if self._route:
            subprocess.run(["ip", "route", "del", "unreachable", f"{self.subnet}.0/24"], capture_output=True)
            self._route = False
        shutil.rmtree(self.dir, ignore_errors=True)

    # ----- internals -----
    def _claim_subnet(self) -> None:
        """Install the host's ``unreachable`` route for a 10.213.K.0/24 nobody routes yet. ``ip route
        add`` (not replace) fails on a route that exists: a subnet another session's cluster uses is
        never taken over, nor its route deleted at our teardown."""
        for _ in range(50):
            added = subprocess.run(["ip", "route", "add", "unreachable", f"{self.subnet}.0/24"], capture_output=True,
                                   text=True)
            if added.returncode == 0:
                self._route = True
                return
            if "exists" not in added.stderr:
                raise RuntimeError(f"ip route add unreachable {self.subnet}.0/24: {added.stderr.strip()}")
            self.subnet = f"10.213.{random.randint(1, 250)}"
        raise RuntimeError("no free 10.213.K.0/24 subnet for the virtual cluster")

    def _node_of(self, pid: int) -> Optional[str]:
        """The node whose namespaces ``pid`` lives in (by UTS namespace identity), or None."""
        try:
            uts = os.readlink(f"/proc/{pid}/ns/uts")
        except OSError:
            return None
        for node, holder in self._holders.items():
            try:
                if os.readlink(f"/proc/{holder}/ns/uts") == uts and uts != os.readlink("/proc/self/ns/uts"):
                    return node
            except OSError:
                pass
        return None

    def _add_netns(self, name: str) -> None:
        self._ip("netns", "add", name)  # fails on a name that exists: never someone else's
        self._netns.append(name)
        self._record()

    def _record(self) -> None:
        """What :func:`sweep_stale` needs to remove this cluster should its process be SIGKILLed."""
        record = {"owner": os.getpid(), "subnet": self.subnet if self._route else None, "netns": self._netns}
        (self.dir / "cluster.json").write_text(json.dumps(record))

    @staticmethod
    def _ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)

    @staticmethod
    def _env(extra: Optional[Dict[str, str]]) -> Dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SLURM_", "PMI_", "PMIX_", "HYDRA_", "OMPI_", "MPIR_"))}
        env["PYTHONUNBUFFERED"] = "1"
        env.pop("SLURM_CONF", None)
        return {**env, **(extra or {})}


try:
    import pytest
except ImportError:  # the module also runs by hand without pytest
    pytest = None

if pytest is not None:

    @pytest.fixture(scope="session")
    def vcluster():
        """Three nodes for the whole session, with Slurm where it is installed (else
        ``slurm_reason`` says why not), torn down whatever happens."""
        reason = unavailable_reason()
        if reason:
            pytest.skip(reason)
        sweep_stale()  # what a SIGKILLed session left behind
        cluster = VirtualCluster()
        # SIGTERM (a CI timeout) unwinds like Ctrl-C, so the teardown below runs; atexit covers
        # the rest; only a SIGKILL leaves the namespaces behind
        previous = signal.getsignal(signal.SIGTERM)
        if previous == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _interrupt)
        try:
            cluster.up()
            cluster.slurm_reason = unavailable_reason(slurm=True)
            if not cluster.slurm_reason:
                try:
                    cluster.start_slurm()
                except (RuntimeError, subprocess.SubprocessError, OSError) as error:
                    cluster.slurm_failed = cluster.slurm_reason = f"Slurm did not start: {error}"
            yield cluster
        finally:
            cluster.down()
            if previous == signal.SIG_DFL:
                signal.signal(signal.SIGTERM, previous)

    def _interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    reason = unavailable_reason(slurm=True)
    if reason:
        raise SystemExit(reason)
    cluster = VirtualCluster().up()
    try:
        cluster.start_slurm()
        print(textwrap.dedent(f"""\
            up: {', '.join(cluster.nodes)} on {cluster.subnet}.0/24; shared folder {cluster.shared}
            enter a node: {' '.join(cluster.enter('node1'))} bash"""))
        input("press Enter to tear it down ")
    finally:
        cluster.down()
