"""The one EC2 metadata client: the agent's notice source and the training library's spot poll both read through it,
so the library's poll has the agent's absolute deadline too."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from hpresilience.errors import ConfigError
from hpresilience.imds import SPOT_PATH, MetadataClient, MetadataUnavailable
from hpresilience.testing.fakeimds import FakeImds
from hpresilience.torch.preemption import spot_interruption
from tests.trickle import trickling_endpoint


@pytest.fixture()
def imds() -> Iterator[FakeImds]:
    with FakeImds() as server:
        yield server


def test_a_document_is_read_with_a_fresh_token_and_a_missing_one_is_none(imds: FakeImds) -> None:
    client = MetadataClient(imds.url, 2.0)
    token = client.token()
    assert client.get(SPOT_PATH, token) is None  # 404: no spot action scheduled
    imds.announce_spot("stop")
    body = client.get(SPOT_PATH, token)
    assert body is not None and b'"stop"' in body
    assert [(m, s) for m, _, s in imds.requests] == [("PUT", 200), ("GET", 404), ("GET", 200)]


def test_an_endpoint_that_is_not_plain_http_names_the_setting() -> None:
    with pytest.raises(ConfigError, match=r"^my.setting: 'https://x' is not http://HOST\[:PORT\]"):
        MetadataClient("https://x", 1.0, "my.setting")


def test_the_training_librarys_spot_poll_ends_within_its_timeout_against_a_trickling_endpoint() -> None:
    """The library's poll used urllib, whose timeout bounds each read: a server sending a byte every 0.2 s held it
    for as long as it went on. Through the shared client the whole request ends within `timeout`."""
    with trickling_endpoint(for_s=6) as url:
        started = time.monotonic()
        with pytest.raises(MetadataUnavailable, match="within"):
            spot_interruption(url, timeout=0.6)
        assert time.monotonic() - started < 1.5
