"""sacct's and squeue's job records (delimited by a delimiter drawn per query, the user-written WorkDir last) and
the --since/--user/--partition arguments of the goodput commands. The hostile records are real: recorded by
tests/fixtures/slurm/record_hostile.sh from a job whose WorkDir holds a newline and a lookalike record of an
earlier job, and whose JobName is ` UserId=nobody(65534) GroupId=nobody(65534)`."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st

from hpresilience.errors import ConfigError, SlurmParseError
from hpresilience.slurm import accounting
from hpresilience.slurm.accounting import finished_jobs, job_record, new_delimiter, parse_records, since_seconds
from hpresilience.slurm.client import SlurmClient
from hpresilience.testing.fakerunner import FakeRunner
from tests.fuzz import fuzz_settings

SLURM = Path(__file__).parent.parent / "fixtures" / "slurm"
RELEASES = ["22.05", "24.11", "26.05"]
D = "|hpr0123456789abcdef|"  # the delimiter record_hostile.sh fixed


def recorded(name: str, release: str) -> str:
    return (SLURM / f"{name}_{release}.txt").read_text()


def line(*fields: str) -> str:
    return D.join(fields) + "\n"


@pytest.mark.parametrize("release", RELEASES)
def test_a_workdir_holding_a_newline_and_a_lookalike_record_forges_no_record(release: str) -> None:
    """Three jobs (the earlier one, the hostile one finished, the hostile one running): three records, the
    earlier job's as Slurm has it, the lookalike text only inside the hostile jobs' WorkDir."""
    records = parse_records(recorded("sacct_delimited", release), D)
    victim, done, running = records
    assert [r.job_id for r in records] == [victim.job_id, victim.job_id + 1, victim.job_id + 2]
    assert (victim.user, victim.partition, victim.state) == ("root", "debug", "COMPLETED")
    assert victim.work_dir.endswith("/victim") and "\n" not in victim.work_dir
    for r in (done, running):
        first, forged = r.work_dir.split("\n")
        assert first.endswith("/h") and forged.startswith(f"{victim.job_id}|nobody|fake|")
        assert (r.user, r.partition) == ("root", "debug")
    assert (done.state, running.state) == ("COMPLETED", "RUNNING")


@pytest.mark.parametrize("release", RELEASES)
def test_squeue_names_the_real_user_whatever_the_job_name_says(release: str) -> None:
    (r,) = parse_records(recorded("squeue_delimited", release), D, "squeue")
    assert (r.user, r.partition, r.state) == ("root", "debug", "RUNNING")
    assert r.work_dir.split("\n")[1].endswith("/fake")


@pytest.mark.parametrize("release", RELEASES)
def test_a_job_name_holding_user_id_text_does_not_change_the_user_of_the_job(
    release: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same job as `scontrol show job -o` prints it has the JobName's ` UserId=nobody(65534)` before the real
    `UserId=root(0)`: the job's record is read from squeue's delimited fields instead."""
    monkeypatch.setattr(accounting, "new_delimiter", lambda: D)
    runner = FakeRunner()
    key_values = recorded("show_job_hostile", release)
    assert key_values.index("UserId=nobody(65534)") < key_values.index("UserId=root(0)")
    runner.answer("scontrol", "show", "job", stdout=key_values)
    runner.answer("squeue", stdout=recorded("squeue_delimited", release))
    job_id = int(key_values.split()[0].removeprefix("JobId="))
    record = job_record(SlurmClient(runner), job_id)
    assert record is not None and (record.job_id, record.user, record.partition) == (job_id, "root", "debug")


def test_an_answer_whose_delimiters_make_no_whole_records_is_refused() -> None:
    good = line("41", "alice", "gpu", "COMPLETED", "2026-11-25T17:26:00", "2026-11-25T17:27:00", "/fsx/a")
    assert [r.job_id for r in parse_records(good * 2, D)] == [41, 41]
    with pytest.raises(SlurmParseError, match="not 6 per record"):
        parse_records(good + good.replace(D, "|", 1), D)
    with pytest.raises(SlurmParseError, match="not 6 per record"):
        parse_records("41|alice|gpu|COMPLETED|x|y|/w\n", D)  # some other delimiter: not what was asked
    assert parse_records("", D) == [] and parse_records("\n", D) == []


def test_a_record_whose_fields_are_not_what_slurm_writes_there_is_skipped_and_logged() -> None:
    text = (
        line("12_3", "bob", "gpu", "COMPLETED", "s", "e", "/w")  # JobID, not JobIDRaw
        + line("13", "bo\tb", "gpu", "COMPLETED", "s", "e", "/w")
        + line("15", "dave\n", "gpu", "COMPLETED", "s", "e", "/w")  # a newline anywhere but in WorkDir
        + line("14", "carol", "cpu", "CANCELLED by 0", "s", "Unknown", "/home/carol\n/with a newline")
    )
    with structlog.testing.capture_logs() as logs:
        records = parse_records(text, D)
    assert [(r.job_id, r.state, r.work_dir) for r in records] == [(14, "CANCELLED", "/home/carol\n/with a newline")]
    assert [e["event"] for e in logs] == ["slurm_record_skipped"] * 3


