"""The filtered reads' parsers (`scontrol show node|job -o`, sinfo name lists) on real 22.05 recordings.

The recordings (tests/fixtures/slurm/record_filtered.py) hold the text form and the JSON of the very same
nodes and job, so the two paths are held equal field by field: FAIL/DRAIN/DOWN flags, reasons, addresses.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator

import pytest
from structlog.testing import capture_logs

from hpresilience.slurm import parse, parsejson
from hpresilience.slurm.models import Node
from tests.conftest import FIXTURES

SLURM = FIXTURES / "slurm"


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """scontrol prints local time; the recordings were made in UTC."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def text_nodes() -> dict[str, Node]:
    return {n.name: n for n in parse.parse_nodes_oneliner((SLURM / "show_node_oneliner_22.05.txt").read_text())}


def test_text_node_records_equal_the_json_of_the_same_nodes() -> None:
    """Every field of every node reads the same from `scontrol show node -o` as from `sinfo --json`."""
    as_json = {n.name: n for n in parsejson.parse_nodes_json((SLURM / "filtered_sinfo_v0.0.38.json").read_text())}
    as_text = text_nodes()
    assert sorted(as_text) == sorted(as_json) == ["gpu-st-p5-1", "gpu-st-p5-2", "n1", "n2", "n3", "n4"]
    for name, node in as_text.items():
        assert node == as_json[name], name


def test_text_node_states_reasons_and_addresses() -> None:
    nodes = text_nodes()
    assert nodes["n2"].states == {"ALLOCATED", "FAIL"} and nodes["n2"].is_failing
    # A reason with `x=1` and brackets in it is kept whole, not split into fields.
    assert nodes["n3"].reason == "operator: bad fan x=1 [rack 3]" and nodes["n3"].is_drained
    assert nodes["n2"].reason == "Action:Replace xid=79 (hpresilience)" and nodes["n2"].reason_set_by == "root"
    assert nodes["n4"].states == {"DOWN", "NOT_RESPONDING"} and nodes["n4"].reason == "Not responding"
    assert nodes["gpu-st-p5-2"].states == {"IDLE", "CLOUD", "DRAIN", "POWERED_DOWN"}
    assert nodes["gpu-st-p5-1"].reason == "" and nodes["gpu-st-p5-1"].reason_changed_at is None
    assert nodes["gpu-st-p5-1"].gres == "gpu:8" and nodes["gpu-st-p5-1"].cpus == 192
    assert nodes["gpu-st-p5-1"].features == ("p5", "p5.48xlarge", "efa", "nvlink")
    assert nodes["n1"].address == "127.0.0.11" and nodes["n4"].address == "127.0.0.14"
    assert nodes["n1"].slurmd_start_time and nodes["gpu-st-p5-1"].slurmd_start_time is None


def test_text_job_record_equals_the_json_of_the_same_job() -> None:
    (as_json,) = parsejson.parse_jobs_json((SLURM / "filtered_squeue_v0.0.38.json").read_text())
    (as_text,) = parse.parse_jobs_oneliner((SLURM / "show_job_id_oneliner_22.05.txt").read_text())
    # The text form has no counterpart of the JSON's job flags (nothing reads them).
    assert as_text == dataclasses.replace(as_json, flags=())
    assert as_text.nodes == ("n1", "n2") and as_text.batch_host == "n1" and as_text.is_running


def test_unknown_node_line_and_odd_lines_are_skipped_and_logged() -> None:
    text = (SLURM / "show_node_unknown_22.05.txt").read_text() + "garbage without fields\n\n"
    with capture_logs() as logs:
        nodes = parse.parse_nodes_oneliner(text)
    assert [n.name for n in nodes] == ["n1"]
    assert [e["event"] for e in logs] == ["slurm_record_skipped", "slurm_record_skipped"]


def test_older_star_state_reads_as_not_responding() -> None:
    node = parse.node_from_oneliner(
        "NodeName=a1 NodeAddr=10.0.0.1 State=DOWN*+DRAIN Reason=gone [slurm@2024-01-02T03:04:05]"
    )
    assert node.states == {"DOWN", "DRAIN", "NOT_RESPONDING"} and node.reason == "gone"
    assert node.reason_changed_at == 1704164645 and node.reason_set_by == "slurm"


def test_reason_followed_by_more_fields_stops_at_its_user_and_time() -> None:
    node = parse.node_from_oneliner(
        "NodeName=a1 State=IDLE+DRAIN Reason=Action:Reboot k=v [root@2024-01-02T03:04:05] Comment=cabinet=4"
    )
    assert node.reason == "Action:Reboot k=v" and node.states == {"IDLE", "DRAIN"}


def test_name_lists_drop_duplicates() -> None:
    assert parse.parse_node_names((SLURM / "sinfo_R_N_22.05.txt").read_text()) == ["gpu-st-p5-2", "n2", "n3", "n4"]
    assert parse.parse_node_names("a\nb\na\n\n") == ["a", "b"]


def test_idle_listing_keeps_only_bare_idle_nodes() -> None:
    """`sinfo -t idle` lists drained and powered-down nodes too; none of them can take a job."""
    text = (SLURM / "sinfo_idle_22.05.txt").read_text()
    assert "gpu-st-p5-2|drain~" in text and "gpu-st-p5-1|idle~" in text
    assert parse.parse_idle_names(text) == []
    assert parse.parse_idle_names(text + "n4|idle\nn3|drain\nn4|idle\n") == ["n4"]


def test_filtered_json_fixture_is_real_22_05_output() -> None:
    meta = json.loads((SLURM / "filtered_sinfo_v0.0.38.json").read_text())["meta"]
    assert meta["Slurm"]["release"] == "22.05.8"


def test_real_size_node_record_matches_the_v0_0_41_schema_and_reads() -> None:
    """The parse benchmark's template: a p5 node in the full field layout of real records (2.3-3.4 KB)."""
    doc = json.loads((SLURM / "node_p5_v0.0.41.json").read_text())
    # Measured as scontrol prints it, inside the `nodes` list.
    assert 2300 <= len(json.dumps({"nodes": doc["nodes"]}, indent=2)) <= 3400
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(doc, json.loads((SLURM / "schema_v0.0.41_openapi_nodes_resp.json").read_text()))
    (node,) = parsejson.parse_nodes_json(json.dumps(doc))
    assert node.name == "gpu-st-p5-1" and node.states == {"ALLOCATED"} and node.gres == "gpu:h100:8(S:0-1)"
    assert node.partitions == ("p5", "gpu-all") and node.cpus == 192 and node.slurmd_start_time == 1795540080
