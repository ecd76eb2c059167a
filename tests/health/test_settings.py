"""Health settings: per-check options are validated against the check registry when the settings load."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from hpresilience.health.settings import HealthSettings


def test_config_check_options_are_refused_when_the_settings_load() -> None:
    """Issue 11 defect 3: an option typo under health.checks passed `config show` and failed the agent's start;
    now the settings refuse it, each problem with its key path (check names hold dots: the path reads as typed)."""
    with pytest.raises(ValidationError) as err:
        HealthSettings(checks={"xid": {"bogus": 1}, "gpu.memory": {"enabled": "maybe"}, "gpu.nope": {}})
    assert [(".".join(map(str, e["loc"])), e["type"]) for e in err.value.errors()] == [
        ("checks.xid.bogus", "extra_forbidden"),
        ("checks.gpu.memory.enabled", "bool_parsing"),
        ("checks.gpu.nope", "invalid_reference"),
    ]
    assert "unknown check 'gpu.nope'; known: dcgm.diag," in str(err.value)
