"""Maintenance reservations and the jobs run inside them: how the controller's `slurm` health gate reaches a
node without ssh, and what the controller's start-up checks read from the running slurmctld.

A MAINT,IGNORE_JOBS reservation on one node keeps every other job off it (they wait with
"ReqNodeNotAvail, ... reserved") while the gate's own job, submitted with --reservation, runs there. It is
created with an end time, so a controller that dies mid-gate leaves nothing behind for longer than that.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence

from hpresilience.errors import SlurmError, SlurmParseError
from hpresilience.log import get_logger
from hpresilience.slurm.client import SlurmClient
from hpresilience.slurm.hostlist import expand
from hpresilience.slurm.parse import parse_oneliner
from hpresilience.slurm.runner import Result

log = get_logger("hpresilience.slurm")
_NO_SUCH_RESERVATION = re.compile(r"Requested reservation is invalid|Invalid reservation", re.IGNORECASE)
ADMIN_LEVELS = ("operator", "administrator")


def minutes(seconds: float) -> int:
    """Slurm's durations are whole minutes: round up, at least one."""
    return max(1, math.ceil(seconds / 60))


def delete_reservation(client: SlurmClient, name: str) -> bool:
    """`scontrol delete reservation=NAME`; False when there was none (an answer, not a failure)."""
    res = client.runner.run("scontrol", "delete", f"reservation={name}", check=False)
    if res.returncode == 0:
        log.info("reservation_deleted", reservation=name)
        return True
    if _NO_SUCH_RESERVATION.search(res.stderr + res.stdout):
        return False
    raise SlurmError(res.argv, res.returncode, res.stderr or res.stdout, f"could not delete reservation {name}")


def create_maintenance_reservation(
    client: SlurmClient, name: str, nodes: Sequence[str], users: Sequence[str], duration_s: float
) -> None:
    """A MAINT,IGNORE_JOBS reservation of `nodes` for `users`, from now for `duration_s` (rounded up to minutes).
    One left over under the same name (a controller killed mid-gate) is replaced."""
    delete_reservation(client, name)
    client.runner.run(
        "scontrol",
        "create",
        "reservation",
        f"ReservationName={name}",
        "StartTime=now",
        f"Duration={minutes(duration_s)}",
        f"Nodes={','.join(nodes)}",
        f"Users={','.join(users)}",
        "Flags=MAINT,IGNORE_JOBS",
    )
    log.info("reservation_created", reservation=name, nodes=",".join(nodes), minutes=minutes(duration_s))


def run_in_reservation(
    client: SlurmClient,
    reservation: str,
    node: str,
    argv: Sequence[str],
    timeout_s: float,
    job_name: str,
    partitions: Sequence[str] = (),
    chdir: str = "/",
) -> Result:
    """Run `argv` as a one-task job on `node` inside `reservation` (`srun`, which returns the job's output and
    exit status to the caller: no shared file system needed). A timeout kills srun and cancels the job.
    `chdir`: the job runs as the controller's user (root), so never in a directory users write (a program
    there would be found by a relative path or as a Python module): `/` by default."""
    args = [
        f"--reservation={reservation}",
        f"--nodelist={node}",
        "--nodes=1",
        "--ntasks=1",
        f"--job-name={job_name}",
        f"--time={minutes(timeout_s)}",
        f"--chdir={chdir}",
        "--kill-on-bad-exit=1",
    ]
    if partitions:
        args.append(f"--partition={','.join(partitions)}")
    try:
        return client.runner.run("srun", *args, "--", *argv, timeout=timeout_s, check=False, retry=False)
    except SlurmError:
        cancel_by_name(client, job_name, reservation)
        raise


def cancel_by_name(client: SlurmClient, job_name: str, reservation: str) -> None:
    """Cancel our own job of that name in that reservation. A job name is anyone's to choose: without
    `--user` (the controller's own uid) root would cancel every user's job named `hpr-gate-<node>`."""
    res = client.runner.run(
        "scancel",
        f"--name={job_name}",
        f"--user={os.getuid()}",
        f"--reservation={reservation}",
        check=False,
        retry=False,
    )
    if res.returncode:
        log.warning("gate_job_not_cancelled", job_name=job_name, error=res.stderr.strip()[:200])


def parse_reservations(text: str) -> list[dict[str, str]]:
    """`scontrol show reservation -o`: one key/value record per reservation ("No reservations" reads as [])."""
    return [parse_oneliner(line) for line in text.splitlines() if line.startswith("ReservationName=")]


def active_reservations_on(client: SlurmClient, node: str) -> list[str]:
    """Names of the reservations active now that hold `node`. Read from the reservation table (its size grows
    with the reservations, not the nodes): a node's RESERVED flag shows only after slurmctld's next pass."""
    res = client.runner.run("scontrol", "show", "reservation", "-o")
    out = []
    for r in parse_reservations(res.stdout):
        try:
            nodes = expand(r.get("Nodes", "")) if r.get("Nodes", "(null)") != "(null)" else []
        except SlurmParseError:
            nodes = []
        if r.get("State") == "ACTIVE" and node in nodes:
            out.append(r.get("ReservationName", "?"))
    return out


# -- what the controller checks at start ------------------------------------------------------------------
def configured(value: str | None) -> str:
    """A `scontrol show config` value, with Slurm's "(null)"/"none" for unset read as ""."""
    v = (value or "").strip()
    return "" if v.lower() in ("(null)", "none", "n/a") else v


def tool_path(client: SlurmClient, tool: str) -> str:
    """Where the client would find a Slurm command (its bin_dir, else PATH)."""
    return client.runner.path_of(tool)


def reboot_program(config: dict[str, str]) -> str:
    """slurmctld's RebootProgram ("" when none: `scontrol reboot` then fails on every node)."""
    return configured(config.get("RebootProgram"))


def reservation_rights_problem(client: SlurmClient, user: str, uid: int, config: dict[str, str]) -> str | None:
    """Why `user` cannot create reservations, or None when it can: root and SlurmUser always can; anyone else
    needs AdminLevel Operator or Administrator in slurmdbd (`sacctmgr show user`)."""
    slurm_user = configured(config.get("SlurmUser")).split("(")[0]
    if uid == 0 or user == slurm_user:
        return None
    if configured(config.get("AccountingStorageType")) in ("", "accounting_storage/none"):
        return (
            f"user {user} is neither root nor SlurmUser ({slurm_user or 'unset'}), and without slurmdbd no "
            "other user may create reservations"
        )
    res = client.runner.run("sacctmgr", "-n", "-P", "show", "user", user, "format=AdminLevel", check=False)
    level = res.stdout.strip().lower()
    if res.returncode == 0 and level in ADMIN_LEVELS:
        return None
    return (
        f"user {user} has AdminLevel {level or 'none'} in slurmdbd; creating reservations needs Operator "
        f"(sacctmgr modify user {user} set AdminLevel=Operator)"
    )
