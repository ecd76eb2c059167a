"""The shell scripts the wrapper runs as one short task per node (slurm/steps.py, nodeprocs.py), and pure readers
of what they print: text in, values out, unit-tested without a cluster.

Every script is given to `sh -c` as a constant, its inputs as positional arguments or environment variables
(never spliced into its text), and ends each node's answer with a line naming the node: a node whose line is
missing did not finish (its answer is unknown, not empty).
"""

from __future__ import annotations

from dataclasses import dataclass

# Kills every process of this user on the node whose environment carries the marker, except itself, and
# says so; the probe is started without the marker. One grep over all environ files keeps it ~0.1 s. Oldest pid
# first (a parent before the children it started): a parent that reacts to its child's death (a shell loop that
# ends, an elastic agent that restarts its workers) is gone before it can. (In the glob's order a loop's `sleep`
# died first in a pid namespace, where /proc/119 sorts before /proc/85, and its shell then ended by itself,
# unreported.) Not SIGSTOP then SIGKILL: a reap cut short between the two would leave processes stopped for good.
REAP_SCRIPT = r"""
m=$1
for f in $(grep -l -z -s -x -F -e "$m" /proc/[0-9]*/environ | sort -t/ -k3,3n); do
  p=${f#/proc/}; p=${p%/environ}
  [ "$p" = "$$" ] && continue
  c=$(tr '\0' ' ' < /proc/$p/cmdline 2>/dev/null | cut -c1-160)
  kill -9 "$p" 2>/dev/null && echo "hpr-stale ${SLURMD_NODENAME:-?} $p $c"
done
echo "hpr-reaped ${SLURMD_NODENAME:-?}"
"""


@dataclass(frozen=True)
class StaleTask:
    node: str
    pid: int
    command: str


def parse_stale_lines(stdout: str, nodes: list[str]) -> tuple[list[StaleTask], list[str]]:
    """What a reap task killed, and the nodes among `nodes` that did not report back."""
    killed: list[StaleTask] = []
    reported: set[str] = set()
    for line in stdout.splitlines():
        parts = line.split(" ", 3)
        if parts[0] == "hpr-reaped" and len(parts) > 1:
            reported.add(parts[1])
        elif parts[0] == "hpr-stale" and len(parts) >= 3 and parts[2].isdigit():
            killed.append(StaleTask(parts[1], int(parts[2]), parts[3] if len(parts) > 3 else ""))
    return killed, [n for n in nodes if n not in reported]


# Prints the job's numbered steps that a slurmstepd still holds on this node, other than the probe's own. Nodes
# that share a kernel (a test cluster) see each other's: there the answer covers them all.
STEPD_SCRIPT = r"""
j=$1
for f in /proc/[0-9]*/cmdline; do
  c=$(tr '\0' ' ' < "$f" 2>/dev/null)
  case "$c" in
    "slurmstepd: [$j."[0-9]*"]"*)
      s=${c#*"[$j."}; s=${s%%]*}
      [ "$s" != "${SLURM_STEP_ID:-}" ] && echo "hpr-stepd ${SLURMD_NODENAME:-?} $s";;
  esac
done
echo "hpr-stepd-checked ${SLURMD_NODENAME:-?}"
"""


def parse_stepd_lines(text: str) -> tuple[set[str], set[str]]:
    """The nodes where an earlier step's slurmstepd still runs, and the nodes that finished the check."""
    busy: set[str] = set()
    reported: set[str] = set()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "hpr-stepd-checked":
            reported.add(parts[1])
        elif len(parts) >= 3 and parts[0] == "hpr-stepd":
            busy.add(parts[1])
    return busy, reported


# The wrapper's notice to the ranks (hpresilience.torch's check_alive() watches $HPR_NOTICE_FILE): written in
# a directory private to the user (0700, created here; its random name is known only through the step's
# environment), never over an existing file or link (noclobber is O_EXCL). `clear` removes the directory.
NOTICE_SCRIPT = r"""
f=$HPR_NOTICE_FILE; d=${f%/*}
case "$f" in /*/*) ;; *) exit 2;; esac
if [ "$1" = clear ]; then
  [ -d "$d" ] && [ ! -L "$d" ] && [ -O "$d" ] && rm -rf -- "$d"
  echo "hpr-notice ${SLURMD_NODENAME:-?}"; exit 0
fi
umask 077
[ -e "$d" ] || mkdir -m 700 -- "$d" 2>/dev/null
[ -d "$d" ] && [ ! -L "$d" ] && [ -O "$d" ] || exit 3
# Nodes that share a kernel (a test cluster) race for the same file: the loser finds it written.
(set -C; printf '%s\n' "$HPR_NOTICE_REASON" > "$f") 2>/dev/null ||
  { [ -f "$f" ] && [ ! -L "$f" ] && [ -O "$f" ]; } || exit 4
echo "hpr-notice ${SLURMD_NODENAME:-?}"
"""


def parse_notice_lines(text: str) -> set[str]:
    """The nodes that confirmed the notice task."""
    return {parts[1] for line in text.splitlines() if len(parts := line.split()) >= 2 and parts[0] == "hpr-notice"}


