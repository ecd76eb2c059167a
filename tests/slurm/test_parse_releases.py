"""Parsers on real output of Slurm 24.11 (Debian trixie) and 26.05 (sid), recorded from the devcluster running
in their roots by tests/fixtures/slurm/record_release.sh: the state of record.sh (n1 allocated, n2 failing with
our reason, n3 drained, n4 down; a 2-node job with a step on n1,n2) plus a finished one-node job on n3.

Each release's text and JSON forms must read as the same cluster, as 22.05's recordings do."""

from __future__ import annotations

import dataclasses
import json

import pytest

from hpresilience.errors import SlurmParseError
from hpresilience.slurm import parse, parsejson
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.models import Job, Node
from hpresilience.testing.fakerunner import FakeRunner
from tests.conftest import FIXTURES

SLURM = FIXTURES / "slurm"
RELEASES = ["24.11", "26.05"]


def read(name: str) -> str:
    return (SLURM / name).read_text()


def job_ids(release: str) -> tuple[int, int]:
    """(finished job, running job): ids start at the recording cluster's FirstJobId."""
    lines = parse.parse_jobs_oneliner(read(f"show_job_oneliner_{release}.txt"))
    by_name = {j.name: j.job_id for j in lines}
    return by_name["done"], by_name["train"]


def assert_recorded_nodes(nodes: list[Node]) -> None:
    by = {n.name: n for n in nodes}
    assert sorted(by) == ["n1", "n2", "n3", "n4"]
    assert by["n1"].states == {"ALLOCATED"} and by["n1"].is_busy and not by["n1"].is_unavailable
    assert by["n2"].has("FAIL") and by["n2"].is_failing and by["n2"].is_busy
    assert by["n2"].reason == "Action:Replace xid=79 (hpresilience)"
    assert by["n3"].is_drained and by["n3"].reason == "operator: bad fan" and not by["n3"].is_idle
    assert by["n4"].has("DOWN") and by["n4"].is_unavailable and not by["n4"].is_idle
    assert by["n1"].address == "127.0.0.11" and by["n4"].address == "127.0.0.14"
    assert by["n1"].partitions == ("debug",)


@pytest.mark.parametrize("release", RELEASES)
def test_node_json_of_newer_releases_reads_the_recorded_states(release: str) -> None:
    nodes = parsejson.parse_nodes_json(read(f"scontrol_show_node_{release}.json"))
    assert_recorded_nodes(nodes)
    by = {n.name: n for n in nodes}
    assert by["n2"].reason_set_by == "root" and by["n2"].reason_changed_at


@pytest.mark.parametrize("release", RELEASES)
def test_node_oneliners_of_newer_releases_read_as_their_json(release: str) -> None:
    text_nodes = parse.parse_nodes_oneliner(read(f"show_node_oneliner_{release}.txt"))
    assert_recorded_nodes(text_nodes)
    json_nodes = {n.name: n for n in parsejson.parse_nodes_json(read(f"scontrol_show_node_{release}.json"))}
    for n in text_nodes:
        assert (n.states, n.reason, n.address) == (
            json_nodes[n.name].states,
            json_nodes[n.name].reason,
            json_nodes[n.name].address,
        )


@pytest.mark.parametrize("release", RELEASES)
def test_newer_sinfo_json_is_node_groups_and_a_clear_error_naming_the_query_to_use(release: str) -> None:
    """22.05's `sinfo --json` listed node records; 23.02+ lists groups (the client reads nodes with scontrol
    there). Parsed as nodes it is one clear error, not an empty cluster."""
    groups = json.loads(read(f"sinfo_{release}.json"))["sinfo"]
    assert sorted(n for g in groups for n in g["nodes"]["nodes"]) == ["n1", "n2", "n3", "n4"]
    with pytest.raises(SlurmParseError, match="scontrol --json show node"):
        parsejson.parse_nodes_json(read(f"sinfo_{release}.json"), "sinfo --json")


