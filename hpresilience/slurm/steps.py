"""Operations on a job's steps: list them, signal them, and run short tasks on its nodes (srun --overlap)."""

from __future__ import annotations

from dataclasses import dataclass

from hpresilience.errors import SlurmError, SlurmTimeout
from hpresilience.log import get_logger
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.parse import parse_step_lines
from hpresilience.slurm.runner import Result

log = get_logger("hpresilience.slurm")


@dataclass(frozen=True)
class StepInfo:
    step_id: str  # "12.3"
    name: str
    nodes: tuple[str, ...]


def overlap_srun(job_id: int, nodes: list[str], name: str) -> list[str]:
    """`srun` running one task on each of `nodes` inside the job's allocation, beside its running step
    (--overlap): how the wrapper reaches every node of a step (reap, counts, notices, probes). A task that
    fails does not end the others (--kill-on-bad-exit=0)."""
    return [
        "srun",
        f"--jobid={job_id}",
        f"--nodes={len(nodes)}",
        f"--ntasks={len(nodes)}",
        f"--nodelist={','.join(nodes)}",
        "--ntasks-per-node=1",
        "--overlap",
        "--export=ALL",
        f"--job-name={name}",
        "--kill-on-bad-exit=0",
    ]


def job_steps(client: SlurmClient, job_id: int) -> list[StepInfo]:
    """The job's live steps (`squeue -s`; unlike `squeue --json`, the text form honours -j)."""
    res = client.runner.run("squeue", "-s", "-j", str(job_id), "-h", "-o", "%i|%j|%N", check=False)
    if res.returncode != 0:
        # A job that has ended answers "Invalid job id": it has no steps left.
        if "Invalid job id" in res.stderr:
            return []
        raise SlurmError(list(res.argv), res.returncode, res.stderr)
    return [StepInfo(step_id, name, nodes) for step_id, name, nodes in parse_step_lines(res.stdout)]


def named_steps(client: SlurmClient, job_id: int, name: str) -> list[StepInfo]:
    return [s for s in job_steps(client, job_id) if s.name == name]


def signal_step(client: SlurmClient, step_id: str, signal: str | None = None, timeout: float = 5.0) -> None:
    """`scancel [--signal=SIG] J.S`: with a signal, only the tasks get it; without, the step is cancelled.
    Bounded: scancel waits for every node of the step to answer, and a dead node never does."""
    args = ([f"--signal={signal}"] if signal else []) + [step_id]
    try:
        res = client.runner.run("scancel", *args, retry=False, check=False, timeout=timeout)
    except SlurmTimeout:
        log.warning("step_signal_timed_out", step=step_id, signal=signal, timeout_s=timeout)
        return
    if res.returncode != 0:
        # e.g. "Access/permission denied", or the step is already gone: nothing was signalled.
        log.warning(
            "step_signal_refused",
            step=step_id,
            signal=signal,
            exit_code=res.returncode,
            stderr=res.stderr.strip()[:300],
        )
        return
    log.info("step_signalled" if signal else "step_cancelled", step=step_id, signal=signal)


