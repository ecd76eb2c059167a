"""Which systemctl commands an install runs: enable and start always; restart only what was replaced."""

from __future__ import annotations

from hpresilience.install.installer import systemd_plan

U = "hpresilience-agent.service"


def test_first_install_reloads_and_enables() -> None:
    assert systemd_plan([U], {U}, True, True, active=set()) == [
        ["systemctl", "daemon-reload"],
        ["systemctl", "enable", "--now", U],
    ]


def test_nothing_replaced_means_no_restart() -> None:
    assert systemd_plan([U], set(), False, False, active={U}) == [["systemctl", "enable", "--now", U]]


def test_an_upgrade_restarts_the_running_daemon() -> None:
    """A new package, unit file or config: the running process still has the old one."""
    for changed_units, pkg, cfg in [(set(), True, False), ({U}, False, False), (set(), False, True)]:
        plan = systemd_plan([U], changed_units, pkg, cfg, active={U})
        assert plan[-1] == ["systemctl", "restart", U]
