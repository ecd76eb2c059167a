"""The S3 tier: shards uploaded after commit in the background, a marker key written last.

    s3://bucket/prefix/<namespace>/step_0000000120/rank_3.bin, rank_3.idx, .metadata
    s3://bucket/prefix/<namespace>/_committed/step_0000000120      (the marker; one LIST finds them all)

Uploads and downloads use boto3's managed transfer (multipart, bounded concurrency). Nothing here runs
inside a save call.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import BotoCoreError, ClientError

from hpresilience.errors import ExternalError, HPResilienceError
from hpresilience.fileio import atomic_write
from hpresilience.torch.layout import COMMIT, METADATA, parse_step, shard_names, step_name
from hpresilience.torch.private import read_trusted
from hpresilience.torch.settings import CheckpointConfig

_MARKERS = "_committed"


class S3Tier:
    kind = "s3"

    def __init__(self, cfg: CheckpointConfig, client: Any = None) -> None:
        self.bucket, prefix = cfg.s3_bucket_prefix()
        self.base = f"{prefix}/{cfg.namespace}" if prefix else cfg.namespace
        self.client = client or boto3.client("s3", endpoint_url=cfg.s3_endpoint_url, region_name=cfg.s3_region)
        part = cfg.s3_part_size_mib << 20
        self.transfer = TransferConfig(
            multipart_threshold=part,
            multipart_chunksize=part,
            max_concurrency=cfg.s3_max_concurrency,
            use_threads=True,
        )

    def key(self, step: int, name: str) -> str:
        return f"{self.base}/{step_name(step)}/{name}"

    def marker(self, step: int) -> str:
        return f"{self.base}/{_MARKERS}/{step_name(step)}"

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (BotoCoreError, ClientError, OSError) as err:
            raise ExternalError(f"S3 {what} failed (s3://{self.bucket}/{self.base}): {err}") from None

    def upload_shard(self, step_dir: Path, step: int, rank: int) -> None:
        # The index goes after the data: a reader that sees the index finds the data complete.
        for name in shard_names(rank):
            self._call(
                "upload",
                self.client.upload_file,
                str(step_dir / name),
                self.bucket,
                self.key(step, name),
                Config=self.transfer,
            )

    def commit(self, step_dir: Path, step: int) -> None:
        """Coordinator only, after every rank's shard is up: metadata, then the marker."""
        self._call(
            "upload",
            self.client.upload_file,
            str(step_dir / METADATA),
            self.bucket,
            self.key(step, METADATA),
            Config=self.transfer,
        )
        self._call(
            "put",
            self.client.put_object,
            Bucket=self.bucket,
            Key=self.marker(step),
            Body=read_trusted(step_dir / COMMIT),
        )

    def committed_steps(self) -> list[int]:
        steps: list[int] = []
        paginator = self.client.get_paginator("list_objects_v2")
        pages = self._call(
            "list", lambda: list(paginator.paginate(Bucket=self.bucket, Prefix=f"{self.base}/{_MARKERS}/"))
        )
        for page in pages:
            for obj in page.get("Contents", []):
                s = parse_step(obj["Key"].rsplit("/", 1)[-1])
                if s is not None:
                    steps.append(s)
        return sorted(steps)

    def world_of(self, step: int) -> int | None:
        """The world size recorded in a step's marker (None: unreadable, or an older marker without it)."""
        try:
            body = self._call("get", self.client.get_object, Bucket=self.bucket, Key=self.marker(step))["Body"]
            return int(json.loads(body.read())["world_size"])
        except (HPResilienceError, ValueError, KeyError, TypeError):
            return None

    def _download(self, key: str, dest: Path) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        # boto3 streams the object into a file of its own choosing, so this is a rename of a downloaded
        # file, not fileio.atomic_write's write of a buffer: the temp-then-rename idea, done by hand.
        # The pid keeps two ranks of one node (one shared tier) fetching the same file apart.
        tmp = dest.with_name(f"{dest.name}.{os.getpid()}.s3part")
        self._call("download", self.client.download_file, self.bucket, key, str(tmp), Config=self.transfer)
        # boto3 creates the file with the process umask; the tier's files are this user's alone (a
        # group-writable one would rightly be refused when read back).
        os.chmod(tmp, 0o600)
        os.replace(tmp, dest)

    def download_shard(self, step: int, rank: int, dest_dir: Path) -> None:
        data, idx = shard_names(rank)
        self._download(self.key(step, data), dest_dir / data)
        self._download(self.key(step, idx), dest_dir / idx)

    def download_metadata(self, step: int, dest_dir: Path) -> None:
        self._download(self.key(step, METADATA), dest_dir / METADATA)
        body = self._call("get", self.client.get_object, Bucket=self.bucket, Key=self.marker(step))["Body"].read()
        atomic_write(dest_dir / COMMIT, body, make_parents=False)

    def prune(self, keep: int) -> list[int]:
        """Remove the oldest committed steps beyond `keep`; the marker goes first so no reader trusts them."""
        steps = self.committed_steps()
        gone = steps[:-keep] if keep and len(steps) > keep else []
        for s in gone:
            self._call("delete", self.client.delete_object, Bucket=self.bucket, Key=self.marker(s))
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=f"{self.base}/{step_name(s)}/"
            )
            for page in self._call("list", list, pages):
                keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
                if keys:
                    self._call(
                        "delete",
                        self.client.delete_objects,
                        Bucket=self.bucket,
                        Delete={"Objects": keys, "Quiet": True},
                    )
        return gone
