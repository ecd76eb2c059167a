"""Parsers of Slurm's JSON output, on real 22.05 recordings and schema-checked v0.0.41/v0.0.44 fixtures."""

from __future__ import annotations

import json

import pytest

from hpresilience.errors import SlurmParseError
from hpresilience.slurm import parsejson
from tests.conftest import FIXTURES

SLURM = FIXTURES / "slurm"
NODE_FIXTURES = ["sinfo_v0.0.38.json", "scontrol_show_node_v0.0.41.json", "scontrol_show_node_v0.0.44.json"]
JOB_FIXTURES = ["squeue_v0.0.38.json", "scontrol_show_job_v0.0.41.json", "scontrol_show_job_v0.0.44.json"]


@pytest.mark.parametrize("fixture", NODE_FIXTURES)
def test_nodes_parse_the_same_in_every_dialect(fixture: str) -> None:
    """The recorded state (n1 alloc, n2 failing with our reason, n3 drained, n4 down) reads identically."""
    nodes = {n.name: n for n in parsejson.parse_nodes_json((SLURM / fixture).read_text())}
    assert sorted(nodes) == ["n1", "n2", "n3", "n4"]
    assert nodes["n1"].states == {"ALLOCATED"} and nodes["n1"].is_busy and not nodes["n1"].is_unavailable
    assert nodes["n2"].states == {"ALLOCATED", "FAIL"} and nodes["n2"].is_failing
    assert nodes["n2"].reason == "Action:Replace xid=79 (hpresilience)"
    assert nodes["n2"].reason_set_by == "root" and nodes["n2"].reason_changed_at
    assert nodes["n3"].is_drained and nodes["n3"].reason == "operator: bad fan"
    assert nodes["n4"].has("DOWN") and nodes["n4"].is_unavailable and not nodes["n4"].is_idle
    assert nodes["n1"].address == "127.0.0.11" and nodes["n4"].address == "127.0.0.14"
    assert nodes["n1"].partitions == ("debug",)


@pytest.mark.parametrize("fixture", JOB_FIXTURES)
def test_jobs_parse_the_same_in_every_dialect(fixture: str) -> None:
    (job,) = parsejson.parse_jobs_json((SLURM / fixture).read_text())
    assert job.job_id == 1 and job.state == "RUNNING" and job.is_running
    assert job.nodes == ("n1", "n2") and job.num_nodes == 2
    assert job.user == "root" and job.batch_host == "n1" and job.partition == "debug"


def test_newer_fixtures_match_slurm_openapi_schema() -> None:
    """The v0.0.41/v0.0.44 fixtures validate against Slurm's own schema (subset saved beside them)."""
    jsonschema = pytest.importorskip("jsonschema")
    for version in ("0.0.41", "0.0.44"):
        for kind, root in (("node", "nodes_resp"), ("job", "job_info_resp")):
            doc = json.loads((SLURM / f"scontrol_show_{kind}_v{version}.json").read_text())
            schema = json.loads((SLURM / f"schema_v{version}_openapi_{root}.json").read_text())
            jsonschema.validate(doc, schema)
            doc["nodes" if kind == "node" else "jobs"][0]["name" if kind == "node" else "job_id"] = ["bad"]
            with pytest.raises(jsonschema.ValidationError):
                jsonschema.validate(doc, schema)


@pytest.mark.parametrize(
    "value,expected",
    [
        (5, 5),
        (None, None),
        ({"set": True, "infinite": False, "number": 7}, 7),
        ({"set": False, "infinite": False, "number": 7}, None),
        ({"set": True, "infinite": True, "number": 0}, None),
        ("12", 12),
        ("x", None),
        (True, None),
    ],
)
def test_number_reads_both_dialects(value: object, expected: int | None) -> None:
    assert parsejson.number(value) == expected


