"""Fuzz: every parser of Slurm output (hpresilience/slurm/parse.py, parsejson.py, hostlist.py) on generated text.

JSON documents are shaped on both dialects' node and job records (real keys; values of the right kind,
the v0.0.40+ number struct, or hostile ones: NaN, Infinity, 5000-digit numbers, deep nesting), then
sometimes damaged as text. A parser returns its models (odd records skipped and logged) or raises
SlurmParseError; any other exception fails the test. Budget: tests/fuzz.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from hpresilience.errors import HPResilienceError
from hpresilience.slurm import parse, parsejson
from hpresilience.slurm.hostlist import expand
from tests.fuzz import HOSTILE_FLOATS, SCALARS, count, fuzz_settings, json_like

NUMBER = st.one_of(
    st.integers(-1, 2**40),
    HOSTILE_FLOATS,
    st.sampled_from(["12", "²", "9" * 5000, "-1", ""]),
    st.fixed_dictionaries(
        {},
        optional={
            "set": st.one_of(st.booleans(), SCALARS),
            "infinite": st.one_of(st.booleans(), SCALARS),
            "number": st.one_of(st.integers(), HOSTILE_FLOATS, SCALARS),
        },
    ),
    SCALARS,
)
WORDS = st.one_of(st.text(max_size=20), st.lists(st.one_of(st.text(max_size=8), SCALARS), max_size=3), SCALARS)
HOSTLIST = st.one_of(
    st.sampled_from(["n1", "n[1-3]", "n[1-", "n[3-1]", "(null)", "a,b", "n[1-99999999]", ""]),
    st.text(alphabet="n[]-,0123456789", max_size=12),
    SCALARS,
)
STATE = st.one_of(
    st.sampled_from(["idle", "allocated", "IDLE+DRAIN", "down*"]),
    st.lists(st.sampled_from(["IDLE", "DRAIN", "FAIL", "MIXED"]), max_size=3),
    WORDS,
)
NODE_KEYS: dict[str, st.SearchStrategy[Any]] = {
    "name": st.one_of(st.sampled_from(["n1", "n2", "-oProxyCommand=x"]), st.text(max_size=8), SCALARS),
    "address": st.one_of(st.text(max_size=10), SCALARS),
    "hostname": st.one_of(st.text(max_size=10), SCALARS),
    "state": STATE,
    "state_flags": WORDS,
    "reason": st.one_of(st.text(max_size=30), SCALARS),
    "reason_set_by_user": SCALARS,
    "reason_changed_at": NUMBER,
    "features": WORDS,
    "gres": SCALARS,
    "partitions": WORDS,
    "cpus": NUMBER,
    "slurmd_start_time": NUMBER,
    "boot_time": NUMBER,
}
JOB_KEYS: dict[str, st.SearchStrategy[Any]] = {
    "job_id": NUMBER,
    "name": st.one_of(st.text(max_size=8), SCALARS),
    "job_state": STATE,
    "nodes": HOSTLIST,
    "node_count": NUMBER,
    "user_name": SCALARS,
    "partition": SCALARS,
    "batch_host": SCALARS,
    "restart_cnt": NUMBER,
    "state_reason": SCALARS,
    "dependency": SCALARS,
    "excluded_nodes": HOSTLIST,
    "flags": WORDS,
}


@st.composite
def record(draw: st.DrawFn, keys: dict[str, st.SearchStrategy[Any]], required: str) -> Any:
    if draw(st.integers(0, 9)) == 0:
        return draw(json_like(4))  # not even an object
    names = sorted(keys)
    out = {required: draw(keys[required])}
    for _ in range(draw(st.integers(0, 6))):
        key = names[draw(st.integers(0, len(names) - 1))]
        out[key] = draw(keys[key])
    return out


@st.composite
def document(draw: st.DrawFn, key: str, keys: dict[str, st.SearchStrategy[Any]], required: str) -> tuple[str, int]:
    """(text, how many records it holds when it parses as intended)."""
    records = draw(st.lists(record(keys, required), max_size=4))
    doc: Any = {key: records}
    if draw(st.integers(0, 4)) == 0:
        doc["errors"] = draw(st.one_of(st.lists(json_like(3), max_size=2), json_like(3)))
    if draw(st.integers(0, 9)) == 0:
        doc = draw(json_like(6))
    text = json.dumps(doc, allow_nan=True)
    kind = draw(st.integers(0, 9))
    if kind == 0:
        text = text[: draw(st.integers(0, len(text)))]
    elif kind == 1:
        depth = draw(st.sampled_from([50, 1000, 100_000]))
        text = text[:-1] + ', "deep": ' + "[" * depth + "]" * depth + "}" if text.endswith("}") else text
    return text, len(records)


def _run(target: str, fn: Callable[[], Any], expected_records: int | None = None) -> None:
    try:
        out = fn()
    except HPResilienceError:
        count(target, "clear_error")
        return
    except Exception:
        count(target, "crash")
        raise
    count(target, "accepted")
    if expected_records is not None and isinstance(out, list):
        count(target, "skipped", max(0, expected_records - len(out)))


@fuzz_settings()
@given(doc=document("nodes", NODE_KEYS, "name"))
def test_parse_nodes_json(doc: tuple[str, int]) -> None:
    _run("slurm parse_nodes_json", lambda: parsejson.parse_nodes_json(doc[0]), doc[1])


@fuzz_settings()
@given(doc=document("jobs", JOB_KEYS, "job_id"))
def test_parse_jobs_json(doc: tuple[str, int]) -> None:
    _run("slurm parse_jobs_json", lambda: parsejson.parse_jobs_json(doc[0]), doc[1])


TEXT = st.one_of(
    st.text(max_size=80),
    st.binary(max_size=80).map(lambda b: b.decode("utf-8", "replace")),
    st.sampled_from(
        [
            "slurm 22.05.8",
            "slurm-wlm 2².05.8",
            "Submitted batch job 12",
            "Granted job allocation " + "9" * 5000,
            "12;cluster",
            "²;x",
            "JobId=1 JobName=a b UserId=x(1) Nodes=n[1-2]",
            "SlurmctldPort = 6817",
            "A=" + "x " * 2000,
            "12.0|train|n[1-2]\n12.1|x|n[1-",
            "1.2||²",
        ]
    ),
)


@fuzz_settings()
@given(text=TEXT)
def test_text_parsers(text: str) -> None:
    _run("slurm parse_version", lambda: parse.parse_version(text))
    _run("slurm parse_job_id", lambda: parse.parse_job_id(text))
    _run("slurm parse_key_values", lambda: parse.parse_key_values(text))
    _run("slurm parse_oneliner", lambda: parse.parse_oneliner(text))
    _run("slurm parse_step_lines", lambda: parse.parse_step_lines(text))
    _run("slurm parse_step_lines", lambda: parse.parse_step_lines(text.replace(" ", "|")))


@fuzz_settings()
@given(expr=HOSTLIST, value=NUMBER)
def test_hostlist_and_numbers(expr: Any, value: Any) -> None:
    _run("slurm hostlist.expand", lambda: expand(expr if isinstance(expr, str) else str(expr)))
    _run("slurm number", lambda: parsejson.number(value))
