"""The one template every batch script comes from: ``#SBATCH`` header plus a walltime-safe body.

The body runs the program under ``srun`` in the background, forwards Slurm's walltime warning
(USR1, sent to the batch shell) to it, and when the engine reports "stopped, resume me" (exit
75) requeues the job, whose next start continues with ``--resume``; not when it reports that no item
of its start finished before the walltime cut them off (76: the requeue would do the same).
"""
from __future__ import annotations

import re
import shlex
from typing import List

from ..errors import EXIT_NO_PROGRESS, EXIT_STOPPED
from .program import resume_takes_target
from .spec import JobSpec

_SLOT = re.compile(r"\{\{(\w+)\}\}")

BODY = r"""
set -uo pipefail

log() { printf '[%s] slurm job %s: %s\n' "$(date '+%F %T')" "${SLURM_JOB_ID:-?}" "$*"; }

# Walltime: Slurm sends USR1 to this shell {{warning}} s before the end (--signal=B:USR1@{{warning}}).
# Forward it to the run, which stops handing out work, finishes running items for up to
# --grace seconds, flushes its journal and exits {{exit_stopped}}; then requeue this job.
# TERM here (scancel --signal=TERM --batch: stop for good) goes to the run as USR1 too: srun
# answers a TERM of its own by SIGKILLing every task; only the decision not to requeue differs.
# The first signal decides: a TERM after the warning is the walltime itself, come while the run
# still saves its journal, and the job is requeued all the same; unless squeue says the time limit
# is still over a minute away: then it is a cancel (scancel), and the job is not requeued. Set
# first: a signal during the set-up below (module load) would otherwise end this shell without a word.
step=""
stop_signal=""
cancelled=""
# Seconds before the job's time limit, as squeue tells them (%L: [D-]H:MM:SS or M:SS); nothing
# where it cannot say (no squeue, no answer within 10 s, no limit).
seconds_left() {
    local left days=0 h=0 m=0 s=0 a b c
    left=$(timeout 10 squeue -h -j "${SLURM_JOB_ID:-}" -o %L 2>/dev/null) || return 0
    if [[ $left == *-* ]]; then days=${left%%-*}; left=${left#*-}; fi
    IFS=: read -r a b c <<< "$left"
    if [ -n "$c" ]; then h=$a; m=$b; s=$c; elif [ -n "$b" ]; then m=$a; s=$b; else return 0; fi
    if [[ "$days$h$m$s" =~ ^[0-9]+$ ]]; then echo $((10#$days * 86400 + 10#$h * 3600 + 10#$m * 60 + 10#$s)); fi
}
forward() {
    if [ "$1" = TERM ] && [ "$stop_signal" = USR1 ] && [ -z "$cancelled" ]; then
        local left
        left=$(seconds_left)
        if [ -n "$left" ] && [ "$left" -gt 60 ]; then cancelled=$left; fi
    fi
    stop_signal=${stop_signal:-$1}
    log "got SIG$1: asking the run to stop and save its journal"
    if [ -n "$step" ]; then kill -s USR1 "$step" 2>/dev/null; fi
}
trap 'forward USR1' USR1
trap 'forward TERM' TERM

# Run by hand (bash THIS_SCRIPT) it has no job to run in: one line, exit 2, rather than a shell error
# about a Slurm variable that is not set.
if [ -z "${SLURM_JOB_ID:-}" ]; then
    printf '%s\n' "$0: not in a Slurm job: submit it with sbatch $0 [arguments]" >&2
    exit 2
fi
cd "${SLURM_SUBMIT_DIR:-.}" || exit 1
# sbatch --export=NONE (a default on some clusters) hands NONE on to srun as SLURM_EXPORT_ENV: the
# tasks would get none of the environment set up here (module load, the virtual environment)
export SLURM_EXPORT_ENV=ALL
{{setup}}# The program and its arguments; arguments given to sbatch after the script replace the defaults:
#   sbatch THIS_SCRIPT {{example_args}}
PROGRAM=({{program}})
APP_ARGS=({{app_args}})
if [ "$#" -gt 0 ]; then APP_ARGS=("$@"); fi

# Engine flags this job needs, added unless the arguments already set them.
add_default() {
    local arg
    for arg in ${APP_ARGS[@]+"${APP_ARGS[@]}"}; do  # bash < 4.4 (set -u) takes an empty array for unset
        if [[ $arg == "$1" || $arg == "$1="* ]]; then return 0; fi
    done
    APP_ARGS+=("$@")
}
{{defaults}}
add_default --resume  # last; on a results folder without a journal it simply starts fresh

restarts=${SLURM_RESTART_COUNT:-0}
log "start $((restarts + 1)) on ${SLURM_JOB_NUM_NODES:-1} node(s) ${SLURM_JOB_NODELIST:-}"
{{plain_resume}}{{checks}}# A stop before anything ran: the time limit (sbatch --time) is shorter than the warning, and a
# requeued job would get the same one; nothing is started or requeued.
if [ -n "$stop_signal" ]; then
    hint=""
    if [ "$stop_signal" = USR1 ]; then hint=" (the walltime warning: is --time shorter than {{warning}} s?)"; fi
    log "SIG$stop_signal came before the run started$hint: not starting it, not requeueing"
    exit {{exit_stopped}}
fi
# The same before the warning has come: Slurm sends it up to a minute late, into a run just started.
left=$(seconds_left)
if [ -n "$left" ] && [ "$left" -le {{warning}} ]; then
    log "only $left s are left before the job's time limit, no more than the walltime warning's {{warning}} s: a run" \
        "started now would be stopped at once, and so would each requeued one; not starting it, not requeueing" \
        "(submit with a longer --time)"
    exit {{exit_stopped}}
fi
LAUNCH=({{launch}})
# A step that ends abnormally (a rank killed: the others finish without it, then MPI_Abort ends the
# step, the one way out with a rank missing; or an MPI that crashes the ranks still talking to it)
# is started again with --resume on the job's nodes that are still up, up to {{step_restarts}} times.
attempt=0
while :; do
    log "${LAUNCH[*]} ${PROGRAM[*]} ${APP_ARGS[*]}"
    "${LAUNCH[@]}" "${PROGRAM[@]}" "${APP_ARGS[@]}" &
    step=$!
    if [ -n "$stop_signal" ]; then kill -s USR1 "$step" 2>/dev/null; fi  # one that came as it started
    # A trapped signal interrupts 'wait'; keep waiting until the step has really ended.
    while kill -0 "$step" 2>/dev/null; do wait "$step"; done
    wait "$step"
    rc=$?
    case $rc in 0|1|2|{{exit_stopped}}|{{exit_no_progress}}) break ;; esac
    # A stop that came as the step went down, or while it is down: what finished is journaled, and
    # the job ends as stopped (requeued for the walltime warning), with no step started again.
    if [ -n "$stop_signal" ]; then
        log "the run's step ended abnormally (exit $rc) after SIG$stop_signal: not starting it again"
        rc={{exit_stopped}}
        break
    fi
    if [ "$attempt" -ge {{step_restarts}} ]; then break; fi
    attempt=$((attempt + 1))
    sleep 5
    if [ -n "$stop_signal" ]; then
        log "the run's step ended abnormally (exit $rc), then SIG$stop_signal came: not starting it again"
        rc={{exit_stopped}}
        break
    fi
{{plain_resume_again}}    log "the run's step ended abnormally (exit $rc): starting it again with --resume ($attempt of {{step_restarts}})"
    LAUNCH=({{relaunch}})
done
# A step started again in this job had less than the job's time: that it finished nothing says
# nothing of a whole start, which the requeue gives it.
if [ "$rc" -eq {{exit_no_progress}} ] && [ "$attempt" -gt 0 ]; then rc={{exit_stopped}}; fi

if [ "$rc" -eq {{exit_stopped}} ] || [ "$rc" -eq {{exit_no_progress}} ]; then
    if [ "$stop_signal" = TERM ]; then
        log "stopped by SIGTERM (scancel, or scontrol requeue): not requeueing from here; submit again to" \
            "continue with --resume"
    elif [ -n "$cancelled" ]; then
        log "stopped by the walltime warning, then SIGTERM came $cancelled s before the time limit (scancel):" \
            "not requeueing; submit again to continue with --resume"
    elif [ "$rc" -eq {{exit_no_progress}} ]; then  # the same --time would cut them off again, every time
        log "stopped by the walltime warning before any item of this start finished (those running were cut" \
            "off): a requeue with the same --time would cut them off again; not requeueing: submit again with" \
            "a longer --time to continue with --resume"
    elif [ "$restarts" -ge {{max_requeues}} ]; then
        log "stopped, but this job was already requeued $restarts times: submit again to continue"
    elif [ -z "$stop_signal" ]; then
        # a signal to the job's steps only (sbatch --signal without B:, scancel --signal without --batch)
        # is not seen here, nor told from a run that stopped of itself (a full disk): requeued alike
        log "stopped (exit $rc) with no signal to this script: requeueing; the next start continues with --resume" \
            "(where the run's lines above say it stopped of itself, such as on a full disk, fix that or scancel" \
            "$SLURM_JOB_ID)"
        scontrol requeue "$SLURM_JOB_ID" || log "scontrol requeue failed: submit again to continue"
    else
        log "stopped for the walltime: requeueing; the next start continues with --resume"
        scontrol requeue "$SLURM_JOB_ID" || log "scontrol requeue failed: submit again to continue"
    fi
elif [ "$rc" -eq 0 ]; then
    log "finished"
else
    log "the run exited with code $rc"
fi
exit "$rc"
"""


