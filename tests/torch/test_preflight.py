"""The preflight's task (torch/preflight.py), as srun starts it on each node: here three local processes named as
three nodes by SLURMD_NODENAME, real gloo over loopback. Its lines are what slurm/preflight.py reads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hpresilience.slurm.preflight import parse_preflight_output
from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]


def start(node: str, nodes: list[str], port: int, bound_s: float) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "SLURMD_NODENAME": node,
        "HPR_PREFLIGHT_NODES": ",".join(nodes),
        "HPR_PREFLIGHT_ADDR": "127.0.0.1",
        "HPR_PREFLIGHT_PORT": str(port),
        "HPR_PREFLIGHT_BOUND_S": str(bound_s),
        "HPR_PREFLIGHT_MB": "2",
    }
    cmd = [sys.executable, "-m", "hpresilience.torch.preflight"]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_every_node_joins_reduces_and_has_its_transfer_timed_by_the_hub() -> None:
    nodes = ["n2", "n1", "n3"]  # the hub is first, whatever the names' order
    port = free_port()
    procs = [start(n, nodes, port, 30) for n in nodes]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    rep = parse_preflight_output(outs[0], "", nodes)
    assert set(rep.joined) == set(nodes) and rep.done, outs
    assert set(rep.transfer_s) == {"n1", "n3"} and rep.transfer_mb == 2.0
    assert all(p.returncode == 0 for p in procs)


def test_a_node_that_never_joins_is_named_missing_and_every_task_ends_by_itself() -> None:
    nodes = ["n1", "n2", "n3"]
    port = free_port()
    procs = [start(n, nodes, port, 6) for n in nodes[:2]]  # n3's task never starts (its link is cut)
    outs = [p.communicate(timeout=60)[0] for p in procs]
    rep = parse_preflight_output(outs[0], "", nodes)
    assert rep.missing == ["n3"] and set(rep.joined) == {"n1", "n2"} and rep.done, outs
    assert not rep.transfer_s
