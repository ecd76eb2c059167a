"""Hostlist expressions round-trip the way Slurm writes them."""

from __future__ import annotations

import pytest

from hpresilience.errors import SlurmParseError
from hpresilience.slurm.hostlist import compress, expand


@pytest.mark.parametrize("expr,names", [
    ("n[1-3]", ["n1", "n2", "n3"]), ("n[1,3],gpu[01-02]", ["n1", "n3", "gpu01", "gpu02"]),
    ("", []), ("(null)", []), ("n7", ["n7"]),
])
def test_expand(expr: str, names: list[str]) -> None:
    assert expand(expr) == names


def test_compress_is_sorted_and_compact() -> None:
    assert compress(["n3", "n1", "n2", "n7"]) == "n[1-3,7]"
    assert compress([]) == ""
    assert expand(compress(["ip-10-0-0-1", "ip-10-0-0-2"])) == ["ip-10-0-0-1", "ip-10-0-0-2"]


def test_malformed_expression_names_it() -> None:
    with pytest.raises(SlurmParseError, match=r"n\[1-"):
        expand("n[1-")
