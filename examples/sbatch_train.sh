#!/bin/bash
# Copy and adapt: a 2-node training job that survives node failures with srun --auto-resume.
#
#   sbatch examples/sbatch_train.sh
#
# --nodes=3 with --auto-resume-spares=1: the step runs on 2 nodes and the third waits as a hot spare,
# so a failed node is replaced in seconds without asking Slurm for anything.
# --no-kill: a node that dies is removed from the job instead of ending it.
# --requeue: if no replacement can be had, the wrapper may requeue the job (same job id); it picks up
# its attempt count and blamed nodes from the state file under $SLURM_SUBMIT_DIR/.hpresilience/jobs.
# On Slurm 25.11+ with SlurmctldParameters=enable_expedited_requeue, --requeue=expedite instead: Slurm starts
# the requeued job again at once by itself (older sbatch refuses the option).
#SBATCH --job-name=train-gloo
#SBATCH --nodes=3
#SBATCH --ntasks-per-node=1
#SBATCH --no-kill
#SBATCH --requeue
#SBATCH --output=train-%j.out

set -euo pipefail

# Each attempt gets, from the wrapper: NODE_LIST (rank order), NNODES, MASTER_ADDR (the first node's
# NodeAddr), MASTER_PORT (new every attempt), WORLD_SIZE, AUTORESUME_ATTEMPT, AUTORESUME_RESTARTS and a
# refreshed SLURM_JOB_NODELIST / SLURM_NNODES. Tasks are laid out in NODE_LIST order, so SLURM_PROCID is
# the global rank and SLURM_PROCID / NTASKS_PER_NODE the node rank. Do not rely on the batch script's
# own SLURM_JOB_NODELIST: it is not updated when the allocation changes.
export HPR_CKPT_DIR=${HPR_CKPT_DIR:-/dev/shm/hpresilience-$(id -u)}   # the checkpoint memory tier (per user)

# With the slurm/srun shim installed, this line can read `srun --auto-resume=1 ...` instead.
hpresilience srun --auto-resume=1 --auto-resume-spares=1 \
    --nodes=2 --ntasks-per-node=1 \
    python examples/train_gloo.py --steps 200
