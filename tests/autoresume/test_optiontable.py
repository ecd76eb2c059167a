"""The wrapper's option table: each row is a click option, is found among srun's options, and reaches its
settings field or options keyword."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hpresilience.autoresume.launch.srunargs import parse_srun_args
from hpresilience.autoresume.options import WrapperOptions, options_from, resolve
from hpresilience.autoresume.optiontable import SRUN_OPTIONS, Kind, SrunOption, Target, merge_scanned, scan_names
from hpresilience.autoresume.settings import AutoResumeSettings
from hpresilience.commands.srun import scanned_value, srun
from hpresilience.errors import ConfigError

ENV = {"SLURM_JOB_ID": "7"}


def _words(option: SrunOption, value: str) -> list[str]:
    """The option on a command line: a flag by its `off` spelling (the value that differs from the default)."""
    if option.kind is Kind.FLAG:
        return [f"--{option.off}"]
    return [f"{option.spelled}={value}"]


def _example(option: SrunOption, tmp_path: Path) -> str:
    if option.kind is Kind.FILE:
        rules = tmp_path / option.example
        rules.write_text("- {name: table, logPattern: 'step (\\d+)', expectedRecurringFrequencyInSeconds: 60}\n")
        return str(rules)
    return option.example


def _parsed_by_click(words: list[str]) -> dict[str, Any]:
    ctx = srun.make_context("srun", [*words, "train.sh"])
    return dict(ctx.params)


def _resolve(given: dict[str, Any], tmp_path: Path) -> WrapperOptions:
    settings = AutoResumeSettings(state_dir=str(tmp_path / "state"))
    return resolve(settings, parse_srun_args(["train.sh"]), given, "/usr/bin/srun", ENV)


@pytest.mark.parametrize("option", SRUN_OPTIONS, ids=lambda o: o.name)
def test_every_option_is_a_click_option_found_by_the_scan_and_mapped_where_it_acts(
    option: SrunOption, tmp_path: Path
) -> None:
    value = _example(option, tmp_path)
    words = _words(option, value)
    before = _parsed_by_click(words)
    defaults = _parsed_by_click([])
    assert before[option.dest] is not None and before[option.dest] != defaults[option.dest]
    values, flags = scan_names()
    scanned = parse_srun_args(["-N2", *words, "train.sh"], values, flags)
    assert scanned.command == ["train.sh"] and scanned.nodes == 2 and scanned.passthrough == []
    with srun.make_context("srun", ["train.sh"]) as ctx:
        found = merge_scanned(ctx.params, scanned.own, scanned_value)
    assert found[option.dest] == before[option.dest]
    if option.target is Target.COMMAND:
        return
    opts = _resolve(before, tmp_path)
    if option.target is Target.SETTINGS:
        assert option.field is not None
        assert getattr(opts.watch, option.field) == before[option.dest]
        assert getattr(_resolve(defaults, tmp_path).watch, option.field) != before[option.dest]
    else:
        assert option.field is not None
        assert str(getattr(opts, option.field)) == value


def test_table_names_are_unique_and_settings_rows_name_real_fields() -> None:
    names = [n for o in SRUN_OPTIONS for n in (o.name, o.off) if n]
    assert len(names) == len(set(names))
    assert len({o.dest for o in SRUN_OPTIONS}) == len(SRUN_OPTIONS)
    for option in SRUN_OPTIONS:
        if option.target is Target.SETTINGS:
            assert option.field in AutoResumeSettings.model_fields, option.name
        elif option.target is Target.KEYWORD:
            assert option.field in inspect.signature(options_from).parameters, option.name
        else:
            assert option.field is None, option.name
        assert (option.kind is Kind.FLAG) == (option.off is not None), option.name


def test_rules_file_replaces_the_log_rules(tmp_path: Path) -> None:
    option = next(o for o in SRUN_OPTIONS if o.dest == "rules")
    opts = _resolve(_parsed_by_click(_words(option, _example(option, tmp_path))), tmp_path)
    assert [r.name for r in opts.run_policy.log_monitoring_configuration] == ["table"]


def test_a_value_given_before_srun_options_wins_over_one_among_them() -> None:
    values, flags = scan_names()
    scanned = parse_srun_args(["--auto-resume-spares=3", "--auto-resume=0", "--auto-resume-grow", "x"], values, flags)
    merged = merge_scanned({"spares": 1, "auto_resume": "1", "grow": False}, scanned.own)
    # --auto-resume's default "1" does not count as given: the one among srun's options applies.
    assert (merged["spares"], merged["auto_resume"], merged["grow"]) == (1, "0", False)


def test_a_settings_option_out_of_range_names_the_option_not_the_key() -> None:
    with pytest.raises(ConfigError, match=r"^--auto-resume-poll-interval: "):
        resolve(AutoResumeSettings(), parse_srun_args(["x"]), {"poll_interval": float("nan")}, "/usr/bin/srun", ENV)


def test_the_shim_hands_every_table_option_to_the_wrapper_and_knows_which_take_no_value() -> None:
    """slurm/srun moves the wrapper's options before `--`: it must see each row's spellings, and a flag taken
    for an option with a value would swallow the user's next word."""
    shim = (Path(__file__).resolve().parents[2] / "slurm" / "srun").read_text()
    values, flags = scan_names()
    for name in values:
        assert name.startswith("auto-resume") or f"--{name}=*" in shim, name
    flag_case = next(line for line in shim.splitlines() if "--auto-resume-*=*" in line and "|" in line)
    spelled = {w.strip().lstrip("-") for w in flag_case.split("|") if w.strip().startswith("--") and "*" not in w}
    assert spelled == set(flags)


def test_a_value_among_srun_options_gets_the_same_check_as_one_given_before_them() -> None:
    """Before the table, `srun -N2 --auto-resume-spares=-1 cmd` took -1 unchecked (the scan passed raw text)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(SLURM_JOB_ID="12", HPRESILIENCE_REAL_SRUN="/bin/false")
    for args in (["--auto-resume-spares=-1", "-N2", "true"], ["-N2", "--auto-resume-spares=-1", "true"]):
        res = subprocess.run(
            [sys.executable, "-m", "hpresilience", "srun", *args], capture_output=True, text=True, timeout=60, env=env
        )
        assert res.returncode == 2 and "Invalid value for '--auto-resume-spares': -1 is not in the range x>=0" in (
            res.stderr
        ), res.stderr
