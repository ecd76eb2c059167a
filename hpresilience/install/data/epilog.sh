#!/bin/sh
# Slurm Epilog (compute nodes): remove the checkpoint memory tier (/dev/shm/hpresilience-<uid>/<namespace>)
# of the job that just ended here. A clean end already did (TieredCheckpointer.close()); a crashed or
# killed job did not, and its tier would hold the node's RAM. Always exits 0 (a failing Epilog drains
# the node).
@VENV@/bin/hpresilience epilog >/dev/null 2>&1 || true
exit 0
