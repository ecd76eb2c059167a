"""`hpresilience epilog`: Slurm's Epilog on compute nodes; removes the memory-tier checkpoints of the job
that just ended on this node (a clean end already removed them through `close()`; a crash did not), and
a tier root another user made under the job's user's name (a squat that makes every save fail).

Slurm runs it as root with SLURM_JOB_ID and SLURM_JOB_UID set. It always exits 0: a failing Epilog
drains the node, and a leftover folder is not worth a node. No torch is needed on the node.
"""

from __future__ import annotations

import os

import click

from hpresilience.commands.context import Ctx, pass_ctx
from hpresilience.torch.cleanup import DEFAULT_ROOT, remove_job_tiers


@click.command("epilog")
@click.option(
    "--memory-root",
    default=DEFAULT_ROOT,
    show_default=True,
    help="The checkpoint memory_dir pattern jobs use ({uid}: the job's user).",
)
@click.option("--job-id", envvar="SLURM_JOB_ID", default="", help="Default: $SLURM_JOB_ID.")
@click.option("--uid", "uid_text", envvar="SLURM_JOB_UID", default="", help="Default: $SLURM_JOB_UID.")
@click.option(
    "--gid",
    "gid_text",
    envvar="SLURM_JOB_GID",
    default="",
    help="Group of a tier root made again (default: $SLURM_JOB_GID).",
)
@pass_ctx
def epilog(c: Ctx, memory_root: str, job_id: str, uid_text: str, gid_text: str) -> None:
    """Remove the memory-tier checkpoints a finished job left on this node."""
    if not job_id.isdigit() or not _id(uid_text):
        c.emit(
            {"removed": [], "skipped": "no SLURM_JOB_ID/SLURM_JOB_UID"},
            "hpresilience epilog: no SLURM_JOB_ID/SLURM_JOB_UID; nothing to do",
        )
        return
    try:
        gid = int(gid_text) if _id(gid_text) else -1
        removed = remove_job_tiers(job_id, int(uid_text), memory_root, gid)
    except OSError as err:  # never fail the epilog: that would drain the node
        click.echo(f"hpresilience epilog: could not clean up job {job_id}: {err}", err=True)
        return
    c.emit(
        {"removed": [{"folder": r.folder, "bytes": r.bytes, "squatter_uid": r.squatter_uid} for r in removed]},
        "\n".join(f"removed {r.folder} ({r.bytes} bytes{_squat(r.squatter_uid)})" for r in removed)
        or f"hpresilience epilog: job {job_id} left no memory tier on {os.uname().nodename}",
    )


def _squat(uid: int | None) -> str:
    return "" if uid is None else f", made by uid {uid} to squat the job user's tier root"


def _id(text: str) -> bool:
    """A uid or gid the kernel can take (os.fchown raises OverflowError, not OSError, past 32 bits)."""
    return text.isascii() and text.isdigit() and int(text) < 2**32 - 1
