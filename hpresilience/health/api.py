"""The health package's entry point for `hpresilience check`: run a profile, aggregate a Verdict.

The agent runs the same checks through its own collector (agent/collector.py); nothing here knows the agent.
"""

from __future__ import annotations

from hpresilience.health.base import CheckResult, Kind
from hpresilience.health.profiles import Profile, build_checks, load_profile, make_context
from hpresilience.health.runner import run_checks
from hpresilience.health.settings import HealthSettings
from hpresilience.health.verdict import Verdict, aggregate


def run_profile(
    settings: HealthSettings,
    profile: str | None = None,
    kinds: tuple[Kind, ...] = (Kind.PASSIVE,),
    only: list[str] | None = None,
    strict: bool = False,
) -> tuple[Profile, list[CheckResult], Verdict]:
    prof = load_profile(settings, profile, make_context(settings).paths)
    checks = build_checks(prof, make_context(settings, prof, strict), kinds, only)
    results = run_checks(checks)
    return prof, results, aggregate(results)