def assert_recorded_jobs(jobs: list[Job], release: str, finished_listed: bool = True) -> None:
    done_id, train_id = job_ids(release)
    by = {j.job_id: j for j in jobs}
    train = by[train_id]
    assert train.name == "train" and train.state == "RUNNING" and train.is_running and not train.is_finished
    assert train.nodes == ("n1", "n2") and train.num_nodes == 2
    assert train.user == "root" and train.batch_host == "n1" and train.partition == "debug"
    if finished_listed:
        assert by[done_id].state == "COMPLETED" and by[done_id].is_finished and by[done_id].nodes == ("n3",)
    else:
        assert done_id not in by


@pytest.mark.parametrize("release", RELEASES)
def test_job_json_of_newer_releases_reads_the_recorded_jobs(release: str) -> None:
    assert_recorded_jobs(parsejson.parse_jobs_json(read(f"scontrol_show_job_{release}.json")), release)


@pytest.mark.parametrize("release", RELEASES)
def test_newer_squeue_json_lists_only_active_jobs(release: str) -> None:
    """Unlike 22.05's (every job slurmctld knows), 24.11's and 26.05's `squeue --json` leave finished jobs
    out: a finished job is read with scontrol there (the client does on 23.02+)."""
    assert_recorded_jobs(parsejson.parse_jobs_json(read(f"squeue_{release}.json")), release, finished_listed=False)


@pytest.mark.parametrize("release", RELEASES)
def test_job_oneliners_of_newer_releases_read_the_recorded_jobs(release: str) -> None:
    assert_recorded_jobs(parse.parse_jobs_oneliner(read(f"show_job_oneliner_{release}.txt")), release)


@pytest.mark.parametrize(("release", "version"), [("24.11", (24, 11, 5)), ("26.05", (26, 5, 5))])
def test_version_of_newer_releases(release: str, version: tuple[int, int, int]) -> None:
    assert parse.parse_version(read(f"scontrol_version_{release}.txt")) == version


@pytest.mark.parametrize("release", RELEASES)
def test_config_of_newer_releases(release: str) -> None:
    conf = parse.parse_key_values(read(f"show_config_{release}.txt"))
    assert "permit_job_expansion" in conf["SchedulerParameters"].split(",")
    assert conf["AccountingStorageType"] == "accounting_storage/slurmdbd"
    assert conf["SlurmdTimeout"] == "30 sec" and conf["ReturnToService"] == "2"


@pytest.mark.parametrize("release", RELEASES)
def test_sinfo_text_of_newer_releases(release: str) -> None:
    assert parse.parse_node_names(read(f"sinfo_R_N_{release}.txt")) == ["n2", "n3", "n4"]
    # `-t idle` lists the drained n3 too: it must not count as free.
    assert "n3|drain" in read(f"sinfo_idle_{release}.txt")
    assert parse.parse_idle_names(read(f"sinfo_idle_{release}.txt")) == []


@pytest.mark.parametrize("release", RELEASES)
def test_step_lines_of_newer_releases(release: str) -> None:
    _, train = job_ids(release)
    assert parse.parse_step_lines(read(f"squeue_steps_{release}.txt")) == [
        (f"{train}.0", "steptrain", ("n1", "n2")),
        (f"{train}.batch", "batch", ("n1",)),
    ]


@pytest.mark.parametrize(("release", "parser"), [("24.11", "v0.0.42"), ("26.05", "v0.0.45")])
def test_recorded_json_names_its_data_parser(release: str, parser: str) -> None:
    """Which OpenAPI dialect each release speaks by default (docs/slurm-notes.md lists them)."""
    for name in ("scontrol_show_node", "sinfo", "squeue", "scontrol_show_job", "sacct"):
        meta = json.loads(read(f"{name}_{release}.json"))["meta"]
        assert meta["plugin"]["data_parser"] == f"data_parser/{parser}"


@pytest.mark.parametrize("release", RELEASES)
def test_job_text_and_json_of_newer_releases_agree_on_every_field_but_flags(release: str) -> None:
    """The wrapper reads jobs as JSON on 23.02+ and as text before: both must give the same Job (the text form
    carries no flags)."""
    text = {j.job_id: j for j in parse.parse_jobs_oneliner(read(f"show_job_oneliner_{release}.txt"))}
    js = {j.job_id: j for j in parsejson.parse_jobs_json(read(f"scontrol_show_job_{release}.json"))}
    assert sorted(text) == sorted(js) and len(js) == 2
    for job_id, job in js.items():
        assert dataclasses.replace(job, flags=()) == text[job_id]