# Evidence of a hang on one node: asks every listed pid for its stacks (the signal its heartbeat announced,
# only if the pid carries the job's marker), then prints one line per process of the job on this node (the
# marker in its environment): pid, state, RANK, wchan, command. Read-only but for that signal; the probe
# itself is started without the marker.
PROBE_SCRIPT = r"""
m=$1; shift
for ps in "$@"; do
  grep -q -z -x -F -e "$m" "/proc/${ps%%:*}/environ" 2>/dev/null && kill -"${ps#*:}" "${ps%%:*}" 2>/dev/null
done
[ $# -gt 0 ] && sleep 1
for f in $(grep -l -z -s -x -F -e "$m" /proc/[0-9]*/environ); do
  p=${f#/proc/}; p=${p%/environ}
  [ "$p" = "$$" ] && continue
  e=$(tr '\0' '\n' < /proc/$p/environ 2>/dev/null)
  n=$(printf '%s\n' "$e" | sed -n 's/^SLURMD_NODENAME=//p' | head -n1)
  # Only this node's tasks (nodes that share a kernel, as on a test cluster, see each other's).
  [ -n "$n" ] && [ "$n" != "${SLURMD_NODENAME:-}" ] && continue
  s=$(sed -e 's/^.*) //' /proc/$p/stat 2>/dev/null | cut -d' ' -f1)
  r=$(printf '%s\n' "$e" | sed -n 's/^RANK=//p' | head -n1)
  w=$(cat /proc/$p/wchan 2>/dev/null)
  c=$(tr '\0' ' ' < /proc/$p/cmdline 2>/dev/null | cut -c1-120)
  echo "hpr-proc ${SLURMD_NODENAME:-?} $p ${s:-?} ${r:--} ${w:-0} $c"
done
echo "hpr-probed ${SLURMD_NODENAME:-?}"
"""


@dataclass(frozen=True)
class ProcState:
    node: str
    pid: int
    state: str  # /proc/<pid>/stat's state letter: R, S, D, T, t, Z, ...
    rank: int | None
    wchan: str
    command: str


def parse_probe_lines(text: str) -> tuple[list[ProcState], set[str]]:
    """The processes a probe reported, and the nodes that finished it."""
    procs: list[ProcState] = []
    done: set[str] = set()
    for line in text.splitlines():
        parts = line.split(" ", 6)
        if parts[0] == "hpr-probed" and len(parts) > 1:
            done.add(parts[1])
        elif parts[0] == "hpr-proc" and len(parts) >= 6 and parts[2].isdigit():
            rank = int(parts[4]) if parts[4].isdigit() and len(parts[4]) < 9 else None
            procs.append(
                ProcState(
                    parts[1], int(parts[2]), parts[3][:1], rank, parts[5][:64], parts[6][:120] if len(parts) > 6 else ""
                )
            )
    return procs, done


# The processes of one attempt that a step left behind, or that are still its tasks. Per node, for each process
# with the job's marker in its environment: its nearest slurmstepd ancestor, whose title names the step
# ("slurmstepd: [12.0]", "[12.batch]"). `count`: how many of attempt $a's processes hang off a numbered step
# (the tasks; the wrapper's own srun, under the batch step, is not one). `reap`: kill every marked process with no
# slurmstepd above it: it escaped its step (setsid, then its parent exited) and, under proctrack/pgid, outlives
# the tasks and holds srun's output open. The task itself is started without the marker.
LIVE_SCRIPT = r"""
m=$1; a=$2; mode=$3; live=0
for f in $(grep -l -z -s -x -F -e "$m" /proc/[0-9]*/environ); do
  p=${f#/proc/}; p=${p%/environ}
  [ "$p" = "$$" ] && continue
  n=$(tr '\0' '\n' < "$f" 2>/dev/null | sed -n 's/^SLURMD_NODENAME=//p' | head -n1)
  [ -n "$n" ] && [ "$n" != "${SLURMD_NODENAME:-}" ] && continue
  q=$p; i=0; under=
  while [ -n "$q" ] && [ "$q" -gt 1 ] && [ $i -lt 64 ]; do
    if [ "$(cat /proc/$q/comm 2>/dev/null)" = slurmstepd ]; then
      under=$(tr '\0' ' ' < /proc/$q/cmdline 2>/dev/null | sed -n 's/.*\[[0-9]*\.\([0-9a-z]*\)\].*/\1/p'); break
    fi
    q=$(sed -n 's/^PPid:[[:space:]]*//p' /proc/$q/status 2>/dev/null); i=$((i + 1))
  done
  if [ "$mode" = reap ]; then
    [ $i -lt 64 ] && [ -z "$q" -o "${q:-0}" -le 1 ] || continue
    c=$(tr '\0' ' ' < /proc/$p/cmdline 2>/dev/null | cut -c1-160)
    kill -9 "$p" 2>/dev/null && echo "hpr-stale ${SLURMD_NODENAME:-?} $p $c"
  else
    case "$under" in ''|*[!0-9]*) continue ;; esac
    grep -q -z -x -F -e "AUTORESUME_ATTEMPT=$a" "$f" 2>/dev/null && live=$((live + 1))
  fi
done
[ "$mode" = reap ] && echo "hpr-reaped ${SLURMD_NODENAME:-?}" || echo "hpr-live ${SLURMD_NODENAME:-?} $live"
"""


def parse_live_lines(text: str) -> dict[str, int]:
    """Per node that reported: how many task processes of the step it runs."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split(" ")
        if len(parts) == 3 and parts[0] == "hpr-live" and parts[2].isdigit() and len(parts[2]) < 9:
            out[parts[1]] = int(parts[2])
    return out
