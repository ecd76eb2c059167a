"""Hostlist expressions round-trip the way Slurm writes them."""

from __future__ import annotations

import pytest

from hpresilience.errors import SlurmParseError
from hpresilience.slurm.hostlist import compress, expand


@pytest.mark.parametrize(
    "expr,names",
    [
        ("n[1-3]", ["n1", "n2", "n3"]),
        ("n[1,3],gpu[01-02]", ["n1", "n3", "gpu01", "gpu02"]),
        ("", []),
        ("(null)", []),
        ("n7", ["n7"]),
    ],
)
def test_expand(expr: str, names: list[str]) -> None:
    assert expand(expr) == names


def test_compress_is_sorted_and_compact() -> None:
    assert compress(["n3", "n1", "n2", "n7"]) == "n[1-3,7]"
    assert compress([]) == ""
    assert expand(compress(["ip-10-0-0-1", "ip-10-0-0-2"])) == ["ip-10-0-0-1", "ip-10-0-0-2"]


def test_malformed_expression_names_it() -> None:
    with pytest.raises(SlurmParseError, match=r"n\[1-"):
        expand("n[1-")


def test_compress_ranges_only_trailing_numbers_that_every_slurm_accepts() -> None:
    """Slurm 22.05-23.02.4 reject `node[1-2]-ib` ("Invalid hostlist"): such names are listed, not ranged."""
    assert compress(["node1-ib", "node2-ib"]) == "node1-ib,node2-ib"
    assert compress(["gpu-st-p5-2", "n10", "n1", "gpu-st-p5-1", "n2"]) == "gpu-st-p5-[1-2],n[1-2,10]"
    assert compress(["a1-b1", "a1-b2"]) == "a1-b[1-2]"
    names = ["node1-ib", "node2-ib", "n1", "head"]
    assert sorted(expand(compress(names))) == sorted(names)


@pytest.mark.parametrize("bad", ["n[1", "a,b", "", "n 1"])
def test_compress_of_a_bad_name_raises_the_package_error(bad: str) -> None:
    with pytest.raises(SlurmParseError):
        compress([bad, "n2"])


def test_expand_drops_spaces_as_scontrol_does() -> None:
    assert expand(" n1 , n2 ") == ["n1", "n2"]
