"""A new site starts observing: the config `install` writes sets agent.mode observe unless --enforce."""

from __future__ import annotations

from pathlib import Path

from hpresilience.config import load_config
from hpresilience.health.base import Mode
from hpresilience.install.installer import lay_out
from hpresilience.install.layout import Layout


def test_a_new_site_gets_an_observing_agent_and_enforce_only_when_asked(tmp_path: Path) -> None:
    observe = Layout(tmp_path / "a")
    rep = lay_out(observe, "compute", config=None, package_changed=False, use_systemd=False, slurm_conf=None)
    assert rep.agent_mode == "observe" and load_config(observe.config).agent.mode is Mode.OBSERVE
    enforce = Layout(tmp_path / "b")
    rep = lay_out(
        enforce, "compute", config=None, package_changed=False, use_systemd=False, slurm_conf=None, enforce=True
    )
    assert rep.agent_mode == "enforce" and load_config(enforce.config).agent.mode is Mode.ENFORCE


def test_a_second_install_keeps_the_sites_choice_and_says_so_for_enforce(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    lay_out(layout, "compute", config=None, package_changed=False, use_systemd=False, slurm_conf=None)
    rep = lay_out(
        layout, "compute", config=None, package_changed=False, use_systemd=False, slurm_conf=None, enforce=True
    )
    assert load_config(layout.config).agent.mode is Mode.OBSERVE and rep.agent_mode == "observe"
    assert any("--enforce applies to a new site" in n for n in rep.notes)


def test_a_given_config_without_a_mode_is_installed_with_a_note(tmp_path: Path) -> None:
    given = tmp_path / "site.yaml"
    given.write_text("agent:\n  required_repeats: 3\n")
    rep = lay_out(
        Layout(tmp_path / "root"),
        "compute",
        config=str(given),
        package_changed=False,
        use_systemd=False,
        slurm_conf=None,
    )
    assert rep.agent_mode == "enforce" and any("does not set agent.mode" in n for n in rep.notes)