# Kills every process of this user on the node whose environment carries the marker, except itself, and
# says so; the probe is started without the marker. One grep over all environ files keeps it ~0.1 s.
REAP_SCRIPT = r"""
m=$1
for f in $(grep -l -z -s -x -F -e "$m" /proc/[0-9]*/environ); do
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


def reap_marked_processes(
    client: SlurmClient, job_id: int, nodes: list[str], marker: str, env: dict[str, str], timeout: float = 10.0
) -> tuple[list[StaleTask], list[str]]:
    """Run one short task per node (sharing the job's resources, --overlap) that kills what is left of
    earlier steps: processes carrying `marker` (NAME=VALUE) in their environment. Returns what it killed
    and the nodes that did not report back (their processes could not be checked)."""
    if not nodes:
        return [], []
    args = [
        *overlap_srun(job_id, nodes, "hpr-reap"),
        "sh",
        "-c",
        REAP_SCRIPT,
        "hpr-reap",
        marker,
    ]
    try:
        res = client.runner.run(*args, timeout=timeout, check=False, retry=False, env=env)
    except SlurmTimeout:
        return [], list(nodes)
    return _stale_lines(res.stdout, nodes)


def _stale_lines(stdout: str, nodes: list[str]) -> tuple[list[StaleTask], list[str]]:
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


def lingering_steps(
    client: SlurmClient, job_id: int, nodes: list[str], env: dict[str, str], timeout: float = 5.0
) -> tuple[set[str], list[str]]:
    """The nodes where a slurmstepd of an earlier step of the job still runs, and the nodes that did not report
    back. A node that left the job and came back is still ending the job there until its old steps are gone,
    and meanwhile slurmd kills every new step of the job it is sent."""
    if not nodes:
        return set(), []
    args = [
        *overlap_srun(job_id, nodes, "hpr-stepd"),
        "sh",
        "-c",
        STEPD_SCRIPT,
        "hpr-stepd",
        str(job_id),
    ]
    try:
        res = client.runner.run(*args, timeout=timeout, check=False, retry=False, env=env)
    except SlurmTimeout:
        return set(), list(nodes)
    busy: set[str] = set()
    reported: set[str] = set()
    for line in res.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "hpr-stepd-checked":
            reported.add(parts[1])
        elif len(parts) >= 3 and parts[0] == "hpr-stepd":
            busy.add(parts[1])
    return busy, [n for n in nodes if n not in reported]


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


def write_notice(
    client: SlurmClient,
    job_id: int,
    nodes: list[str],
    path: str,
    reason: str,
    env: dict[str, str],
    timeout: float = 10.0,
    clear: bool = False,
) -> list[str]:
    """Write (or, with clear, remove) the notice file at `path` on every node, in one step of one task per node;
    returns the nodes that did not confirm."""
    if not nodes:
        return []
    run_env = {**env, "HPR_NOTICE_FILE": path, "HPR_NOTICE_REASON": reason[:500]}
    args = [
        *overlap_srun(job_id, nodes, "hpr-notice"),
        "sh",
        "-c",
        NOTICE_SCRIPT,
        "hpr-notice",
        "clear" if clear else "write",
    ]
    try:
        res = client.runner.run(*args, timeout=timeout, check=False, retry=False, env=run_env)
    except SlurmTimeout:
        return list(nodes)
    done = {
        parts[1] for line in res.stdout.splitlines() if len(parts := line.split()) >= 2 and parts[0] == "hpr-notice"
    }
    return [n for n in nodes if n not in done]


def nodes_answering(
    client: SlurmClient, job_id: int, nodes: list[str], env: dict[str, str], timeout: float = 3.0
) -> dict[str, bool]:
    """Whether each node runs a trivial task within `timeout` (one srun per node, all at once). A node
    whose slurmd is gone (kernel panic, power loss) does not, long before Slurm's SlurmdTimeout."""
    from concurrent.futures import ThreadPoolExecutor

    def alive(node: str) -> bool:
        try:
            res = client.runner.run(
                *overlap_srun(job_id, [node], "hpr-alive"),
                "echo",
                "hpr-alive",
                timeout=timeout,
                check=False,
                retry=False,
                env=env,
            )
        except SlurmTimeout:
            return False
        return res.returncode == 0 and "hpr-alive" in res.stdout

    if not nodes:
        return {}
    with ThreadPoolExecutor(max_workers=min(32, len(nodes)), thread_name_prefix="hpr-alive") as pool:
        return dict(zip(nodes, pool.map(alive, nodes), strict=True))


def run_on_nodes(
    client: SlurmClient, job_id: int, nodes: list[str], command: str, name: str, timeout: float, env: dict[str, str]
) -> Result:
    """Run `command` once per node of the job (one task each), waiting for all; its output is captured. No --nodes:
    newer Slurm refuses it beside --distribution=arbitrary, and the node list gives the count."""
    return client.runner.run(
        "srun",
        f"--jobid={job_id}",
        f"--ntasks={len(nodes)}",
        f"--nodelist={','.join(nodes)}",
        "--distribution=arbitrary",
        "--export=ALL",
        f"--job-name={name}",
        command,
        timeout=timeout,
        check=False,
        retry=False,
        env=env,
    )


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


def probe_marked_processes(
    client: SlurmClient,
    job_id: int,
    nodes: list[str],
    marker: str,
    signals: dict[str, list[tuple[int, int]]],
    env: dict[str, str],
    timeout: float,
) -> dict[str, str | None]:
    """Run the probe on every node at once (one --overlap task each), each bounded by `timeout`: the raw
    report per node, None for a node that did not answer in time. `signals[node]`: (pid, signal) to send."""
    from concurrent.futures import ThreadPoolExecutor

    def probe(node: str) -> str | None:
        pairs = [f"{pid}:{sig}" for pid, sig in signals.get(node, [])]
        try:
            res = client.runner.run(
                *overlap_srun(job_id, [node], "hpr-hang-probe"),
                "sh",
                "-c",
                PROBE_SCRIPT,
                "hpr-probe",
                marker,
                *pairs,
                timeout=timeout,
                check=False,
                retry=False,
                env=env,
            )
        except SlurmTimeout:
            return None
        return res.stdout if f"hpr-probed {node}" in res.stdout else None

    if not nodes:
        return {}
    with ThreadPoolExecutor(max_workers=min(32, len(nodes)), thread_name_prefix="hpr-probe") as pool:
        return dict(zip(nodes, pool.map(probe, nodes), strict=True))


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


def _live_script(
    client: SlurmClient,
    job_id: int,
    nodes: list[str],
    marker: str,
    attempt: int,
    mode: str,
    env: dict[str, str],
    timeout: float,
) -> Result | None:
    args = [
        *overlap_srun(job_id, nodes, f"hpr-{mode}"),
        "sh",
        "-c",
        LIVE_SCRIPT,
        "hpr-live",
        marker,
        str(attempt),
        mode,
    ]
    try:
        return client.runner.run(*args, timeout=timeout, check=False, retry=False, env=env)
    except SlurmTimeout:
        return None


def step_task_counts(
    client: SlurmClient, job_id: int, nodes: list[str], marker: str, attempt: int, env: dict[str, str], timeout: float
) -> dict[str, int] | None:
    """How many task processes of attempt `attempt` each node still runs: one short task per node in a single
    srun (--overlap; one step for the whole job, whatever its size). None when a node did not report in time
    (its tasks could not be counted)."""
    if not nodes:
        return {}
    res = _live_script(client, job_id, nodes, marker, attempt, "count", env, timeout)
    counts = parse_live_lines(res.stdout) if res is not None else {}
    return counts if all(n in counts for n in nodes) else None


def reap_escaped_processes(
    client: SlurmClient, job_id: int, nodes: list[str], marker: str, env: dict[str, str], timeout: float
) -> tuple[list[StaleTask], list[str]]:
    """Kill the marked processes on `nodes` that escaped their step (no slurmstepd above them), while the step's
    srun (under the batch step) lives on: what it killed, and the nodes that did not report back."""
    if not nodes:
        return [], []
    res = _live_script(client, job_id, nodes, marker, 0, "reap", env, timeout)
    return _stale_lines(res.stdout, nodes) if res is not None else ([], list(nodes))
