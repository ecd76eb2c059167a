"""Evidence of a hang, collected from every node of the step within a bound, and kept for a person.

Per job, `<state_dir>/<job>.evidence/attempt-<N>/` (0700, ours): the ranks' faulthandler stacks (each rank
writes `stacks-rank<R>-<pid>.txt` there when asked, see hpresilience.torch.heartbeat), the probe's report
of each node (`procs-<node>.txt`: every process of the job with its state and RANK), and `hang.json`, the
attribution. The directory is on the shared file system beside the state file, so it outlives the job.
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

from hpresilience.autoresume.progress import ProgressStream
from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.watch.base import StepView
from hpresilience.autoresume.watch.flightrec import REQUEST, read_dumps, wavefront
from hpresilience.autoresume.watch.hang import Attribution, HangDue, attribute
from hpresilience.errors import HPResilienceError
from hpresilience.fileio import atomic_write
from hpresilience.log import get_logger
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.nodeprocs import probe_marked_processes, step_task_counts
from hpresilience.slurm.nodescripts import ProcState, parse_probe_lines

log = get_logger("hpresilience.autoresume")
# hpresilience.torch.heartbeat looks for the flight-recorder request every 0.25 s: the dumps are read after this.
FR_WAIT_S = 1.0


def private_dir(path: Path) -> Path | None:
    """`path` as a directory of ours that only we can enter (made if missing); None if it cannot be trusted."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            return None
        if st.st_mode & 0o077:
            os.chmod(path, 0o700)
        return path
    except OSError as err:
        log.warning("evidence_dir_unusable", path=str(path), error=str(err))
        return None


class HangInvestigator:
    def __init__(
        self,
        client: SlurmClient,
        job_id: int,
        root: Path,
        progress: ProgressStream,
        reporter: Reporter,
        env: dict[str, str],
        marker: str,
        timeout_s: float,
    ) -> None:
        self.client = client
        self.job_id = job_id
        self.root = root
        self.progress = progress
        self.reporter = reporter
        self.env = env
        self.marker = marker
        self.timeout_s = timeout_s

    def attempt_dir(self, attempt: int) -> str:
        d = private_dir(self.root / f"attempt-{attempt}")
        return str(d) if d is not None else ""

    def tasks_alive(self, launch: StepView) -> bool | None:
        """Whether the step still runs a task on some node (False: every node answered and none does; None:
        a node did not answer, so its tasks could not be counted). One srun for the whole step."""
        env = {k: v for k, v in self.env.items() if k != self.marker.split("=", 1)[0]}
        try:
            counts = step_task_counts(
                self.client, self.job_id, list(launch.nodes), self.marker, launch.attempt, env, self.timeout_s
            )
        except HPResilienceError as err:
            log.warning("step_task_count_failed", error=str(err)[:300])
            return None
        log.info("step_tasks_counted", attempt=launch.attempt, counts=counts)
        return None if counts is None else any(counts.values())

    def __call__(self, launch: StepView, due: HangDue) -> Attribution:
        started = time.monotonic()
        directory = Path(self.attempt_dir(launch.attempt) or self.root)
        ranks = self.progress.ranks()
        self.reporter.decision(
            "hang_detected",
            attempt=launch.attempt,
            silent_s=round(due.silent_s, 1),
            threshold_s=round(due.threshold_s, 1),
            median_interval_s=(round(due.median_interval_s, 3) if due.median_interval_s else None),
            ranks_known=len(ranks),
            evidence=str(directory),
        )
        signals: dict[str, list[tuple[int, int]]] = {}
        asked: dict[int, Path] = {}
        for rank, info in ranks.items():
            if info.pid and info.stack_signal and info.node in launch.nodes:
                signals.setdefault(info.node, []).append((info.pid, info.stack_signal))
                asked[info.pid] = directory / f"stacks-rank{rank}-{info.pid}.txt"
        before = {pid: _size(p) for pid, p in asked.items()}
        fr_asked = None
        if ranks:  # hpresilience.torch's heartbeats dump the flight recorder on this request (gloo has no dump)
            _write(directory / REQUEST, f"{time.time():.3f}\n")
            fr_asked = time.monotonic()
        env = {k: v for k, v in self.env.items() if k != self.marker.split("=", 1)[0]}
        try:
            raw = probe_marked_processes(
                self.client, self.job_id, list(launch.nodes), self.marker, signals, env, self.timeout_s
            )
        except HPResilienceError as err:
            self.reporter.decision("hang_probe_failed", error=str(err)[:300])
            raw = {}
        reports: dict[str, list[ProcState] | None] = {}
        for node in launch.nodes:
            text = raw.get(node)
            reports[node] = parse_probe_lines(text)[0] if text is not None else None
            if text is not None:
                _write(directory / f"procs-{node}.txt", text)
        stacks = {pid: _size(p) > before[pid] for pid, p in asked.items()}
        verdict = attribute(launch.nodes, reports, stacks, ranks)
        if fr_asked is not None:  # the ranks look for the request 4 times a second
            time.sleep(max(0.0, FR_WAIT_S - (time.monotonic() - fr_asked)))
        front = wavefront(read_dumps(directory), world=sorted(ranks))
        summary = {
            "attempt": launch.attempt,
            "silent_s": due.silent_s,
            "threshold_s": due.threshold_s,
            "unambiguous": verdict.unambiguous,
            "nodes": verdict.nodes,
            "ranks": verdict.ranks,
            "unanswered": verdict.unanswered,
            "suspects": [s.__dict__ for s in verdict.suspects],
            "stacks": {str(pid): str(p) for pid, p in asked.items() if stacks.get(pid)},
            "flight_recorder": {
                "dumps": front.dumps,
                "wavefront": front.groups,
                "behind": [lag.__dict__ for lag in front.behind],
            },
            "took_s": round(time.monotonic() - started, 3),
        }
        _write(directory / "hang.json", json.dumps(summary, indent=1, default=str))
        self.reporter.decision(
            "hang_attributed",
            attempt=launch.attempt,
            node=",".join(verdict.nodes) or None,
            rank=",".join(map(str, verdict.ranks)) or None,
            unambiguous=verdict.unambiguous,
            why="; ".join(s.why for s in verdict.suspects)[:600] or "no rank or node stood out",
            evidence=str(directory),
            stacks=sum(1 for v in stacks.values() if v),
            fr_dumps=front.dumps,
            fr_behind=",".join(map(str, front.ranks)) or None,
            took_s=summary["took_s"],
        )
        return verdict


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def _write(path: Path, text: str) -> None:
    try:
        atomic_write(path, text.encode(), mode=0o600)
    except (OSError, TypeError) as err:
        log.warning("evidence_write_failed", path=str(path), error=str(err))
