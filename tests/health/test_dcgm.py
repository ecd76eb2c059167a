"""DCGM health and diag over recorded-shape JSON from a stand-in dcgmi."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from hpresilience.health.base import CheckContext, CheckOptions, Status
from hpresilience.health.checks.dcgm import DcgmDiag, DcgmDiagOptions, DcgmHealth, parse_diag
from hpresilience.health.runner import run_one
from hpresilience.reasons import Action

DIAG = {
    "DCGM GPU Diagnostic": {
        "test_categories": [
            {
                "category": "Deployment",
                "tests": [
                    {"name": "Denylist", "results": [{"status": "Pass"}]},
                    {"name": "Page Retirement/Row Remap", "results": [{"status": "Pass"}]},
                ],
            },
            {
                "category": "Hardware",
                "tests": [
                    {
                        "name": "memory",
                        "results": [
                            {"gpu_id": "0", "status": "Pass"},
                            {
                                "gpu_id": "1",
                                "status": "Fail",
                                "warnings": [{"warning": "Error using CUDA API cudaMalloc", "error_id": 45}],
                                "warning_level": 2,
                            },
                        ],
                    }
                ],
            },
        ]
    },
    "version": "3.3.5",
}
HEALTH_OK = {
    "body": {
        "Overall Health": {"value": "Healthy"},
        "GPU": {"children": {"0": {"children": {"Overall Health": {"value": "Healthy"}}}}},
    },
    "header": ["Health Monitor Report"],
}
HEALTH_BAD = {
    "body": {
        "Overall Health": {"value": "Failure"},
        "GPU": {
            "children": {
                "3": {
                    "children": {
                        "Overall Health": {"value": "Failure"},
                        "Memory": {
                            "children": {
                                "Health": {"value": "Failure"},
                                "Error": {"value": "A double-bit ECC error was detected on GPU 3"},
                            }
                        },
                    }
                }
            }
        },
    },
    "header": ["Health Monitor Report"],
}


def dcgmi(fake_tool: Callable[[str, str], str], tmp_path: Path, payload: object, rc: int = 0) -> str:
    f = tmp_path / f"out{abs(hash(json.dumps(payload)))}.json"
    f.write_text(json.dumps(payload))
    return fake_tool("dcgmi", f'echo "$@" > {tmp_path}/args; cat {f}; exit {rc}')


def test_diag_json_is_flattened_per_test_and_gpu() -> None:
    tests = parse_diag(json.dumps(DIAG))
    assert [(t["test"], t["status"], t["gpu"]) for t in tests][-2:] == [
        ("memory", "pass", "0"),
        ("memory", "fail", "1"),
    ]
    assert "cudaMalloc" in tests[-1]["detail"]


def test_diag_failure_reboots_then_isolate_level_replaces(
    ctx_factory: Callable[..., CheckContext], fake_tool: Callable[[str, str], str], tmp_path: Path
) -> None:
    ctx = ctx_factory(commands={"dcgmi": dcgmi(fake_tool, tmp_path, DIAG, rc=226)})
    r = run_one(DcgmDiag(DcgmDiagOptions(level=2), ctx))
    assert (r.status, r.action) == (Status.FAIL, Action.REBOOT) and "memory failed" in r.reason
    assert (tmp_path / "args").read_text().split() == ["diag", "-r", "2", "-j"]
    DIAG["DCGM GPU Diagnostic"]["test_categories"][1]["tests"][0]["results"][1]["warning_level"] = 3  # type: ignore[index]
    ctx = ctx_factory(commands={"dcgmi": dcgmi(fake_tool, tmp_path, DIAG, rc=226)})
    assert run_one(DcgmDiag(DcgmDiagOptions(level=2), ctx)).action == Action.REPLACE


def test_diag_pass_and_non_json(
    ctx_factory: Callable[..., CheckContext], fake_tool: Callable[[str, str], str], tmp_path: Path
) -> None:
    ok = {
        "DCGM GPU Diagnostic": {
            "test_categories": [
                {"category": "Deployment", "tests": [{"name": "Denylist", "results": [{"status": "Pass"}]}]}
            ]
        }
    }
    ctx = ctx_factory(commands={"dcgmi": dcgmi(fake_tool, tmp_path, ok)})
    assert run_one(DcgmDiag(DcgmDiagOptions(), ctx)).status == Status.OK
    garbage = fake_tool("dcgmi-garbage", 'echo "Error: unable to establish a connection to the specified host"; exit 1')
    r = run_one(DcgmDiag(DcgmDiagOptions(), ctx_factory(commands={"dcgmi": garbage})))
    assert (r.status, r.action) == (Status.UNKNOWN, Action.NONE) and "connection" in r.reason


def test_health_watch_results(
    ctx_factory: Callable[..., CheckContext], fake_tool: Callable[[str, str], str], tmp_path: Path
) -> None:
    ctx = ctx_factory(commands={"dcgmi": dcgmi(fake_tool, tmp_path, HEALTH_OK)})
    assert run_one(DcgmHealth(CheckOptions(), ctx)).status == Status.OK
    ctx = ctx_factory(commands={"dcgmi": dcgmi(fake_tool, tmp_path, HEALTH_BAD)})
    r = run_one(DcgmHealth(CheckOptions(), ctx))
    assert r.status == Status.FAIL and "double-bit ECC error was detected on GPU 3" in r.reason and not r.certain
    assert (
        run_one(DcgmHealth(CheckOptions(), ctx_factory(commands={"dcgmi": "/no/dcgmi"}))).status
        == Status.NOT_APPLICABLE
    )


def test_diag_whose_every_test_is_skipped_is_unknown_not_passed(
    ctx_factory: Callable[..., CheckContext], fake_tool: Callable[[str, str], str], tmp_path: Path
) -> None:
    """`dcgmi diag -r 3 -j` on a GPU the plugins do not support: every result Skip, nothing tested."""
    skipped = {
        "DCGM GPU Diagnostic": {
            "test_categories": [
                {"category": cat, "tests": [{"name": name, "results": [{"gpu_id": "0", "status": "Skip"}]}]}
                for cat, name in (("Integration", "PCIe"), ("Hardware", "GPU Memory"), ("Stress", "SM Stress"))
            ]
        }
    }
    ctx = ctx_factory(commands={"dcgmi": dcgmi(fake_tool, tmp_path, skipped)})
    r = run_one(DcgmDiag(DcgmDiagOptions(level=3), ctx))
    assert (r.status, r.action) == (Status.UNKNOWN, Action.NONE) and "nothing was tested" in r.reason
    skipped["DCGM GPU Diagnostic"]["test_categories"][0]["tests"][0]["results"][0]["status"] = "Pass"  # type: ignore[index]
    ctx = ctx_factory(commands={"dcgmi": dcgmi(fake_tool, tmp_path, skipped)})
    r = run_one(DcgmDiag(DcgmDiagOptions(level=3), ctx))
    assert r.status == Status.OK and "1 result(s) passed, 2 skipped" in r.reason
