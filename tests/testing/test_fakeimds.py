"""The fake EC2 metadata server keeps IMDSv2's token rules, so a client that skips them fails here as on EC2."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from hpresilience.testing.fakeimds import EVENTS, SPOT, FakeImds, main


@pytest.fixture()
def imds() -> Iterator[FakeImds]:
    with FakeImds() as server:
        yield server


def test_fake_metadata_server_enforces_imdsv2_tokens(imds: FakeImds) -> None:
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(imds.url + SPOT, timeout=2)
    assert err.value.code == 401
    bad = urllib.request.Request(imds.url + SPOT, headers={"X-aws-ec2-metadata-token": "forged"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(bad, timeout=2)
    assert err.value.code == 401
    no_ttl = urllib.request.Request(imds.url + "/latest/api/token", method="PUT")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(no_ttl, timeout=2)
    assert err.value.code == 400


def test_announced_events_are_served_in_ec2s_format_and_cancel_as_ec2_does(imds: FakeImds) -> None:
    token = (
        urllib.request.urlopen(
            urllib.request.Request(
                imds.url + "/latest/api/token", method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"}
            ),
            timeout=2,
        )
        .read()
        .decode()
    )
    event = imds.announce_maintenance("system-reboot", "scheduled reboot", in_s=600)

    def events() -> list[dict[str, str]]:
        req = urllib.request.Request(imds.url + EVENTS, headers={"X-aws-ec2-metadata-token": token})
        doc: list[dict[str, str]] = json.loads(urllib.request.urlopen(req, timeout=2).read())
        return doc

    [ev] = events()
    assert ev["EventId"] == event and ev["State"] == "active" and ev["NotBefore"].endswith(" GMT")
    imds.cancel_maintenance(event)
    [ev] = events()
    assert ev["State"] == "canceled" and ev["Description"].startswith("[Canceled]")


def test_command_line_rejects_an_unknown_spot_action(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as err:
        main(["--spot", "explode"])
    assert err.value.code == 2 and "invalid choice" in capsys.readouterr().err