@pytest.mark.parametrize(
    "text,needle",
    [
        ("not json at all", "not JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"meta": {}}', "no `nodes` list"),
        ('{"errors": [{"error": "Unable to contact slurm controller"}]}', "Unable to contact slurm controller"),
    ],
)
def test_odd_node_output_is_a_clear_parse_error(text: str, needle: str) -> None:
    with pytest.raises(SlurmParseError, match=needle.replace("`", ".")):
        parsejson.parse_nodes_json(text, "sinfo --json")


def test_odd_records_are_skipped_and_logged_not_fatal(capsys: pytest.CaptureFixture[str]) -> None:
    """A record without a name, a non-object entry, a job with a broken hostlist: the rest still parse."""
    nodes = parsejson.parse_nodes_json('{"nodes": [{"state": "idle"}, 7, {"name": "n1", "state": "idle"}]}')
    assert [n.name for n in nodes] == ["n1"]
    jobs = parsejson.parse_jobs_json('{"jobs": [{"job_id": 1, "nodes": "n[1-"}, {"job_id": 2, "nodes": "n1"}]}')
    assert [j.job_id for j in jobs] == [2]
    err = capsys.readouterr().err
    assert err.count("slurm_record_skipped") == 3 and "without a name" in err


def test_unknown_state_words_are_kept_not_fatal() -> None:
    (n,) = parsejson.parse_nodes_json('{"nodes": [{"name": "x", "state": ["IDLE", "SOMETHING_NEW"]}]}')
    assert n.states == {"IDLE", "SOMETHING_NEW"}


def _job(**fields: object) -> dict[str, object]:
    return {"job_id": 7, "name": "j", "job_state": "RUNNING", "nodes": "n1", "user_name": "u", **fields}


# Odd values a record may carry (issue 14 item 5: each used to raise a foreign exception out of the parser).
ODD_JOB_FIELDS = [
    '{"restart_cnt": 1e999}',  # Infinity after json.loads: OverflowError in int()
    '{"restart_cnt": NaN}',  # ValueError in int()
    '{"node_count": {"set": true, "number": -Infinity}}',
    '{"flags": 5}',  # TypeError iterating an int
    '{"job_id": "²"}',  # isdigit() but not int()
    '{"job_id": "' + "9" * 5000 + '"}',  # int() of more than 4300 digits
    '{"nodes": "n[1-"}',  # a malformed hostlist
    '{"name": ' + "[" * 50 + "]" * 50 + "}",
]


@pytest.mark.parametrize("odd", ODD_JOB_FIELDS)
def test_one_odd_job_record_costs_only_that_record(odd: str) -> None:
    """Item 5: the good records still come back; the odd one is skipped (and logged), nothing escapes."""
    # Spliced as text: json.dumps cannot write NaN/Infinity the way a broken plugin could; a repeated key
    # (job_id) is read last-wins by json.loads, as by Slurm's clients.
    bad = json.dumps(_job(job_id=8))[:-1] + ", " + odd[1:-1] + "}"
    text = '{"jobs": [' + json.dumps(_job()) + ", " + bad + "]}"
    jobs = parsejson.parse_jobs_json(text)
    assert 7 in [j.job_id for j in jobs]


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000 + "]" * 100_000,  # RecursionError inside json.loads
        '{"nodes": [], "errors": {"error": "x"}}' + " ",  # errors as a mapping, not a list
        '{"errors": {"error": "slurmctld down"}}',  # KeyError on errors[0]
        '{"nodes": ' + "9" * 5000 + "}",  # 4300-digit limit of int()
    ],
)
def test_hostile_documents_are_clear_parse_errors_or_empty(text: str) -> None:
    """Item 5: a whole document that cannot be read is a SlurmParseError (the package's own), never another."""
    try:
        nodes = parsejson.parse_nodes_json(text)
    except SlurmParseError:
        return
    assert nodes == []


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (float("inf"), None),
        (float("nan"), None),
        ({"set": True, "number": float("inf")}, None),
        ("²", None),
        ("9" * 5000, None),
        ({"set": True, "number": True}, None),
        ("12", 12),
    ],
)
def test_number_refuses_what_int_cannot_read(value: object, expected: int | None) -> None:
    assert parsejson.number(value) == expected
