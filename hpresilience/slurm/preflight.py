"""The preflight step: one short task per node of a new node set (srun --overlap, beside nothing of ours: the
previous attempt is gone), running `python -m hpresilience.torch.preflight`, and the pure reader of its lines.

The tasks end by themselves at the bound; srun is killed `STEP_SLACK_S` later whatever happens (a node whose
slurmd cannot be reached holds srun's launch up to MessageTimeout), and what the hub printed before is read all
the same: the runner's result keeps the output of a command killed at its timeout.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field

from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.srun import nodes_from_srun_errors, srun_error_lines
from hpresilience.slurm.steps import overlap_srun

STEP_NAME = "hpr-preflight"
STEP_SLACK_S = 15.0
_LINE = re.compile(r"^hpr-preflight (?P<what>[a-z]+)(?P<fields>(?: [a-z_]+=\S*)*)\s*$")


@dataclass
class PreflightReport:
    """What the hub said (seconds), and which nodes srun itself named as failed."""

    joined: dict[str, float] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    transfer_s: dict[str, float] = field(default_factory=dict)
    transfer_mb: float = 0.0
    slow: dict[str, float] = field(default_factory=dict)  # node -> seconds waited without its acknowledgement
    allreduce_s: float | None = None
    errors: dict[str, str] = field(default_factory=dict)  # node -> what its task said went wrong
    srun_failed: list[str] = field(default_factory=list)
    done: bool = False
    timed_out: bool = False


def _float(text: str | None) -> float | None:
    try:
        v = float(text or "")
    except ValueError:
        return None
    return v if 0.0 <= v < 1e6 else None  # no NaN, no inf, no negative: not a duration of ours


def parse_preflight_output(stdout: str, stderr: str = "", nodes: list[str] | None = None) -> PreflightReport:
    """The report from the step's output. Lines naming a node outside `nodes` (when given) are ignored."""
    rep = PreflightReport()
    known = set(nodes) if nodes is not None else None
    for line in stdout.splitlines():
        m = _LINE.match(line.strip())
        if m is None:
            continue
        f = dict(w.split("=", 1) for w in m.group("fields").split())
        node = f.get("node", "")
        if node and known is not None and node not in known:
            continue
        what = m.group("what")
        s = _float(f.get("s"))
        if what == "joined" and node and s is not None:
            rep.joined[node] = s
        elif what == "missing" and node:
            rep.missing.append(node)
        elif what == "transfer" and node and s is not None:
            rep.transfer_s[node] = s
            rep.transfer_mb = _float(f.get("mb")) or rep.transfer_mb
        elif what == "slow" and node:
            rep.slow[node] = _float(f.get("after_s")) or 0.0
        elif what == "allreduce":
            rep.allreduce_s = s
        elif what == "error" and node:
            rep.errors[node] = f"{f.get('why', '?')}: {f.get('detail', '')}".strip(": ")[:200]
        elif what == "done":
            rep.done = True
    failed = nodes_from_srun_errors(srun_error_lines(stderr))
    rep.srun_failed = sorted(n for n in failed if known is None or n in known)
    return rep


def preflight_argv(job_id: int, nodes: list[str], python: str = "") -> list[str]:
    return [*overlap_srun(job_id, nodes, STEP_NAME), python or sys.executable, "-m", "hpresilience.torch.preflight"]


def run_preflight(
    client: SlurmClient,
    job_id: int,
    nodes: list[str],
    addr: str,
    port: int,
    bound_s: float,
    mb: float,
    env: dict[str, str],
    give_up_s: float = 0.0,
) -> PreflightReport:
    """Run the check across `nodes` (the hub first), bounded by bound_s + STEP_SLACK_S in all; a transfer not
    acknowledged give_up_s after it began is reported slow at once (0: wait up to the bound)."""
    run_env = {
        **env,
        "HPR_PREFLIGHT_NODES": ",".join(nodes),
        "HPR_PREFLIGHT_ADDR": addr,
        "HPR_PREFLIGHT_PORT": str(port),
        "HPR_PREFLIGHT_BOUND_S": str(bound_s),
        "HPR_PREFLIGHT_MB": str(mb),
        "HPR_PREFLIGHT_GIVE_UP_S": str(give_up_s),
    }
    argv = preflight_argv(job_id, nodes)
    argv[0] = client.runner.path_of("srun")
    # execute(), not run(): a step killed at its bound keeps what it printed (run() would raise it away).
    res = client.runner.execute(argv, bound_s + STEP_SLACK_S, run_env, None, None)
    rep = parse_preflight_output(res.stdout, res.stderr, nodes)
    rep.timed_out = res.timed_out
    return rep
