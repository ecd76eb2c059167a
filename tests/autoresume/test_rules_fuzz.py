"""Fuzz: the rules loader and compiler (`--auto-resume-rules FILE`), then the compiled rules on output.

Rules are shaped on HyperPod's keys with regex-like patterns built from metacharacters (nested
quantifiers included: `(a+)+$` must compile and run in linear time), wrapped in one of the three
document shapes, serialized and sometimes damaged. A file must load or be refused with a ConfigError;
a loaded rule set must then take generated output lines and timer ticks without raising.
Budget: tests/fuzz.py.
"""

from __future__ import annotations

from typing import Any

import yaml
from hypothesis import given
from hypothesis import strategies as st

from hpresilience.autoresume.settings import load_rules_file
from hpresilience.autoresume.watch.lines import LineBuffer
from hpresilience.autoresume.watch.rules import RuleSet
from hpresilience.errors import HPResilienceError
from tests.fuzz import HOSTILE_FLOATS, SCALARS, count, fuzz_settings, json_like, mutate_bytes, scratch_dir

FRAGMENTS = [
    "a",
    "b",
    ".",
    ".*",
    "+",
    "*",
    "?",
    "(",
    ")",
    "(a+)+",
    "[",
    "]",
    "[0-9]",
    "{2}",
    "{1,}",
    "|",
    "\\d",
    "\\",
    "\\1",
    "^",
    "$",
    "(?=x)",
    "(?P<n>",
    "(\\d+)",
    "\\.",
    "loss ",
    "é",
    "{999999}",
    "(?i)",
]
PATTERNS = st.one_of(
    st.lists(st.sampled_from(FRAGMENTS), max_size=8).map("".join),
    st.text(max_size=12),
    st.just(".*\\[Epoch 0 Batch \\d+.*'samples\\/sec': (\\d+(\\.\\d+)?).*"),
)
NUMBERS = st.one_of(st.integers(-3, 10**6), st.floats(allow_nan=True, allow_infinity=True), HOSTILE_FLOATS, SCALARS)
KEYS: dict[str, st.SearchStrategy[Any]] = {
    "name": st.one_of(st.sampled_from(["A", "B", "C"]), st.text(min_size=1, max_size=6), SCALARS),
    "logPattern": st.one_of(PATTERNS, PATTERNS, SCALARS),
    "stopPattern": st.one_of(PATTERNS, SCALARS),
    "expectedStartCutOffInSeconds": NUMBERS,
    "expectedRecurringFrequencyInSeconds": NUMBERS,
    "metricThreshold": NUMBERS,
    "operator": st.one_of(st.sampled_from(["gt", "gteq", "lt", "lteq", "eq"]), SCALARS),
    "metricEvaluationDataPoints": NUMBERS,
    "faultOnMatch": st.one_of(st.booleans(), SCALARS),
    "action": st.one_of(st.sampled_from(["restart", "log"]), SCALARS),
    "bogusKey": SCALARS,
}
KEY_NAMES = sorted(KEYS)


@st.composite
def rule(draw: st.DrawFn) -> dict[str, Any]:
    out: dict[str, Any] = {"name": draw(KEYS["name"]), "logPattern": draw(KEYS["logPattern"])}
    if draw(st.booleans()):  # half the rules check something valid, so that more of them reach the compiler
        out["expectedStartCutOffInSeconds"] = 60
    for _ in range(draw(st.integers(0, 3))):
        key = KEY_NAMES[draw(st.integers(0, len(KEY_NAMES) - 1))]
        out[key] = draw(KEYS[key])
    return out


def _name(r: dict[str, Any]) -> str:
    return repr(r.get("name"))


@st.composite
def rules_files(draw: st.DrawFn) -> bytes:
    rules = draw(st.lists(rule(), max_size=3, unique_by=_name) if draw(st.booleans()) else st.lists(rule(), max_size=3))
    shape = draw(st.integers(0, 7)) % 6  # lists twice as often: the shape most rule files have
    doc: Any = (
        rules
        if shape == 0
        else {"logMonitoringConfiguration": rules}
        if shape == 1
        else {"runPolicy": {"logMonitoringConfiguration": rules, "jobMaxRetryCount": draw(NUMBERS)}}
        if shape == 2
        else {"spec": {"runPolicy": {"logMonitoringConfiguration": rules}}}
        if shape == 3
        else {"runPolicy": draw(json_like(4))}
        if shape == 4
        else draw(json_like(6))
    )
    text = yaml.safe_dump(doc, allow_unicode=draw(st.booleans()))
    data = text.encode("utf-8", "surrogatepass")
    return mutate_bytes(data, draw) if draw(st.booleans()) else data


OUTPUT = st.lists(
    st.one_of(
        st.binary(max_size=60),
        st.sampled_from(
            [b"a" * 40 + b"!\n", b"loss 12.5\n", b"[Epoch 0 Batch 3 'samples/sec': 7.5}\n", b"\r\r\n", b"\xff\xfe\n"]
        ),
    ),
    max_size=6,
)
_DIR = scratch_dir()


@fuzz_settings()
@given(data=rules_files(), output=OUTPUT)
def test_rules_loader_and_compiler_accept_or_refuse_clearly(data: bytes, output: list[bytes]) -> None:
    path = _DIR / "rules.yaml"
    path.write_bytes(data)
    try:
        policy = load_rules_file(path)
        rules = RuleSet(policy.log_monitoring_configuration, strip_task_label=True, max_line_chars=256)
        buf = LineBuffer(256)
        for i, chunk in enumerate(output):
            rules.feed_text(buf.push(chunk), float(i))
            rules.tick(float(i) + 0.5)
        rules.feed_text(buf.flush(), 1e6)
        rules.reset(1e6)
    except HPResilienceError:
        count("rules loader+compiler", "clear_error")
        return
    except Exception:
        count("rules loader+compiler", "crash")
        raise
    count("rules loader+compiler", "accepted")
