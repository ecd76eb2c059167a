"""The package's public face: the lazily imported names are listed where users look for them."""

from __future__ import annotations

import hpresilience.torch as hpt


def test_dir_lists_every_lazily_exported_name() -> None:
    """dir() and tab completion read __dir__; without it the lazy names (module __getattr__) are invisible."""
    listed = dir(hpt)
    assert set(hpt.__all__) <= set(listed)
    assert listed == sorted(listed)
    for name in hpt.__all__:
        assert getattr(hpt, name) is not None
