"""The suite's own helper: a deterministic result computed once per run and shared by the xdist workers."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest

from tests.conftest import SHARED_RESULTS_ENV, shared_result


def _count_and_answer(calls: Path, takes_s: float = 0.0) -> dict[str, int]:
    with open(calls, "a") as f:
        f.write("x")
    time.sleep(takes_s)  # the others ask while it computes
    return {"answer": 42}


def _ask(calls: str, root: str, out: multiprocessing.Queue[object]) -> None:
    import os

    os.environ[SHARED_RESULTS_ENV] = root
    out.put(shared_result("answer", lambda: _count_and_answer(Path(calls), 0.5)))


def test_a_shared_result_is_computed_once_by_the_first_of_several_processes_and_read_by_the_others(
    tmp_path: Path,
) -> None:
    calls = tmp_path / "calls"
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue[object] = ctx.Queue()
    procs = [ctx.Process(target=_ask, args=(str(calls), str(tmp_path / "shared"), out)) for _ in range(3)]
    for p in procs:
        p.start()
    got = [out.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(30)
    assert got == [{"answer": 42}] * 3
    assert calls.read_text() == "x"


def test_without_a_shared_folder_a_result_is_computed_once_in_this_process_and_each_caller_gets_a_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SHARED_RESULTS_ENV, raising=False)
    calls = tmp_path / "calls"
    name = f"answer-{tmp_path.name}"
    first = shared_result(name, lambda: _count_and_answer(calls))
    first["answer"] = 0
    assert shared_result(name, lambda: _count_and_answer(calls)) == {"answer": 42}
    assert calls.read_text() == "x"
