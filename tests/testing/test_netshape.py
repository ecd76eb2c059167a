"""A node's link rate: rates parsed as tc reads them, and the tbf command on both ends of the node's link."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from hpresilience.cli import cli
from hpresilience.errors import ConfigError
from hpresilience.testing import netshape


def test_rates_read_in_tcs_si_units_and_zero_means_remove() -> None:
    assert netshape.parse_rate("1mbit") == 1_000_000
    assert netshape.parse_rate("500kbit") == 500_000
    assert netshape.parse_rate(" 2.5Gbit ") == 2_500_000_000
    assert netshape.parse_rate("64000") == 64_000
    assert netshape.parse_rate("0") == 0


@pytest.mark.parametrize("bad", ["fast", "1mb", "-1mbit", "1 mbit", "", "1kbit", "200gbit"])
def test_a_rate_tc_would_misread_or_that_cuts_the_link_is_refused(bad: str) -> None:
    with pytest.raises(ConfigError, match="--rate"):
        netshape.parse_rate(bad)


def test_tbf_caps_the_device_with_a_burst_of_at_least_a_frame_and_ten_ms_of_the_rate() -> None:
    assert netshape.tbf_argv("hpr1-n1", "eth0", 1_000_000) == [
        "tc", "-n", "hpr1-n1", "qdisc", "replace", "dev", "eth0", "root",
        "tbf", "rate", "1000000bit", "burst", "4000", "latency", "400ms",
    ]  # fmt: skip
    assert netshape.burst_bytes(10_000_000_000) == 12_500_000  # 10 ms of 10gbit
    assert netshape.clear_argv("hpr1-ctl", "vn1") == ["tc", "-n", "hpr1-ctl", "qdisc", "del", "dev", "vn1", "root"]


def test_both_ends_of_the_nodes_link_are_shaped_its_bridge_port_and_its_own_eth0() -> None:
    assert netshape.ends(27100, "n3") == [("hpr27100-ctl", "vn3"), ("hpr27100-n3", "eth0")]


def test_removing_a_cap_that_is_not_there_is_not_an_error() -> None:
    assert netshape.already_clear("Error: Cannot delete qdisc with handle of zero.")
    assert not netshape.already_clear("Error: Specified qdisc kind is unknown.")


def test_slow_without_a_how_and_a_bad_rate_or_cpu_are_refused_before_any_cluster_is_touched(tmp_path: Path) -> None:
    where = ["--state-dir", str(tmp_path / "none")]
    res = CliRunner().invoke(cli, ["devcluster", "slow", "n1", *where])
    assert res.exit_code == 2 and "--delay-ms N, --rate R or --cpu FRACTION" in res.output
    res = CliRunner().invoke(cli, ["devcluster", "slow", "n1", "--rate", "fast", *where])
    assert res.exit_code != 0 and "is not a rate" in str(res.exception or res.output)
    res = CliRunner().invoke(cli, ["devcluster", "slow", "n1", "--cpu", "0", *where])
    assert res.exit_code != 0 and "--cpu must be a fraction" in str(res.exception or res.output)
    assert not (tmp_path / "none").exists()