# A working directory as a hostile user would name it: lookalike records in both field orders, `|`, newlines,
# pieces of a delimiter, and a whole one that is not this query's.
WORK_DIR = st.lists(
    st.one_of(
        st.text(max_size=12),
        st.sampled_from(["\n", "|", "\n9|mallory|gpu|/m|COMPLETED|a|b\n", "\n9|mallory|gpu|RUNNING|a|b|/m", "|hpr"]),
        st.builds(lambda n: f"\n{n}{D}mallory{D}gpu{D}RUNNING{D}a{D}b{D}/m", st.integers(0, 99)),
    ),
    max_size=6,
).map("".join)


@fuzz_settings()
@given(dirs=st.lists(WORK_DIR, min_size=1, max_size=5), delimiter=st.builds(new_delimiter))
def test_whatever_the_working_directories_hold_the_records_are_the_jobs_asked_for(
    dirs: list[str], delimiter: str
) -> None:
    """Any directories (named before the query drew its delimiter): one record per job, in order, each with
    its own directory."""
    text = "".join(
        delimiter.join([str(100 + i), "alice", "gpu", "COMPLETED", "s", "e", d]) + "\n" for i, d in enumerate(dirs)
    )
    records = parse_records(text, delimiter)
    assert [(r.job_id, r.user, r.work_dir) for r in records] == [(100 + i, "alice", d) for i, d in enumerate(dirs)]


def test_each_query_draws_its_own_delimiter() -> None:
    assert len({new_delimiter() for _ in range(100)}) == 100 and all("%" not in new_delimiter() for _ in range(9))


def test_a_job_record_from_squeue_that_is_another_jobs_is_not_taken_for_the_asked_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(accounting, "new_delimiter", lambda: D)
    runner = FakeRunner()
    runner.answer("squeue", stdout=line("8", "mallory", "gpu", "RUNNING", "s", "e", "/m"))
    runner.answer(
        "sacct",
        stdout=line("7", "alice", "gpu", "COMPLETED", "s", "e", "/w")
        + line("8", "mallory", "gpu", "COMPLETED", "s", "e", "/m"),
    )
    record = job_record(SlurmClient(runner), 7)
    assert record is not None and (record.user, record.work_dir) == ("alice", "/w")
    squeue, sacct = runner.commands()[-2:]
    assert f"-o %A{D}%u{D}%P{D}%T{D}%S{D}%e{D}%Z" in squeue and "-t all -j 7" in squeue
    assert f"--delimiter={D}" in sacct and sacct.endswith("-o JobIDRaw,User,Partition,State,Start,End,WorkDir")


def test_a_resized_job_listed_once_per_size_is_one_job_with_its_last_record(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(accounting, "new_delimiter", lambda: D)
    runner = FakeRunner()
    runner.answer(
        "sacct",
        stdout=line("7", "alice", "gpu", "RESIZING", "2026-11-25T17:00:00", "2026-11-25T17:01:00", "/w")
        + line("7", "alice", "gpu", "RESIZING", "2026-11-25T17:01:00", "2026-11-25T17:02:00", "/w")
        + line("7", "alice", "gpu", "COMPLETED", "2026-11-25T17:02:00", "2026-11-25T17:09:00", "/w")
        + line("8", "bob", "gpu", "COMPLETED", "2026-11-25T17:02:00", "2026-11-25T17:05:00", "/v"),
    )
    jobs = finished_jobs(SlurmClient(runner), 3600)
    assert [(j.job_id, j.state) for j in jobs] == [(7, "COMPLETED"), (8, "COMPLETED")]
    assert "-a" in runner.commands()[-1] and "now-3600seconds" in runner.commands()[-1]


@pytest.mark.parametrize(
    ("text", "seconds"), [("7d", 604800), ("12h", 43200), ("30m", 1800), ("2w", 1209600), ("90s", 90)]
)
def test_since_takes_a_number_and_a_unit(text: str, seconds: int) -> None:
    assert since_seconds(text) == seconds


@pytest.mark.parametrize("text", ["7", "d", "-1d", "7 days", "1e3s", ""])
def test_since_rejects_anything_else_naming_the_value(text: str) -> None:
    with pytest.raises(ConfigError, match="--since"):
        since_seconds(text)


def test_a_user_or_partition_that_is_no_slurm_name_is_refused_before_sacct_runs() -> None:
    runner = FakeRunner()
    with pytest.raises(ConfigError, match="--user"):
        finished_jobs(SlurmClient(runner), 60, user="a;b")
    assert not any("sacct" in c for c in runner.commands())
