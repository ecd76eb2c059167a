"""Issue 33's job on the devcluster: a data-parallel job, 3 training nodes x 2 ranks + 1 spare (the whole cluster),
no checkpoint anywhere, through three faults in one job (`--auto-resume-mode=inprocess`): an operator's
`Action:Replace`, a node that dies outright, a hung rank (SIGSTOP). A controller (script provider: the devcluster's
node restart) repairs each failed node while the job trains: the wrapper takes it back as the job's spare, a warm
standby on it, or (a node that died) grows it in at the next fault."""

from __future__ import annotations

import contextlib
import itertools
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from hpresilience.controller.loop import Controller
from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.checkpointless import die_outright
from hpresilience.testing.devcluster import DevCluster
from tests.autoresume.test_wrapper_integration import Run
from tests.conftest import reset_cluster
from tests.controller.conftest import settings_for, write_scripts
from tests.torch.localworld import TRAIN, digests, fault_free_digest, joined

pytestmark = pytest.mark.integration
pytest.importorskip("torch")

# Paced at STEP_S a step through the three faults (a run of STEPS x STEP_S s is more than they take), then the
# pace file says 0 and the rest runs as fast as the machine allows.
STEPS = 400
STEP_S = 0.5
OUT_OF_SERVICE = ("DRAIN", "FAIL", "DOWN", "NOT_RESPONDING", "REBOOT_ISSUED", "REBOOT_REQUESTED")


def fault_free(tmp: Path) -> str:
    """localworld.fault_free_digest with a bound for a loaded machine (six ranks on shared cores); run in a thread
    beside the job, so a failed reference is returned as text (it then equals no rank's digest) rather than raised."""
    try:
        return fault_free_digest(tmp, 6, STEPS, timeout=900)
    except AssertionError as err:
        return f"no reference: {str(err)[-2000:]}"


def wait_for(probe: Callable[[], Any], what: str, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := probe()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.2)
    return found


def rank_process(job_id: int, node: str, local: str) -> psutil.Process | None:
    """The job's training task SLURM_LOCALID=`local` on `node`."""
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            env = p.environ()
            if (
                env.get("HPR_AUTORESUME_JOB") == str(job_id)
                and env.get("SLURMD_NODENAME") == node
                and env.get("SLURM_LOCALID") == local
                and any("train.py" in a for a in p.cmdline())
            ):
                return p
    return None


def gone(p: psutil.Process | None) -> bool:
    try:
        return p is None or p.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def in_service(slurm: SlurmClient, node: str) -> bool:
    return not slurm.node(node).has(*OUT_OF_SERVICE)


