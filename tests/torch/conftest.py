"""Fixtures for the torch tier tests: a moto S3 server over real HTTP on a free port."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

pytest.importorskip("torch")
moto_server = pytest.importorskip("moto.server")

_FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_SESSION_TOKEN": "testing",
}


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """A moto S3 endpoint with bucket `ckpt`; fake credentials in the environment (spawned ranks inherit)."""
    old = {k: os.environ.get(k) for k in _FAKE_AWS}
    os.environ.update(_FAKE_AWS)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    import boto3

    boto3.client("s3", endpoint_url=url, region_name="us-east-1").create_bucket(Bucket="ckpt")
    try:
        yield url
    finally:
        server.stop()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
