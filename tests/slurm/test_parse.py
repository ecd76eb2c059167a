"""Parsers of Slurm output, on real 22.05 recordings and schema-checked v0.0.41/v0.0.44 fixtures."""

from __future__ import annotations

import json

import pytest

from hpresilience.errors import SlurmParseError
from hpresilience.slurm import parse
from tests.conftest import FIXTURES

SLURM = FIXTURES / "slurm"
NODE_FIXTURES = ["sinfo_v0.0.38.json", "scontrol_show_node_v0.0.41.json", "scontrol_show_node_v0.0.44.json"]
JOB_FIXTURES = ["squeue_v0.0.38.json", "scontrol_show_job_v0.0.41.json", "scontrol_show_job_v0.0.44.json"]


@pytest.mark.parametrize("fixture", NODE_FIXTURES)
def test_nodes_parse_the_same_in_every_dialect(fixture: str) -> None:
    """The recorded state (n1 alloc, n2 failing with our reason, n3 drained, n4 down) reads identically."""
    nodes = {n.name: n for n in parse.parse_nodes_json((SLURM / fixture).read_text())}
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
    (job,) = parse.parse_jobs_json((SLURM / fixture).read_text())
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
    assert parse.number(value) == expected


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
        parse.parse_nodes_json(text, "sinfo --json")


def test_odd_records_are_skipped_and_logged_not_fatal(capsys: pytest.CaptureFixture[str]) -> None:
    """A record without a name, a non-object entry, a job with a broken hostlist: the rest still parse."""
    nodes = parse.parse_nodes_json('{"nodes": [{"state": "idle"}, 7, {"name": "n1", "state": "idle"}]}')
    assert [n.name for n in nodes] == ["n1"]
    jobs = parse.parse_jobs_json('{"jobs": [{"job_id": 1, "nodes": "n[1-"}, {"job_id": 2, "nodes": "n1"}]}')
    assert [j.job_id for j in jobs] == [2]
    err = capsys.readouterr().err
    assert err.count("slurm_record_skipped") == 3 and "without a name" in err


def test_unknown_state_words_are_kept_not_fatal() -> None:
    (n,) = parse.parse_nodes_json('{"nodes": [{"name": "x", "state": ["IDLE", "SOMETHING_NEW"]}]}')
    assert n.states == {"IDLE", "SOMETHING_NEW"}


def test_version_and_config_and_oneliner() -> None:
    assert parse.parse_version((SLURM / "scontrol_version_22.05.txt").read_text()) == (22, 5, 8)
    conf = parse.parse_key_values((SLURM / "show_config_22.05.txt").read_text())
    assert "permit_job_expansion" in conf["SchedulerParameters"]
    assert conf["SlurmdTimeout"] == "30 sec"
    one = parse.parse_oneliner((SLURM / "show_job_oneliner_22.05.txt").read_text())
    assert one["JobId"] == "1" and one["NodeList"] == "n[1-2]" and one["ExcNodeList"] == "(null)"
    assert one["BatchHost"] == "n1" and one["JobState"] == "RUNNING"


@pytest.mark.parametrize(
    "text,expected",
    [
        ("Submitted batch job 42\n", 42),
        ("salloc: Granted job allocation 7\n", 7),
        ("13\n", 13),
        ("13;hpdev\n", 13),
        ("salloc: Pending job allocation 9\nsalloc: job 9 queued", 9),
    ],
)
def test_job_id_from_submit_output(text: str, expected: int) -> None:
    assert parse.parse_job_id(text) == expected


def test_job_id_missing_is_an_error() -> None:
    with pytest.raises(SlurmParseError):
        parse.parse_job_id("sbatch: error: Batch job submission failed")


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
    jobs = parse.parse_jobs_json(text)
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
        nodes = parse.parse_nodes_json(text)
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
    assert parse.number(value) == expected


@pytest.mark.parametrize("text", ["slurm 22.05.²", "slurm " + "1" * 5000 + "x.1.1", "slurm ²²." + "1" * 5000])
def test_version_with_odd_digits_is_a_parse_error(text: str) -> None:
    with pytest.raises(SlurmParseError):
        parse.parse_version(text)


@pytest.mark.parametrize("text", ["²", "9" * 5000, "Submitted batch job " + "9" * 5000])
def test_job_id_with_odd_digits_is_a_parse_error(text: str) -> None:
    with pytest.raises(SlurmParseError):
        parse.parse_job_id(text)


def test_step_lines_skip_odd_lines_and_keep_steps_with_bad_hostlists() -> None:
    """`squeue -s` text: a malformed node list leaves that step's nodes unknown instead of failing the query
    (it raised SlurmParseError past a `except ValueError` before issue 14)."""
    text = "12.0|train|n[1-2]\n12.1|probe|n[1-\ngarbage\n12.batch|batch|n1\n\n13|job|n1\n"
    assert parse.parse_step_lines(text) == [
        ("12.0", "train", ("n1", "n2")),
        ("12.1", "probe", ()),
        ("12.batch", "batch", ("n1",)),
    ]


def test_reason_groups_read_recorded_sinfo_output_with_a_bar_inside_a_reason() -> None:
    """22.05's `sinfo -h -o '%R|%D|%H|%N|%E'`: one line per (partition, reason); sizes add up; "none" is no reason."""
    from pathlib import Path

    from hpresilience.slurm.parse import parse_reason_groups

    text = (Path(__file__).parents[1] / "fixtures" / "slurm" / "sinfo_reason_groups_22.05.txt").read_text()
    groups = parse_reason_groups(text + "garbage line\n")
    assert sum(g.count for g in groups) == 4 and {g.partition for g in groups} == {"debug"}
    by_node = {n: g for g in groups for n in g.nodes}
    assert by_node["n2"].reason == "Action:Replace [hpr-agent] xid: GPU | fell off"
    assert by_node["n4"].reason.startswith("hpr: needs a person") and by_node["n4"].reason_at
    assert by_node["n1"].reason == "" and by_node["n1"].reason_at is None