@pytest.mark.parametrize(
    ("fixture", "version", "enabled"),
    [
        ("show_config_22.05.txt", "22.05.8", False),  # accounting_storage/none
        ("show_config_noaccounting_24.11.txt", "24.11.5", False),  # (null)
        ("show_config_24.11.txt", "24.11.5", True),
        ("show_config_26.05.txt", "26.05.5", True),
    ],
)
def test_accounting_probe_reads_every_release(fixture: str, version: str, enabled: bool) -> None:
    """24.11 prints `AccountingStorageType = (null)` without slurmdbd: read as accounting on, the wrapper
    planned a second resize that 22.05-style Slurm refuses, and the probe lied about the cluster."""
    runner = FakeRunner(version).answer("scontrol", "show", "config", stdout=read(fixture))
    assert SlurmClient(runner).accounting_enabled() is enabled


@pytest.mark.parametrize(
    ("options", "key", "value"),
    [
        ("permit_job_expansion,bf_interval=2,requeue_delay=2", "requeue_delay", "2"),
        ("permit_job_expansion,bf_interval=2", "requeue_delay", None),
        ("enable_expedited_requeue", "enable_expedited_requeue", ""),
        ("requeue_delay_x=5", "requeue_delay", None),
        ("", "requeue_delay", None),
    ],
)
def test_option_value_reads_comma_lists(options: str, key: str, value: str | None) -> None:
    assert parse.option_value(options, key) == value


@pytest.mark.parametrize(
    ("fixture", "version", "delay"),
    [
        ("show_config_requeue_delay_26.05.txt", "26.05.5", 2),  # honoured: the job ran again within 4 s
        ("show_config_requeue_delay_24.11.txt", "24.11.5", None),  # accepted and ignored: still 121 s
        ("show_config_26.05.txt", "26.05.5", None),  # not set: Slurm's default hold
    ],
)
def test_requeue_delay_probe_trusts_only_releases_that_honour_it(fixture: str, version: str, delay: int | None) -> None:
    runner = FakeRunner(version).answer("scontrol", "show", "config", stdout=read(fixture))
    assert SlurmClient(runner).requeue_delay_s() == delay


@pytest.mark.parametrize(
    ("release", "expected"),
    [
        # Recorded from a 2-node devcluster after three `scontrol show job`, one `sinfo` (node and partition
        # info) and the nodes' registrations; sdiag's own request is not listed.
        (
            "22.05",
            {
                "REQUEST_JOB_INFO": (3, 181),
                "REQUEST_NODE_INFO": (2, 302),
                "REQUEST_PARTITION_INFO": (2, 123),
                "MESSAGE_NODE_REGISTRATION_STATUS": (2, 220),
            },
        ),
        (
            "26.05",
            {
                "REQUEST_NODE_INFO": (3, 452),
                "REQUEST_PARTITION_INFO": (3, 129),
                "REQUEST_JOB_INFO": (3, 83),
                "MESSAGE_NODE_REGISTRATION_STATUS": (2, 165),
            },
        ),
    ],
)
def test_sdiag_rpc_counts_by_type_read_alike_on_each_release(
    release: str, expected: dict[str, tuple[int, int]]
) -> None:
    """slurmctld's own count of RPCs by type (its /metrics on 25.11+ has none), without the per-user block."""
    assert parse.parse_rpc_stats(read(f"sdiag_{release}.txt")) == expected
    runner = FakeRunner("26.05.5").answer("sdiag", stdout=read(f"sdiag_{release}.txt"))
    assert SlurmClient(runner).rpc_stats() == expected


def test_sdiag_without_the_rpc_block_reads_as_no_counts() -> None:
    assert parse.parse_rpc_stats("Server thread count:  1\n\nRemote Procedure Call statistics by user\n") == {}
