#!/bin/bash
# HyperPod's train_auto_resume.sh: every attempt recomputes the node list and the master address from the
# job itself (`scontrol show jobid`), since a relaunched step may run on other nodes than the first one.

# The job's nodes (the `NodeList=` line; `grep -v Exc` drops `ExcNodeList=`).
NODE_LIST=$(scontrol show jobid=$SLURM_JOBID | awk -F= '/NodeList=/{print $2}' | grep -v Exc)
MASTER_NODE=$(scontrol show hostname $NODE_LIST | head -n 1)
# The first node's address as Slurm knows it (not DNS of its name).
MASTER_ADDR=$(scontrol show node=$MASTER_NODE | awk -F= '/NodeAddr=/{print $2}' | awk '{print $1}')

echo "node=$SLURMD_NODENAME node_rank=$SLURM_NODEID nnodes=$SLURM_NNODES NODE_LIST=$NODE_LIST MASTER_ADDR=$MASTER_ADDR"

torchrun --nnodes=$SLURM_NNODES --nproc_per_node=1 --node_rank=$SLURM_NODEID \
    --master-addr=$MASTER_ADDR --master_port=1234 \
    "$(dirname "$0")/train.py"