@pytest.mark.timeout(900)  # ~4 min here on a loaded 2-core machine (the replacement's torch import: 20-40 s)
def test_replace_then_a_dead_node_then_a_hung_rank_in_one_job_keep_every_survivor_and_the_weights(
    cluster: DevCluster, slurm: SlurmClient, tmp_path: Path
) -> None:
    """Each fault is replaced in the running world: the failed node's step alone is cancelled (the stopped rank
    dies with it), its slot goes to a node the controller repaired after the fault before, the new ranks get
    their state from rank 0, every other rank keeps its process (same PID in every world it joins), every step
    is completed once and in order (nothing rolled back), and the final weights equal bit for bit those of the
    same job with no fault. The hang is named by the relaunch path's probe (the stopped process's state), its
    node marked Action:Reboot as that path marks it."""
    # The fault-free run's weights, computed beside the job (its six ranks are local processes): wall time.
    reference: list[str] = []
    beside = threading.Thread(target=lambda: reference.append(fault_free(tmp_path / "reference")), daemon=True)
    beside.start()
    scripts = write_scripts(tmp_path / "scripts", cluster)
    # Dead nodes (DOWN, "Not responding", after SlurmdTimeout) are repaired too; the default repairs only nodes
    # whose reason asks for it.
    ctl = Controller(
        settings_for(
            scripts, tmp_path / "ctl", repair_down_without_reason=True, down_grace_s=0, come_back_timeout_s=60
        ),
        slurm,
    )
    controller = threading.Thread(target=ctl.run, name="controller", daemon=True)
    controller.start()
    pace = tmp_path / "pace"
    pace.write_text(f"{STEP_S}\n")
    config = tmp_path / "config.yaml"
    # Hang: silence past 10 s once the world trains (a step takes 0.5 s or more), heartbeats twice a second; a
    # replacement has 120 s to train (Python and torch start slowly on a loaded machine).
    config.write_text(
        "autoresume:\n  full_node_check_s: 0.5\n  hang_floor_s: 10\n  hang_first_step_s: 120\n"
        "  heartbeat_every_s: 0.5\n  spare_check_s: 2\n"
    )
    (tmp_path / "job").mkdir()
    run = Run(
        cluster,
        slurm,
        tmp_path / "job",
        "--auto-resume-mode=inprocess --auto-resume-spares=1",
        f"--ntasks-per-node=2 --overcommit python {TRAIN}",
        nodes=4,
        env={
            "TRAIN_STEPS": str(STEPS),
            "STEP_SLEEP": str(STEP_S),
            "STEP_SLEEP_FILE": str(pace),
            "HPR_WORLD_WAIT_S": "120",
            "HPRESILIENCE_CONFIG": str(config),
        },
    )

    def in_world(generation: int) -> list[dict[str, str]]:
        return [j for j in joined(run.out) if j["generation"] == str(generation)]

    took: dict[str, float] = {}
    stopped: psutil.Process | None = None
    try:
        run.wait_output("step=10 ", timeout=180)
        first = run.named("inprocess_world_written")[0]
        plan = first["nodes"].split(",")
        assert first["world_size"] == 6 and len(plan) == 3
        batch_host = slurm.job(run.job_id).batch_host
        assert plan[0] == batch_host  # the faults go to the other two slots

        def fault(generation: int, name: str, act: Callable[[], None]) -> list[str]:
            """`act`, then wait for every rank in the new world and its training (3 steps); its nodes. The world
            that forms may be a later one with the same nodes: its new node's ranks started again (Slurm's delayed
            termination of the job on a node that had left it unanswering)."""

            def formed() -> int | None:
                gens = sorted({int(j["generation"]) for j in joined(run.out)})
                return next((g for g in gens if g >= generation and len(in_world(g)) == 6), None)

            at = time.time()
            act()
            g = wait_for(formed, f"generation {generation} ({name})", 240)
            took[name] = max(float(j["at"]) for j in in_world(g)) - at
            trained = re.compile(r"^step=\d+ generation=(\d+) ", re.MULTILINE)
            wait_for(
                lambda: sum(int(g) >= generation for g in trained.findall(run.out)) >= 3,
                f"generation {generation} training",
                120,
            )
            return str(run.named("inprocess_world_written")[generation - 1]["nodes"]).split(",")

        # 1. An operator's Action:Replace on slot 1's node: the spare takes the slot.
        def repaired(node: str, since: float) -> bool:
            """The controller finished a repair of `node` since then, and Slurm has it in service: a dead node
            looks in service to Slurm until SlurmdTimeout (30 s) has passed."""
            return bool(ctl.repairs_since(node, since)) and in_service(slurm, node)

        replaced, since = plan[1], time.time()
        plan = fault(2, "replace", lambda: slurm.set_node_state([replaced], "fail", "Action:Replace"))
        first_spare = plan[1]
        wait_for(lambda: repaired(replaced, since), f"the controller's repair of {replaced}", 120)

        # The spare spent on it is made good by the repaired node, with a standby on it (decide/spares.py).
        def refilled() -> list[str]:
            return [str(e["nodes"]) for e in run.named("spares_refilled")]

        wait_for(lambda: replaced in refilled(), f"{replaced} taken back as the job's spare", 60)

        # 2. Slot 2's node dies outright (slurmd and its tasks killed); the spare (the node repaired) takes the slot.
        dead = plan[2]

        def die() -> None:
            # Everything of the node at once: slurmd, the step's slurmstepd and its tasks. A slurmstepd left behind
            # ends the job's steps there long after, killing the next world's step on the repaired node: not what
            # a dead node does.
            assert die_outright(cluster, dead, run.job_id, stepds=True) == 2

        since = time.time()
        plan = fault(3, "dead node", die)
        assert plan[2] == replaced, plan
        wait_for(lambda: repaired(dead, since), f"the controller's repair of {dead}", 120)

        # 3. A rank on slot 1's node is stopped: the world hangs until the hang watch names that node.
        hung = plan[1]
        stopped = wait_for(lambda: rank_process(run.job_id, hung, "1"), f"a rank on {hung}", 30)

        def stop() -> None:
            assert stopped is not None
            stopped.send_signal(signal.SIGSTOP)

        plan = fault(4, "hung rank", stop)
        assert plan[1] == dead, plan
        wait_for(lambda: gone(stopped), "the stopped rank's end (its step cancelled)", 30)
        pace.write_text("0\n")
        assert run.wait_done(300) == "0", run.out + run.err
    finally:
        with contextlib.suppress(Exception):
            slurm.cancel(run.job_id)
        if stopped is not None:
            with contextlib.suppress(psutil.Error):
                stopped.kill()
        ctl.stop()
        controller.join(timeout=60)
        reset_cluster(cluster)
    out = run.out
    # Every rank keeps its process from world to world unless its slot was replaced in that world.
    worlds = run.named("inprocess_world_written")
    # The dead node, repaired and taken back, may still get Slurm's delayed termination of the job (its agent's
    # retry): that slot's ranks start again on it, one world more, nothing rolled back.
    relaunched = run.named("inprocess_step_relaunched")
    assert all(e["nodes"] == dead for e in relaunched) and len(relaunched) <= 3, relaunched
    last = 4 + len(relaunched)
    assert [w["generation"] for w in worlds] == list(range(1, last + 1)), worlds
    pids = {g: {int(j["rank"]): j for j in in_world(g)} for g in range(1, last + 1)}
    # A world whose new ranks were killed as they started never forms: its other ranks leave it for the next.
    formed = [g for g in range(1, last + 1) if len(pids[g]) == 6]
    assert formed[0] == 1 and formed[-1] == last and len(formed) >= 4, {g: sorted(p) for g, p in pids.items()}
    for before, g in itertools.pairwise(formed):
        new = {int(r) for w in worlds[before:g] for r in str(w["new_ranks"]).split(",")}
        assert len(new) == 2, worlds[before:g]
        kept = [r for r in range(6) if r not in new]
        assert [pids[g][r]["pid"] for r in kept] == [pids[before][r]["pid"] for r in kept], out
        assert all(pids[g][r]["pid"] != pids[before][r]["pid"] for r in new), out
        # Each new rank took its state from a different survivor (transfer.py deals them round).
        sources = [int(pids[g][r]["state_from"]) for r in sorted(new)]
        assert len(set(sources)) == len(new) and set(sources) <= set(kept), out
    # The three faults, in order, as this mode sees them.
    assert [e["replaced"] for e in run.named("inprocess_replaced")] == [replaced, dead, hung]
    # The first two replacements were warm standbys: the job's spare from the start, then the repaired node taken
    # back as the spare between the faults. The dead node, repaired, is not taken back as a spare (Slurm's delayed
    # termination of the job there would kill its standby): the hang's replacement grows it in at the fault.
    assert [e["node"] for e in run.named("standby_taken")][:2] == [first_spare, replaced], run.named("standby_taken")
    assert dead not in refilled(), refilled()
    assert run.named("node_fault_seen")[0]["node"] == replaced
    # The dead node: its srun does not end (its slurmstepd is gone with it and Slurm has not yet declared it
    # DOWN), so the whole world goes silent: the stall watch asks every node after a few step intervals and finds
    # it not answering (silent_step_probed), long before the hang watch's floor; were its step to end first, the
    # liveness probe would name it (nodes_probed).
    by_node = {e["node"]: e for e in run.named("inprocess_hang_attributed")}
    blamed = [e.get("blamed") for e in run.named("silent_step_probed")]
    probed = [e.get("unanswering") for e in run.named("nodes_probed")]
    assert dead in blamed or dead in probed, (blamed, probed)
    # The hung rank: named by its state and its rank (3, whether its process started as that rank or as a warm
    # standby named rank 3 only at its assignment: its heartbeats say so), its node marked Action:Reboot as the
    # relaunch path marks a hang's culprit.
    assert by_node[hung]["marked"] is True and by_node[hung].get("rank") == "3", by_node
    assert any("stopped" in e["why"] and e["node"] == hung for e in run.named("hang_attributed"))
    marked = {m["node"]: m for m in run.named("suspect_node_marked")}
    assert hung in marked and "Action:Reboot" in marked[hung]["reason"] and "hang" in marked[hung]["reason"]
    assert not run.named("inprocess_fallback") and not run.named("attempt_started")
    # Nothing rolled back: rank 0 (a survivor throughout) completed every step once, in order.
    done = [int(s) for s in re.findall(r"^step=(\d+) ", out, re.MULTILINE)]
    assert done == list(range(1, STEPS + 1)), done[:50]
    beside.join(timeout=600)
    final = digests(out)
    assert len(final) == 6 and set(final.values()) == set(reference), out[-3000:]
    for name, seconds in took.items():
        print(f"in-process recovery ({name}): fault -> every rank training again {seconds:.2f} s")
