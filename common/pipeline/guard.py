"""``python -I -S guard.py WORKER_PID PROGRAM [ARG...]``: a step's program, which dies with its worker.

A step runs in its own session (so a closed terminal's SIGHUP or a Ctrl-C meant for the run does
not reach it directly), and Linux's parent-death signal reaches only the worker's own child:
``/bin/sh -c 'sleep 600'`` forks ``sleep``, which would outlive a worker killed with SIGKILL. So
the worker's child is this guard: it starts the program in the step's session and waits for it;
when the worker dies, the guard is told (PR_SET_PDEATHSIG) and SIGKILLs every process of the
step's session (each of its process groups), itself included. Otherwise it passes the program's exit status on as its own.

Stop signals sent to the step's group (a timeout's SIGTERM) reach the program directly; the guard
ignores them and waits, so the program keeps its grace before SIGKILL. It runs without ``site``
and imports nothing of the package, so it starts in a few milliseconds.
"""
import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
#: what Linux sends the guard when its worker dies (caught, unlike SIGKILL, so it can act)
WORKER_GONE_SIGNAL = signal.SIGHUP
#: the exit status of a program that could not be started (as a shell says it)
CANNOT_START = 127


def _kill_session() -> None:
    """SIGKILL every process of this session (the step's: it may hold several process groups),
    then this process group, the guard included."""
    session = os.getsid(0)
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()  # after "pid (command)"
            if int(fields[3]) == session:
                os.kill(int(name), signal.SIGKILL)
        except (OSError, IndexError, ValueError):  # gone meanwhile, or not ours
            continue
    os.killpg(0, signal.SIGKILL)


def _set_death_signal(libc, signum: int) -> None:
    if libc is not None:
        libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0)


def main(argv: list) -> int:
    worker, program = int(argv[0]), argv[1:]
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:  # not glibc: the step still runs, without this protection
        libc = None

    def worker_gone(signum: int, frame: object) -> None:
        if os.getppid() != worker:  # not a group signal sent by the step itself: the worker is gone
            _kill_session()

    signal.signal(WORKER_GONE_SIGNAL, worker_gone)
    _set_death_signal(libc, WORKER_GONE_SIGNAL)
    if os.getppid() != worker:  # it died before the signal was set up
        _kill_session()
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, signal.SIG_IGN)
    child = os.fork()
    if child == 0:
        try:
            # as subprocess does: Python ignores SIGPIPE and SIGXFSZ, a program expects their default
            for number in (signal.SIGTERM, signal.SIGINT, WORKER_GONE_SIGNAL, signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(number, signal.SIG_DFL)
            _set_death_signal(libc, signal.SIGKILL)  # should the guard itself be killed
            os.execvp(program[0], program)
        except OSError as error:
            os.write(2, f"cannot start {program[0]}: {error}\n".encode(errors="replace"))
        os._exit(CANNOT_START)
    _, status = os.waitpid(child, 0)
    if os.WIFSIGNALED(status):  # die of the same signal, so the worker reports it as the program's
        number = os.WTERMSIG(status)
        if number != signal.SIGKILL:
            signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
        return 128 + number  # a signal whose default is not to end (never one that ended the program)
    return os.WEXITSTATUS(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
