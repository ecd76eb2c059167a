"""Packaging facts an operator relies on: the declared Python is the one the code and CI run on, the license
file exists, and no setting is accepted only to be ignored."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import pytest

from hpresilience.config import config_from_mapping
from hpresilience.errors import ConfigError
from hpresilience.install.layout import MIN_PYTHON

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_declared_python_is_the_lowest_the_code_and_ci_run_on() -> None:
    """log.py needs 3.11 (logging.getLevelNamesMapping); CI runs Debian 12's 3.11; the installer checks it."""
    m = re.fullmatch(r">=(\d+)\.(\d+)", PYPROJECT["project"]["requires-python"])
    assert m and (int(m.group(1)), int(m.group(2))) == MIN_PYTHON
    assert PYPROJECT["tool"]["ruff"]["target-version"] == f"py{MIN_PYTHON[0]}{MIN_PYTHON[1]}"
    assert PYPROJECT["tool"]["mypy"]["python_version"] == f"{MIN_PYTHON[0]}.{MIN_PYTHON[1]}"
    assert sys.version_info[:2] >= MIN_PYTHON


def test_license_file_matches_the_metadata() -> None:
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text


def test_slurm_backend_auto_is_refused_not_ignored() -> None:
    with pytest.raises(ConfigError, match=r"cfg.yaml: slurm.backend: Input should be 'commands'"):
        config_from_mapping({"slurm": {"backend": "auto"}}, "cfg.yaml")
    assert config_from_mapping({"slurm": {"backend": "commands"}}).slurm.backend == "commands"


def test_the_training_install_brings_only_what_the_torch_part_needs() -> None:
    """Issue 22 item 7: `hpresilience[torch]` in a training environment pulls no node-side dependency;
    boto3 comes only with the `s3` extra, and the installer puts the node side in with `[node]`."""
    core = {re.split(r"[<>=\[ ]", d)[0].lower() for d in PYPROJECT["project"]["dependencies"]}
    extras = PYPROJECT["project"]["optional-dependencies"]
    torch_side = core | {re.split(r"[<>=\[ ]", d)[0].lower() for d in extras["torch"]}
    assert not torch_side & {"boto3", "google-re2", "nvidia-ml-py", "psutil", "prometheus-client", "python-hostlist"}
    assert [d.split(">=")[0] for d in extras["s3"]] == ["boto3"]
    assert {"boto3", "google-re2", "nvidia-ml-py", "psutil"} <= {d.split(">=")[0] for d in extras["node"]}


def test_the_torch_part_checkpoints_with_no_node_side_package_importable(tmp_path: Path) -> None:
    """Save and load through the filesystem tier in a process where importing boto3, re2, pynvml, psutil,
    prometheus_client or hostlist fails, as in a training environment with only `hpresilience[torch]`."""
    pytest.importorskip("torch")
    code = f"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {{"boto3", "botocore", "re2", "pynvml", "psutil", "prometheus_client",
                                   "hostlist"}}:
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
import torch
from hpresilience.torch import CheckpointConfig, TieredCheckpointer
cfg = CheckpointConfig(namespace="t", memory_dir={str(tmp_path / "m")!r}, replicate=False,
                       fs_base={str(tmp_path)!r}, s3_every=1)
ck = TieredCheckpointer(cfg)
ck.save({{"w": torch.arange(5.0)}}, 1)
assert ck.close()
got = {{"w": torch.zeros(5)}}
ck2 = TieredCheckpointer(cfg)
assert ck2.load(got) == 1 and ck2.last_source == "filesystem" and got["w"].tolist() == [0, 1, 2, 3, 4]
ck2.close()
print("ok")
"""
    import subprocess

    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-2000:]
