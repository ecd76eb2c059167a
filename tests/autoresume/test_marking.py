"""The wrapper's one way to mark a node (decide/marking.py): a detector's mark request, carried out after the step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hpresilience.autoresume.decide.marking import REASON_MAX, mark_nodes, mark_reason
from hpresilience.autoresume.report import Reporter
from hpresilience.autoresume.state import WrapperStateStore
from hpresilience.autoresume.watch.base import MarkRequest
from hpresilience.errors import SlurmError
from hpresilience.reasons import Action, parse_reason
from hpresilience.slurm.client import SlurmClient

JOB = 7


class Refusing(SlurmClient):
    """scontrol as a user on a cluster where only operators update nodes: n1 is refused, n2 taken."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], str, str]] = []

    def set_node_state(self, names: Any, action: Any, reason: str = "") -> None:
        if "n1" in names:
            raise SlurmError(["scontrol", "update"], 1, "Access/permission denied")
        self.calls.append((list(names), str(action), reason))


def test_the_reason_is_the_controllers_grammar_with_the_job_tag_and_quotes_and_length_tamed() -> None:
    request = MarkRequest(Action.REPLACE, 'rank 3 said "x"' + "y" * 600, "/s/7.events.jsonl", "sdc_node_marked")
    reason = mark_reason(JOB, request)
    assert reason.startswith("Action:Replace [hpr-autoresume job 7] rank 3 said 'x'")
    assert len(reason) == REASON_MAX and '"' not in reason
    assert parse_reason(reason).action is Action.REPLACE


def test_a_refused_mark_is_an_event_and_the_other_nodes_are_still_marked(tmp_path: Path) -> None:
    client = Refusing()
    reporter = Reporter(WrapperStateStore(tmp_path, JOB), JOB, None)
    request = MarkRequest(Action.REBOOT, "hang: rank 1 stopped", "/e", "suspect_node_marked")
    assert mark_nodes(client, reporter, JOB, ["n1", "n2"], request) == ["n2"]
    assert [c[0] for c in client.calls] == [["n2"]] and client.calls[0][1] == "fail"
    events = [json.loads(line) for line in reporter.store.events_path.read_text().splitlines()]
    by_name = {e["event"]: e for e in events}
    assert by_name["suspect_node_marked_failed"]["node"] == "n1"
    assert by_name["suspect_node_marked"]["node"] == "n2" and by_name["suspect_node_marked"]["action"] == "reboot"
