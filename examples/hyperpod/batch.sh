#!/bin/bash
# HyperPod's documented auto-resume recipe, in the shape its docs give: two nodes, no spares, `srun --auto-resume=1`.
# With hpresilience's slurm/srun shim first on PATH, `--auto-resume=1` runs the step under the wrapper:
# a node marked `scontrol update node=X state=fail reason="Action:Replace"` (by an operator or the agent)
# is replaced inside the same job (the repaired node, or any idle node of the partition) and the step
# starts again from the last checkpoint. See docs/auto-resume.md, "The HyperPod recipe".
#
#   sbatch batch.sh
#SBATCH --nodes 2
#SBATCH --exclusive
#SBATCH -o auto-resume-%j.out

srun --auto-resume=1 train_auto_resume.sh