#: a program whose --resume takes a target (the pipelines' RUN_ID/STEP_ID): that is for the first
#: start only. A requeued start, or a step started again, goes on from where the last one stopped,
#: with a plain --resume as the run's own finish command says, instead of running that step again
#: each time (a step longer than one start would never finish).
PLAIN_RESUME = r"""# --resume RUN_ID/STEP_ID runs that pipeline again from that step: for the job's first start only;
# a requeued start goes on from where the last one stopped (a plain --resume), not from that step again.
plain_resume() {
    local args=() i=0 n=${#APP_ARGS[@]} dropped=""
    while [ "$i" -lt "$n" ]; do
        case ${APP_ARGS[i]} in
            --resume=*) args+=(--resume); dropped=${APP_ARGS[i]#--resume=} ;;
            --resume)
                args+=(--resume)
                if [ $((i + 1)) -lt "$n" ] && [[ ${APP_ARGS[i + 1]} != -* ]]; then i=$((i + 1)); dropped=${APP_ARGS[i]}; fi ;;
            *) args+=("${APP_ARGS[i]}") ;;
        esac
        i=$((i + 1))
    done
    APP_ARGS=("${args[@]}")
    if [ -n "$dropped" ]; then log "--resume $dropped was for the first start: this one goes on with a plain --resume"; fi
}
if [ "$restarts" -gt 0 ]; then plain_resume; fi
"""


