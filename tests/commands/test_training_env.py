"""The CLI in a training environment (`pip install hpresilience[torch]`, no `node` extra): the ML engineer's
commands run, and a command that needs the node side says in one line which extra to install."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# A process in which every module of the `node` extra is missing, as after `pip install hpresilience[torch]`.
WITHOUT_NODE_EXTRA = """
import runpy, sys
NODE = {"re2", "psutil", "pynvml", "prometheus_client", "boto3", "botocore", "hostlist"}
class Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in NODE:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
for name in list(sys.modules):
    if name.split(".")[0] in NODE:
        del sys.modules[name]
sys.meta_path.insert(0, Missing())
sys.argv = ["hpresilience", *sys.argv[1:]]
runpy.run_module("hpresilience", run_name="__main__", alter_sys=True)
"""


def hpr_without_node_extra(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_NODE_EXTRA, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=cwd,
    )


def test_help_lists_every_command_without_the_node_extra() -> None:
    from hpresilience.cli import LAZY_COMMANDS

    res = hpr_without_node_extra("--help")
    assert res.returncode == 0, res.stderr
    commands = res.stdout.split("Commands:")[1]
    listed = {line.split()[0] for line in commands.strip().splitlines()}
    assert set(LAZY_COMMANDS) <= listed
    check = next(line for line in commands.splitlines() if line.split()[:1] == ["check"])
    assert "pip install 'hpresilience[node]'" in check
    job = next(line for line in commands.splitlines() if line.split()[:1] == ["job"])
    assert "goodput ledger" in job


def test_a_command_of_the_node_side_is_one_line_naming_the_extra_and_exit_3() -> None:
    """`check` imports psutil with its module; the wrapper imports prometheus_client inside its run."""
    for args in (["check"], ["srun", "--auto-resume=1", "true"]):
        res = hpr_without_node_extra(*args)
        assert res.returncode == 3, (args, res.stderr)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and "pip install 'hpresilience[node]'" in lines[0], (args, res.stderr)
        assert lines[0].startswith("hpresilience: error: ")


def test_config_with_a_log_rule_loads_without_re2(tmp_path: Path) -> None:
    """The config imports the rule settings; their RE2 check waits for the wrapper, which has the extra."""
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "autoresume:\n  runPolicy:\n    logMonitoringConfiguration:\n"
        "      - name: loss\n        logPattern: '.*loss=([0-9.]+)'\n        metricThreshold: 10\n"
        "        operator: gt\n"
    )
    res = hpr_without_node_extra("--config", str(cfg), "config", "show")
    assert res.returncode == 0, res.stderr
    assert "loss=" in res.stdout
