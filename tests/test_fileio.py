"""read_yaml on hostile files (issue 14): every one is a single ConfigError naming the file, never a
traceback, a hang or an unbounded expansion; `config show` exits 2 with one line for each."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from hpresilience.errors import ConfigError
from hpresilience.fileio import MAX_YAML_BYTES, MAX_YAML_DEPTH, MAX_YAML_VALUES, read_json_state, read_yaml

# 514 bytes of YAML that expand to 9**9 strings when dumped (what `config show` did for minutes).
ALIAS_BOMB = """health:
  checks:
    bomb:
      a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
      b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
      c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
      d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
      e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
      f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
      g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
      h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
      i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def config_show(path: Path | str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpresilience", "--config", str(path), "config", "show"],
        capture_output=True,
        text=True,
        timeout=60,
    )


def assert_one_line_exit_2(res: subprocess.CompletedProcess[str], path: Path | str, words: str) -> None:
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and words in lines[0], res.stderr
    assert "Traceback" not in res.stderr


def nested(depth: int) -> str:
    return "health:\n  checks:\n    x: " + "[" * depth + "]" * depth + "\n"


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"agent:\n  node_name: \xff\xfe\n", "is not UTF-8 text (byte 0xff at line 2)"),
        ("agent:\n  node_name: x\n".encode("utf-16"), "is UTF-16; save it as UTF-8"),
    ],
)
def test_non_utf8_config_is_one_line_and_exit_2(tmp_path: Path, data: bytes, words: str) -> None:
    """Item 1: was a UnicodeDecodeError traceback with exit 1."""
    p = tmp_path / "c.yaml"
    p.write_bytes(data)
    assert_one_line_exit_2(config_show(p), p, words)


def test_utf8_with_bom_still_loads(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_bytes(b"\xef\xbb\xbfslurm: {retries: 2}\n")
    assert read_yaml(p) == {"slurm": {"retries": 2}}


@pytest.mark.parametrize("depth", [MAX_YAML_DEPTH, 300, 500, 5000])
def test_deep_nesting_is_refused_at_load(tmp_path: Path, depth: int) -> None:
    """Item 2: depth 500 was a RecursionError, 300-400 loaded and then killed `config show`."""
    p = tmp_path / "deep.yaml"
    p.write_text(nested(depth))
    assert_one_line_exit_2(config_show(p), p, f"nested deeper than {MAX_YAML_DEPTH} levels")


def test_nesting_within_the_limit_loads(tmp_path: Path) -> None:
    p = tmp_path / "ok.yaml"
    p.write_text(nested(MAX_YAML_DEPTH - 5))
    assert read_yaml(p)["health"]["checks"]["x"] is not None


def test_alias_bomb_in_an_open_mapping_is_refused(tmp_path: Path) -> None:
    """Items 3 and 4: the bomb in `health.checks` made `config show` exceed 3.8 GB; now it is refused at
    read time by counting the expanded values, not by running out of anything."""
    p = tmp_path / "bomb.yaml"
    p.write_text(ALIAS_BOMB)
    assert len(ALIAS_BOMB.encode()) < 600
    assert_one_line_exit_2(config_show(p), p, f"more than {MAX_YAML_VALUES} values once its aliases are expanded")


def test_modest_aliases_still_load(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("a: &x {k: [1, 2, 3]}\nb: *x\nc: {<<: *x, extra: 1}\n")
    assert read_yaml(p) == {"a": {"k": [1, 2, 3]}, "b": {"k": [1, 2, 3]}, "c": {"k": [1, 2, 3], "extra": 1}}


def test_alias_cycle_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "cycle.yaml"
    p.write_text("a: &a [1, *a]\n")
    with pytest.raises(ConfigError, match="a cycle"):
        read_yaml(p)


def test_dev_zero_is_refused_at_once() -> None:
    """Item 4: `--config /dev/zero` read without limit."""
    assert_one_line_exit_2(config_show("/dev/zero"), "/dev/zero", "not a regular file")


def test_fifo_without_writer_is_refused_not_waited_on(tmp_path: Path) -> None:
    """Item 4: opening a FIFO blocked until a writer came; it is refused without blocking."""
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    assert_one_line_exit_2(config_show(fifo), fifo, "not a regular file")


def test_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"not a regular file|Is a directory"):
        read_yaml(tmp_path)


def test_oversized_file_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "big.yaml"
    p.write_text("# " + "x" * MAX_YAML_BYTES + "\n")
    with pytest.raises(ConfigError, match="larger than 4 MiB"):
        read_yaml(p)


@pytest.mark.parametrize(
    "text",
    [
        "slurm:\n  retries: 1\n  retries: 2\n",
        "slurm: {retries: 1}\nslurm: {retries: 2}\n",
        "- name: A\n  logPattern: x\n  logPattern: y\n",
    ],
)
def test_duplicate_keys_are_refused_with_their_line(tmp_path: Path, text: str) -> None:
    """Item 10: the last value silently won."""
    p = tmp_path / "dup.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=r"not valid YAML at line \d+, column \d+: duplicate key"):
        read_yaml(p)


def test_merge_key_override_is_not_a_duplicate(tmp_path: Path) -> None:
    p = tmp_path / "m.yaml"
    p.write_text("base: &b {x: 1, y: 2}\nover: {<<: *b, y: 3}\n")
    assert read_yaml(p)["over"] == {"x": 1, "y": 3}


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('"\\x1F\\U0A0010000": null\n', "chr() arg not in range"),  # found by the long fuzz run
        ('"\\UA00010000": null\n', "too large to convert"),
        ("slurm: {bin_dir: 2020-13-45}\n", "month must be in 1..12"),
    ],
)
def test_yaml_conversions_pyyaml_lets_escape_are_config_errors(tmp_path: Path, text: str, words: str) -> None:
    """PyYAML raises ValueError/OverflowError (not YAMLError) for these; they must not escape as tracebacks."""
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=f"not valid YAML: .*{re.escape(words)}"):
        read_yaml(p)


@pytest.mark.parametrize(
    ("text", "error"), [("{not json", "Expecting property name"), ("[1, 2]", "not a JSON object but list")]
)
def test_corrupt_json_state_reads_as_none_with_the_callers_warning(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "state.json"
    path.write_text(text)
    with capture_logs() as logs:
        assert read_json_state(path, "thing_state_unreadable", part="probe") is None
    assert [(e["event"], e["path"], e["part"]) for e in logs] == [("thing_state_unreadable", str(path), "probe")]
    assert error in logs[0]["error"]


def test_absent_json_state_is_none_without_a_warning_and_an_object_reads_back(tmp_path: Path) -> None:
    with capture_logs() as logs:
        assert read_json_state(tmp_path / "none.json", "thing_state_unreadable") is None
        (tmp_path / "ok.json").write_text('{"a": 1}')
        assert read_json_state(tmp_path / "ok.json", "thing_state_unreadable") == {"a": 1}
    assert logs == []
