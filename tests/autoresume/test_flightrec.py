"""Flight-recorder dumps in the evidence: read without running code, and the ranks behind the wavefront named.

The fixtures are torch's own dumps (CPU build, gloo; tests/autoresume/data/fr/make_fixtures.py wrote them):
ranks 0 and 1 entered a third all_reduce of the default group that rank 2 had not reached."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import pytest

from hpresilience.autoresume.watch.flightrec import read_dumps, safe_load, wavefront

FIXTURES = Path(__file__).parent / "data" / "fr"


def evidence(tmp_path: Path, ranks: tuple[int, ...] = (0, 1, 2)) -> Path:
    d = tmp_path / "attempt-1"
    d.mkdir(mode=0o700)
    for r in ranks:
        shutil.copy(FIXTURES / f"gloo-lagging-rank{r}.pkl", d / f"fr-rank{r}-{1000 + r}.pkl")
    return d


def test_the_rank_that_did_not_reach_the_collective_the_others_wait_in_is_behind(tmp_path: Path) -> None:
    front = wavefront(read_dumps(evidence(tmp_path)), world=[0, 1, 2])
    assert front.dumps == 3 and front.ranks == [2]
    (lag,) = front.behind
    assert (lag.group, lag.seq, lag.wavefront, lag.collective) == ("0", 2, 3, "gloo:all_reduce")
    assert front.groups["0"] == 3  # the sub-group of ranks 0 and 1 (a barrier each) has nobody behind


def test_a_rank_without_a_dump_is_behind_in_the_default_group(tmp_path: Path) -> None:
    front = wavefront(read_dumps(evidence(tmp_path, (0, 1))), world=[0, 1, 2])
    assert front.ranks == [2] and front.behind[0].seq is None


class Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch /tmp/hpr-fr-pwned",))


def test_a_dump_that_names_code_is_refused_and_skipped(tmp_path: Path) -> None:
    with pytest.raises(pickle.UnpicklingError):
        safe_load(pickle.dumps(Evil()))
    d = evidence(tmp_path, (0, 1))
    (d / "fr-rank2-5.pkl").write_bytes(pickle.dumps({"entries": [Evil()]}))
    (d / "fr-dump-rank3").symlink_to(FIXTURES / "gloo-lagging-rank2.pkl")  # a link: not followed
    (d / "fr-dump-rank4").write_bytes(b"not a pickle")
    assert sorted(read_dumps(d)) == [0, 1]
    assert not os.path.exists("/tmp/hpr-fr-pwned")


def test_torchs_own_dump_names_are_read_by_rank(tmp_path: Path) -> None:
    d = tmp_path / "ev"
    d.mkdir()
    shutil.copy(FIXTURES / "gloo-lagging-rank2.pkl", d / "fr-dump-rank2")  # TORCH_*_TEMP_FILE prefix + rank
    assert list(read_dumps(d)) == [2]


def test_the_step_runs_with_the_flight_recorder_dumping_into_its_evidence_dir_unless_the_user_set_it() -> None:
    from hpresilience.autoresume.launch.stepops import flight_recorder_env

    env = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "50"}
    flight_recorder_env(env, "/shared/jobs/7.evidence/attempt-2", 2000)
    assert env == {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "50",
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": "/shared/jobs/7.evidence/attempt-2/fr-dump-rank",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/shared/jobs/7.evidence/attempt-2/fr-dump-rank",
    }
    off: dict[str, str] = {}
    flight_recorder_env(off, "/x", 0)
    assert off == {}
