"""The srun shim (slurm/srun), run with sh against fake srun and hpresilience scripts in a tmp dir."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SHIM = Path(__file__).resolve().parents[2] / "slurm" / "srun"

# Prints its pid, name and arguments as NUL-ended records, so tests see exec (same pid) and exact words.
FAKE = """#!/bin/sh
printf 'pid=%s\\0who={who}\\0real=%s\\0' "$$" "${{HPRESILIENCE_REAL_SRUN:-}}"
for a in "$@"; do printf 'arg=%s\\0' "$a"; done
exit {rc}
"""


def fake(path: Path, who: str, rc: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(FAKE.format(who=who, rc=rc))
    path.chmod(0o755)
    return path


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    shim_dir = tmp_path / "shim"
    shim_dir.mkdir()
    (shim_dir / "srun").write_bytes(SHIM.read_bytes())
    (shim_dir / "srun").chmod(0o755)
    fake(tmp_path / "slurm" / "srun", "real")
    fake(tmp_path / "hpbin" / "hpresilience", "hp")
    return tmp_path


def run(
    tree: Path, *args: str, path: list[str] | None = None, env: dict[str, str] | None = None, shim: Path | None = None
) -> tuple[int, dict[str, list[str]], str, int]:
    dirs = path if path is not None else [str(tree / "shim"), str(tree / "slurm"), str(tree / "hpbin")]
    # Only our directories: the shim and the fakes use shell builtins alone, and a real srun may be installed.
    e = {"PATH": ":".join(dirs), **(env or {})}
    exe = str(shim or tree / "shim" / "srun")
    p = subprocess.Popen([exe, *args], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=20)
    parsed: dict[str, list[str]] = {"arg": []}
    for record in out.split("\0")[:-1]:
        k, _, v = record.partition("=")
        parsed.setdefault(k, []).append(v)
    return p.returncode, parsed, err, p.pid


def test_without_auto_resume_execs_real_srun_with_arguments_untouched(tree: Path) -> None:
    words = ["-N2", "--ntasks-per-node", "8", "train.sh", "a b", "", "*", "$HOME", "line\nbreak", "--auto-resume=1"]
    rc, out, _, pid = run(tree, *words)
    assert rc == 0 and out["who"] == ["real"] and out["arg"] == words
    assert out["pid"] == [str(pid)]  # exec, not a child: signals and exit codes go straight to srun
    assert out["real"] == [""]  # nothing exported on the plain path


def test_real_srun_exit_code_is_passed_through(tree: Path) -> None:
    fake(tree / "slurm" / "srun", "real", rc=7)
    assert run(tree, "-N1", "true")[0] == 7


@pytest.mark.parametrize("flag", [["--auto-resume=1"], ["--auto-resume", "1"], ["--auto-resume=01"]])
def test_auto_resume_hands_over_to_the_wrapper(tree: Path, flag: list[str]) -> None:
    rc, out, _, pid = run(tree, "-N", "2", *flag, "--nodelist", "n[1-2]", "train.sh", "--lr", "3")
    assert rc == 0 and out["who"] == ["hp"] and out["pid"] == [str(pid)]
    assert out["arg"] == ["srun", "--", "-N", "2", "--nodelist", "n[1-2]", "train.sh", "--lr", "3"]
    assert out["real"] == [str(tree / "slurm" / "srun")]


@pytest.mark.parametrize("flag", [["--auto-resume=0"], ["--auto-resume", "0"], ["--auto-resume=000"]])
def test_auto_resume_zero_is_plain_srun_without_the_option(tree: Path, flag: list[str]) -> None:
    rc, out, _, _ = run(tree, *flag, "-N2", "train.sh")
    assert rc == 0 and out["who"] == ["real"] and out["arg"] == ["-N2", "train.sh"]


@pytest.mark.parametrize(
    "args",
    [
        ["-N2", "train.sh", "--auto-resume=1"],  # the flag belongs to train.sh
        ["-N", "2", "train.sh", "--auto-resume", "1"],
        ["--", "--auto-resume=1", "x"],  # after `--` nothing is srun's
        ["-n", "--auto-resume=1", "x"],  # the value of -n, however odd
    ],
)
def test_flag_after_the_command_is_the_commands(tree: Path, args: list[str]) -> None:
    rc, out, _, _ = run(tree, *args)
    assert rc == 0 and out["who"] == ["real"] and out["arg"] == args


@pytest.mark.parametrize(
    "args",
    [
        ["-lN", "2", "--auto-resume=1", "x"],  # a cluster ending in an option that takes the next word
        ["-N2", "-l", "--auto-resume=1", "x"],
        ["--nodel", "n1", "--auto-resume=1", "x"],  # getopt_long accepts unique prefixes
        ["--export=ALL", "-K", "--jobid", "5", "--auto-resume=1", "x"],
    ],
)
def test_options_and_their_values_are_skipped_while_scanning(tree: Path, args: list[str]) -> None:
    rc, out, _, _ = run(tree, *args)
    assert rc == 0 and out["who"] == ["hp"]
    assert out["arg"] == ["srun", "--", *[a for a in args if a != "--auto-resume=1"]]


def test_wrapper_options_go_before_the_separator_in_order(tree: Path) -> None:
    _, out, _, _ = run(
        tree,
        "--auto-resume-rules",
        "it's r.yaml",
        "--auto-resume=1",
        "-N2",
        "--auto-resume-grow",
        "--auto-resume-spares=1",
        "--pre-train-script",
        "/p.sh",
        "x",
        "--auto-resume-spares",
        "3",
    )
    assert out["arg"] == [
        "srun",
        "--auto-resume-rules",
        "it's r.yaml",
        "--auto-resume-grow",
        "--auto-resume-spares=1",
        "--pre-train-script",
        "/p.sh",
        "--",
        "-N2",
        "x",
        "--auto-resume-spares",
        "3",
    ]


def test_wrapper_options_without_auto_resume_are_dropped_with_a_warning(tree: Path) -> None:
    _, out, err, _ = run(tree, "--auto-resume-rules=r.yaml", "--auto-resume-spares", "2", "-N2", "x")
    assert out["who"] == ["real"] and out["arg"] == ["-N2", "x"]
    assert "ignored without --auto-resume=1: --auto-resume-rules --auto-resume-spares" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--auto-resume=yes", "x"], "invalid --auto-resume value 'yes'"),
        (["-N2", "--auto-resume"], "requires a value"),
        (["--auto-resume=1", "--auto-resume-rules"], "option '--auto-resume-rules' requires a value"),
    ],
)
def test_bad_auto_resume_usage_exits_2_with_a_message(tree: Path, args: list[str], message: str) -> None:
    rc, out, err, _ = run(tree, *args)
    assert rc == 2 and message in err and "who" not in out


def test_real_srun_is_the_next_one_after_the_shims_directory(tree: Path) -> None:
    fake(tree / "before" / "srun", "before")  # e.g. another copy of the shim earlier on PATH
    dirs = [str(tree / "before"), str(tree / "shim"), str(tree / "slurm"), str(tree / "hpbin")]
    _, out, _, _ = run(tree, "-N1", "x", path=dirs)
    assert out["who"] == ["real"]


def test_shim_called_by_a_path_not_on_path_uses_the_first_srun(tree: Path) -> None:
    dirs = [str(tree / "slurm"), str(tree / "hpbin")]
    _, out, _, _ = run(tree, "x", path=dirs)
    assert out["who"] == ["real"]


def test_shim_never_finds_itself_through_a_symlinked_directory(tree: Path) -> None:
    (tree / "alias").symlink_to(tree / "shim")
    dirs = [str(tree / "alias"), str(tree / "slurm")]
    _, out, _, _ = run(tree, "x", path=dirs, shim=tree / "shim" / "srun")
    assert out["who"] == ["real"]


def test_environment_overrides_choose_real_srun_and_wrapper(tree: Path) -> None:
    other = fake(tree / "elsewhere" / "srun-22.05", "override")
    hp = fake(tree / "venv" / "bin" / "hpresilience", "hp-venv")
    _, out, _, _ = run(tree, "x", env={"HPRESILIENCE_REAL_SRUN": str(other)})
    assert out["who"] == ["override"]
    _, out, _, _ = run(
        tree, "--auto-resume=1", "x", env={"HPRESILIENCE_REAL_SRUN": str(other), "HPRESILIENCE_BIN": str(hp)}
    )
    assert out["who"] == ["hp-venv"] and out["real"] == [str(other)]


def test_no_real_srun_is_a_clear_error(tree: Path) -> None:
    rc, out, err, _ = run(tree, "x", path=[str(tree / "shim")])
    assert rc == 127 and "no real srun found" in err and "who" not in out


def test_shim_is_posix_sh_and_executable() -> None:
    assert os.access(SHIM, os.X_OK)
    assert SHIM.read_text().startswith("#!/bin/sh\n")
    assert subprocess.run(["sh", "-n", str(SHIM)], check=False).returncode == 0


def test_shim_and_wrapper_agree_on_which_srun_options_take_a_value() -> None:
    """The shim (sh) and the wrapper (Python) each split srun options from the command; the same lists."""
    import re

    from hpresilience.autoresume.launch.srunargs import LONG_WITH_VALUE, SHORT_WITH_VALUE

    text = (Path(__file__).resolve().parents[2] / "slurm" / "srun").read_text()
    short = re.search(r"^short_val=(\S+)$", text, re.M)
    long = re.search(r'^long_val="([^"]*)"', text, re.M)
    assert short is not None and long is not None
    assert set(short.group(1)) == set(SHORT_WITH_VALUE)
    assert set(long.group(1).split()) == set(LONG_WITH_VALUE)
