"""Moving shard files between ranks over a gloo group: the peer copy and restores from it.

Files travel as raw bytes straight out of and into tmpfs mmaps (no staging copy). Each transfer first
sends a header with the file sizes; the receiver writes under temporary names and renames when complete,
so a transfer cut short leaves nothing that looks like a shard.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hpresilience.torch.private import open_private, open_trusted

_CHUNK = 256 << 20  # bytes per message: bounds gloo's per-message buffers


def peer_of(rank: int, world_size: int, ranks_per_node: int) -> int | None:
    """The rank holding our copy: one node further on the ring; None on a single node."""
    if world_size <= ranks_per_node:
        return None
    return (rank + ranks_per_node) % world_size


def source_of(rank: int, world_size: int, ranks_per_node: int) -> int | None:
    if world_size <= ranks_per_node:
        return None
    return (rank - ranks_per_node) % world_size


def _chunks(t: torch.Tensor) -> list[torch.Tensor]:
    return [t[i : i + _CHUNK] for i in range(0, t.numel(), _CHUNK)]


def _map_for_send(stack: ExitStack, path: Path) -> torch.Tensor | None:
    size = path.stat().st_size
    if size == 0:
        return None
    fd = open_trusted(path)
    try:
        # ACCESS_COPY gives torch a writable buffer without copying a byte (nothing writes to it).
        m = stack.enter_context(mmap.mmap(fd, size, access=mmap.ACCESS_COPY))
    finally:
        os.close(fd)
    return torch.frombuffer(m, dtype=torch.uint8)


def _map_for_recv(stack: ExitStack, path: Path, size: int) -> torch.Tensor | None:
    fd = open_private(path, os.O_RDWR)
    try:
        os.ftruncate(fd, size)
        if size == 0:
            return None
        m = stack.enter_context(mmap.mmap(fd, size))
    finally:
        os.close(fd)
    return torch.frombuffer(m, dtype=torch.uint8)


class Transfer:
    """One direction of a file transfer; `post()` starts it, `wait()` finishes it."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.works: list[Any] = []
        self.stack = ExitStack()

    def send_header(self, paths: Sequence[Path], dst: int) -> None:
        sizes = torch.tensor([p.stat().st_size for p in paths], dtype=torch.int64)
        dist.send(sizes, dst=dst, group=self.group)

    def recv_header(self, count: int, src: int) -> list[int]:
        sizes = torch.zeros(count, dtype=torch.int64)
        dist.recv(sizes, src=src, group=self.group)
        return [int(x) for x in sizes.tolist()]

    def post_send(self, paths: Sequence[Path], dst: int) -> None:
        for p in paths:
            t = _map_for_send(self.stack, p)
            if t is not None:
                self.works += [dist.isend(c, dst=dst, group=self.group) for c in _chunks(t)]

    def post_recv(self, paths: Sequence[Path], sizes: Sequence[int], src: int) -> list[Path]:
        tmps = []
        for p, size in zip(paths, sizes, strict=True):
            p.parent.mkdir(parents=True, exist_ok=True)
            # Received straight into a mapped `.part` file (no buffer of the whole shard), then renamed into
            # place once every chunk arrived: temp-then-rename, but not fileio.atomic_write's buffer write.
            tmp = p.with_name(p.name + ".part")
            t = _map_for_recv(self.stack, tmp, size)
            if t is not None:
                self.works += [dist.irecv(c, src=src, group=self.group) for c in _chunks(t)]
            tmps.append(tmp)
        return tmps

    def wait(self) -> None:
        try:
            for w in self.works:
                if w is not None:
                    w.wait()
        finally:
            self.works = []
            self.stack.close()


def exchange(group: Any, send: Sequence[Path], dst: int | None, recv: Sequence[Path], src: int | None) -> None:
    """Send `send` to `dst` while receiving `recv` from `src` (the replication ring: everyone does both).

    Headers go first with non-blocking calls so that a ring of blocking sends cannot deadlock.
    """
    hdr_out = torch.tensor([p.stat().st_size for p in send], dtype=torch.int64) if dst is not None else None
    hdr_in = torch.zeros(len(recv), dtype=torch.int64)
    works = []
    if hdr_out is not None and dst is not None:
        works.append(dist.isend(hdr_out, dst=dst, group=group))
    if src is not None:
        works.append(dist.irecv(hdr_in, src=src, group=group))
    for w in works:
        if w is not None:
            w.wait()
    tr = Transfer(group)
    tmps: list[Path] = []
    if src is not None:
        tmps = tr.post_recv(recv, [int(x) for x in hdr_in.tolist()], src)
    if dst is not None:
        tr.post_send(send, dst)
    tr.wait()
    for tmp, final in zip(tmps, recv, strict=True):
        os.replace(tmp, final)


def send_files(group: Any, paths: Sequence[Path], dst: int) -> None:
    tr = Transfer(group)
    tr.send_header(paths, dst)
    tr.post_send(paths, dst)
    tr.wait()


def recv_files(group: Any, paths: Sequence[Path], src: int) -> None:
    tr = Transfer(group)
    sizes = tr.recv_header(len(paths), src)
    tmps = tr.post_recv(paths, sizes, src)
    tr.wait()
    for tmp, final in zip(tmps, paths, strict=True):
        os.replace(tmp, final)