def _example_args(app_args: List[str]) -> List[str]:
    """The script's own arguments with another results folder: its --results (if any) replaced, not
    given twice."""
    kept, words = [], iter(app_args)
    for word in words:
        if word == "--results":
            next(words, None)
        elif not word.startswith("--results="):
            kept.append(word)
    return kept + ["--results", "/scratch/me/run1"]


def _words(words: List[str]) -> str:
    return " ".join(shlex.quote(word) for word in words)


def _in_double_quotes(text: str) -> str:
    """``text`` as it may stand inside a shell's double quotes: what they still expand, escaped."""
    return re.sub(r'([$`"\\])', r"\\\1", text)


def header(spec: JobSpec) -> List[str]:
    """The ``#SBATCH`` lines."""
    options = [f"--job-name={spec.name}", f"--nodes={spec.nodes}",
               f"--ntasks-per-node={spec.ntasks_per_node}"]
    if not spec.cpu:
        options.append(f"--gpus-per-node={spec.gpus}")
    options.append(f"--cpus-per-task={spec.default_cpus_per_task}")
    options.append(f"--time={spec.time}")
    if spec.partition:
        options.append(f"--partition={spec.partition}")
    if spec.account:
        options.append(f"--account={spec.account}")
    # No --no-kill for the job: a node that Slurm declares DOWN (SlurmdTimeout) ends the job and
    # --requeue starts it again, which resumes. With --no-kill, a dead batch host would leave the job
    # RUNNING without its script until the walltime (measured). The run itself gives a silent
    # node's items to the others after --heartbeat-timeout, usually long before Slurm notices.
    options += ["--output=%x-%j.out", "--open-mode=append",
                f"--signal=B:USR1@{spec.warning}", "--requeue"]
    return [f"#SBATCH {option}" for option in options]


def _setup(spec: JobSpec) -> str:
    # a module that does not load (misspelt, or no module command on the node) ends the job: the run
    # would otherwise go on without it (the wrong Python, no apptainer, no CUDA)
    lines = [f"module load {shlex.quote(module)} || {{ log {shlex.quote(f'module load {module} failed: the run was not started')}; "
             f"exit 2; }}" for module in spec.modules]
    if spec.venv and not spec.container:
        venv = shlex.quote(spec.venv)
        lines.append(f'if [ -f {venv}/bin/activate ]; then source {venv}/bin/activate; '
                     f'else log "no virtual environment at {venv} in $PWD (submitted from another folder?): '
                     f'using $(command -v python || echo \'no python on PATH\')"; fi')
    return "".join(line + "\n" for line in lines)


def _defaults(spec: JobSpec) -> str:
    if spec.cpu:
        lines = ["add_default --gpu cpu", 'add_default --workers "${SLURM_CPUS_PER_TASK:-1}"']
    else:
        lines = ["add_default --gpu all"]
    lines.append(f"add_default --grace {spec.default_grace}")
    return "\n".join(lines)


#: times a step that died is started again inside the same job
STEP_RESTARTS = 3


