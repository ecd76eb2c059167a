"""PID 1 of a devcluster node's PID namespace (`devcluster up --isolation netns`).

    python -I -S nsinit.py ARGV...

Started by `unshare --pid --fork --mount-proc`, it starts ARGV (slurmd, which forks into the background) and then
does what an init does: reaps every process that ends in the namespace (slurmd's daemon and the slurmstepds it
starts are reparented here) until none is left, then exits, which ends the namespace. It must outlive slurmd:
a killed slurmd (a crashed daemon) leaves its steps running, as on a real host. SIGTERM and SIGINT are passed to
every process of the namespace, so that `kill` of this process stops the node.

Standard library only, run as `python -I -S` on a path: no package import per node start.
"""

from __future__ import annotations

import os
import signal
import sys


def _forward(signum: int, _frame: object) -> None:
    # kill(-1) from PID 1 of a namespace reaches every other process in it.
    try:
        os.kill(-1, signum)
    except OSError:
        pass


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: nsinit.py ARGV...", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _forward)
    signal.signal(signal.SIGINT, _forward)
    child = os.fork()
    if child == 0:
        try:
            os.execvp(argv[0], argv)
        except OSError as e:
            print(f"nsinit.py: {argv[0]}: {e}", file=sys.stderr)
            os._exit(127)
    rc = 0
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return rc
        except InterruptedError:
            continue
        if pid == child:
            rc = os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
