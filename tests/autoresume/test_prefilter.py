"""Required-literal prefilter: the literal it returns is in every line the pattern matches."""

from __future__ import annotations

import random
import re

import pytest

from hpresilience.autoresume.watch.prefilter import required_literal


@pytest.mark.parametrize(
    ("pattern", "literal"),
    [
        (".*Experiment configuration.*", "Experiment configuration"),
        (r".*\[Epoch 0 Batch \d+.*'training_loss_step': (\d+(\.\d+)?).*", "'training_loss_step': "),
        (r".*'samples\/sec': (\d+(\.\d+)?).*", "'samples/sec': "),
        ("ab(cd)ef", "abcdef"),  # a group continues the run around it
        ("(?:xyz)+q", "xyz"),  # a repeat of at least one keeps its own literal
        ("^Saving data*", "Saving dat"),  # the starred last letter is optional
        ("a|bcd", ""),  # neither branch is required
        ("(?i).*NCCL error", ""),  # case-insensitive: no literal can be trusted
        ("x(?i:abcdef)y", "x"),
        ("(", ""),  # invalid: no prefilter, never an exception
    ],
)
def test_literal_extraction(pattern: str, literal: str) -> None:
    assert required_literal(pattern) == literal


def test_literal_is_in_every_matching_line() -> None:
    rnd = random.Random(7)
    atoms = ["a", "b", "ab", "(ab)", "(?:ba)+", "a*", "b?", "[ab]", ".", "(a|b)", r"\d", "c{2}", "(?i:A)"]
    for _ in range(300):
        pattern = "".join(rnd.choice(atoms) for _ in range(rnd.randint(1, 6)))
        lit = required_literal(pattern)
        rx = re.compile(pattern)
        for _ in range(40):
            line = "".join(rnd.choice("abAc1") for _ in range(rnd.randint(0, 10)))
            if rx.match(line):
                assert lit in line, (pattern, lit, line)