def _srun_options(spec: JobSpec, relaunch: bool = False) -> str:
    # a step started again runs on the nodes still up: at least one, at most the job's
    nodes = '--nodes="1-$SLURM_JOB_NUM_NODES"' if relaunch else '--nodes="$SLURM_JOB_NUM_NODES"'
    options = [f"--mpi={spec.mpi}", nodes,
               f"--ntasks-per-node={spec.ntasks_per_node}", '--cpus-per-task="${SLURM_CPUS_PER_TASK:-1}"']
    if not spec.cpu:  # as many as the job got: an sbatch --gpus-per-node on the command line wins
        options.append(f'--gpus-per-node="${{SLURM_GPUS_PER_NODE:-{spec.gpus}}}"')
    # Ranks stop at slightly different times after a signal; never let Slurm kill rank 0 mid-flush.
    # A rank that dies, or a node that fails, leaves the step running: the run carries on without it.
    options += ["--kill-on-bad-exit=0", "--no-kill"]
    return " ".join(options)


def _checks(spec: JobSpec) -> str:
    """Shell lines that end the job with exit 2 before anything starts where what the step needs
    is missing on the node: the program's python, or apptainer, the image (a local one: not a
    docker:// or other URI), a --bind source. Each would fail the step on every rank, and the step would be started again in
    vain (without apptainer on PATH, srun even tries the checkout's apptainer/ folder: "Permission
    denied")."""
    if not spec.container:  # srun fails a program it cannot find on every rank (exit 2): say why, once
        lines = ["# python, on this node (no virtual environment, and none active when the job was submitted)",
                 'if ! command -v "${PROGRAM[0]}" > /dev/null; then',
                 '    log "${PROGRAM[0]}: not on PATH on $(hostname) (give the generator --venv, or --module): the run '
                 'was not started"',
                 "    exit 2",
                 "fi"]
        return "".join(line + "\n" for line in lines)
    image = shlex.quote(spec.container)
    lines = ["# apptainer and the image, on this node (the step would fail on every rank without them)",
             "if ! command -v apptainer > /dev/null; then",
             '    log "apptainer: not on PATH on $(hostname) (load its module: --module): the run was not started"',
             "    exit 2",
             "fi"]
    if "://" not in spec.container:
        where = "" if spec.container.startswith("/") else " in $PWD"  # a relative path: from the submit folder
        lines += [f"if [ ! -e {image} ]; then",
                  f'    log "the image \\"{_in_double_quotes(spec.container)}\\": no such file or folder{where} on '
                  f'$(hostname): the run was not started"',
                  "    exit 2",
                  "fi"]
    if spec.bind_sources:
        lines += ["# every --bind source, on this node (apptainer refuses a missing one on every rank)",
                  f"for source in {_words(spec.bind_sources)}; do",
                  '    if [ ! -e "$source" ]; then',
                  '        log "--bind $source: no such file or folder on $(hostname): the run was not started"',
                  "        exit 2",
                  "    fi",
                  "done"]
    return "".join(line + "\n" for line in lines)


def _launch(spec: JobSpec, relaunch: bool = False) -> str:
    """srun, and the container wrapper (hybrid model: srun outside, the program and its MPI inside)."""
    launch = "srun " + _srun_options(spec, relaunch)
    if not spec.container:
        return launch
    words = ["apptainer", "exec"] + ([] if spec.cpu else ["--nv"])
    for bind in spec.binds:
        words += ["--bind", bind]
    return launch + " " + _words(words + [spec.container])


def render(spec: JobSpec) -> str:
    """The complete batch script for ``spec`` (checked first)."""
    spec.check()
    takes_target = resume_takes_target(spec.command[0])
    intro = [
        "#!/bin/bash",
        *header(spec),
        "#",
        "# Generated by:",
        f"#   {spec.command_line()}",
        "# Do not edit: change the command above and run it again.",
    ]
    slots = {
        "app_args": _words(spec.app_args),
        "example_args": _words(_example_args(spec.app_args)),
        "setup": _setup(spec),
        "program": _words(spec.python),
        "defaults": _defaults(spec),
        "warning": str(spec.warning),
        "exit_stopped": str(EXIT_STOPPED),
        "exit_no_progress": str(EXIT_NO_PROGRESS),
        "max_requeues": str(spec.max_requeues),
        "checks": _checks(spec),
        "launch": _launch(spec),
        "relaunch": _launch(spec, relaunch=True),
        "step_restarts": str(STEP_RESTARTS),
        "plain_resume": PLAIN_RESUME if takes_target else "",
        "plain_resume_again": "    plain_resume\n" if takes_target else "",
    }
    # one pass: a value (the user's arguments may hold "{{warning}}") is never searched for slots again
    body = _SLOT.sub(lambda match: slots[match.group(1)], BODY)
    return "\n".join(intro) + "\n" + body
