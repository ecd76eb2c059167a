"""The install manifest as read back from disk, and role names from the command line."""

from __future__ import annotations

import pytest

from hpresilience.errors import ConfigError
from hpresilience.install.layout import ROLES, as_role
from hpresilience.install.venv import manifest_list, manifest_lists, manifest_map


def test_manifest_entries_read_in_their_shape_and_any_other_shape_reads_as_empty() -> None:
    data: dict[str, object] = {
        "roles": ["compute", "login"],
        "files": {"/a": "1f"},
        "role_files": {"compute": ["/a"], "login": "not a list"},
    }
    assert manifest_list(data, "roles") == ["compute", "login"]
    assert manifest_map(data, "files") == {"/a": "1f"}
    assert manifest_lists(data, "role_files") == {"compute": ["/a"]}
    edited: dict[str, object] = {"roles": "compute", "files": ["/a"], "role_files": 3}
    assert (manifest_list(edited, "roles"), manifest_map(edited, "files"), manifest_lists(edited, "role_files")) == (
        [],
        {},
        {},
    )
    assert manifest_list({}, "links") == []


def test_a_role_name_becomes_a_role_and_an_unknown_one_names_the_known() -> None:
    assert [as_role(r) for r in ROLES] == list(ROLES)
    with pytest.raises(ConfigError, match="unknown role 'head' \\(known: compute, controller, login\\)"):
        as_role("head")
