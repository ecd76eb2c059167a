"""Collective-failure signatures: the lines torch, NCCL and gloo print when a collective is lost, and
lines that merely mention the same words (issue 32: each of those once turned an application error into a
same-node relaunch)."""

from __future__ import annotations

import pytest

from hpresilience.autoresume.progress import ProgressStream
from hpresilience.autoresume.watch.collective import match_signature

REAL = [
    (
        "[rank1]:[E1125 10:01:02.123 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=9, NumelOut=9, Timeout(ms)=600000) ran for "
        "600083 milliseconds before timing out.",
        "nccl_watchdog",
    ),
    (
        "[rank0]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 0] Process group watchdog thread terminated with "
        "exception: CUDA error: an illegal memory access was encountered",
        "nccl_abort",
    ),
    (
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:"
        "1970, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3",
        "nccl_abort",
    ),
    ("RuntimeError: NCCL communicator was aborted on rank 3. Original reason for failure was: ...", "nccl_abort"),
    (
        "[rank2]:[E ProcessGroupNCCL.cpp:577] [Rank 2] Some NCCL operations have failed or timed out. Due to the "
        "asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
        "nccl_abort",
    ),
    (
        "[rank0]:[E ProcessGroupNCCL.cpp:1418] [PG 0 Rank 0] ProcessGroupNCCL's watchdog got stuck for 480 "
        "seconds without making progress in monitoring enqueued collectives.",
        "nccl_abort",
    ),
    (
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:1234",
        "gloo_connection",
    ),
    (
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Read error [10.0.0.2]:21471: "
        "Connection reset by peer",
        "gloo_connection",
    ),
    (
        "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting "
        "60000ms for recv operation to complete",
        "gloo_timeout",
    ),
    (
        "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 clients joined.",
        "store_timeout",
    ),
    ("torch.distributed.DistStoreError: wait timeout after 300000ms, keys: /default_pg/0//cuda//0", "store_timeout"),
    ("RuntimeError: Timeout waiting for key: default_pg/0/0", "store_timeout"),
    ("RuntimeError: Socket Timeout", "store_timeout"),
    (
        "torch.distributed.DistNetworkError: The client socket has timed out after 600000ms while trying to "
        "connect to (10.0.0.1, 29500).",
        "store_timeout",
    ),
]

BENIGN = [
    "Using TCPStore with timeout 1800 seconds",
    "no NCCL errors so far",
    "step 120: NCCL error count 0, loss 2.31",
    "[I ProcessGroupNCCL.cpp:913] [PG 0 Rank 0] ProcessGroupNCCL initialization options: NCCL version: 2.19.3, "
    "TORCH_NCCL_ASYNC_ERROR_HANDLING: 3, TORCH_NCCL_DUMP_ON_TIMEOUT: 1, TIMEOUT(ms): 600000, "
    "TORCH_NCCL_ENABLE_MONITORING: 1, TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC: 480, watchdog enabled",
    "n1:1234:1234 [0] NCCL INFO NCCL_IB_TIMEOUT set by environment to 22.",
    "store timeout: 0:30:00; process group timeout timed out? no",
    "ConnectionResetError: [Errno 104] Connection reset by peer",
    "urllib3 retrying: Connection closed by peer while downloading shard 17",
    "dataloader: Timed out waiting for worker 3, retrying",
    "ValueError: bad learning rate",
]


@pytest.mark.parametrize(("line", "kind"), REAL)
def test_real_collective_failure_lines_are_recognised(line: str, kind: str) -> None:
    assert match_signature(line) == kind


@pytest.mark.parametrize("line", BENIGN)
def test_lines_that_only_mention_a_timeout_a_store_or_nccl_are_not_failures(line: str) -> None:
    assert match_signature(line) is None


def test_benign_lines_leave_the_attempt_without_a_signature_and_a_real_one_is_kept() -> None:
    """What the supervisor reads: an attempt whose output held only benign lines has no signature, so a later
    application error stays an application error."""
    p = ProgressStream(clock=lambda: 0.0)
    p.reset(("n1", "n2"))
    p.feed_lines([f"{i % 2}: {line}" for i, line in enumerate(BENIGN)])
    assert p.signatures() == []
    p.feed_lines([f"1: {REAL[0][0]}"])
    assert [(s.kind, s.task) for s in p.signatures()] == [("nccl_watchdog", 1)]
