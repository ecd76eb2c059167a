#!/bin/bash
# A tiny stand-in trainer for the wrapper's tests: rank 0 keeps a checkpoint (the last step done) in
# $CKPT_DIR, every rank prints `step=N` lines, and an attempt resumes after the checkpoint.
# TRAIN_STEPS: steps in all; STEP_SLEEP: seconds per step; FAIL_EXIT: exit with this code at step 2
# (only rank FAIL_RANK when that is set);
# CRASH_AT: rank CRASH_RANK (default 0) crashes at that step on every attempt, with a traceback on stderr that
# names its pid and node and exit code CRASH_EXIT (default 1); CRASH_AT_BY_ATTEMPT: "12 31": attempt k crashes
# at the k-th step listed (none past the list); CKPT_EVERY: rank 0 checkpoints every that many steps (default 1);
# HANG_AT: hang at that step (first attempt); LOSS_SEQ: losses printed per step (first attempt);
# SLOW_RANK / SLOW_SLEEP: that rank sleeps SLOW_SLEEP per step instead (a straggler);
# ORPHAN: start a child in a session of its own (as torchrun starts its workers), which outlives
# a cancelled step where processes are tracked by process group (proctrack/pgid).
set -u
steps=${TRAIN_STEPS:-20}
ckpt="${CKPT_DIR:?}/ckpt"
start=0
[ -f "$ckpt" ] && start=$(cat "$ckpt")
rank=${SLURM_PROCID:-0}
# A notice such as Slurm's --signal=USR1@120: say so and go on (a real trainer would save and exit).
trap 'echo "rank=$rank got SIGUSR1 at step=$s"' USR1
s=0
# A step's "work" is a read that times out on a pipe nobody writes: no `sleep` process per step (thousands of
# fork+execs per suite run, ~20 ms of CPU each on a loaded machine).
exec {idle}<> <(:)
pause() { read -r -t "$1" -u "$idle" _ || true; }
if [ -n "${ORPHAN:-}" ]; then
    setsid bash -c 'while sleep 0.5; do :; done' "orphan-$ORPHAN" &
fi
echo "rank=$rank node=$(hostname -s 2>/dev/null) slurmd=${SLURMD_NODENAME:-?} attempt=${AUTORESUME_ATTEMPT:-?} master=${MASTER_ADDR:-?}:${MASTER_PORT:-?} nodes=${NODE_LIST:-?} resume_from=$start"
for ((s = start + 1; s <= steps; s++)); do
    if [ -n "${FAIL_EXIT:-}" ] && [ "$s" -ge 2 ] && [ "${FAIL_RANK:-$rank}" -eq "$rank" ]; then
        echo "rank=$rank failing with ${FAIL_EXIT}" >&2
        exit "$FAIL_EXIT"
    fi
    crash_at=${CRASH_AT:-}
    if [ -n "${CRASH_AT_BY_ATTEMPT:-}" ]; then
        read -r -a by_attempt <<< "$CRASH_AT_BY_ATTEMPT"
        crash_at=${by_attempt[$(( ${AUTORESUME_ATTEMPT:-1} - 1 ))]:-}
    fi
    if [ -n "$crash_at" ] && [ "$s" -eq "$crash_at" ] && [ "${CRASH_RANK:-0}" -eq "$rank" ]; then
        echo "Traceback (most recent call last):" >&2
        echo "  File \"train.py\", line 88, in <module>" >&2
        echo "RuntimeError: loss exploded at step $s on $(hostname -s 2>/dev/null) (pid $$)" >&2
        exit "${CRASH_EXIT:-1}"
    fi
    if [ -n "${HANG_AT:-}" ] && [ "$s" -eq "$HANG_AT" ] && [ "${AUTORESUME_ATTEMPT:-1}" -eq 1 ]; then
        sleep 1000
    fi
    if [ -n "${SLOW_RANK:-}" ] && [ "$SLOW_RANK" -eq "$rank" ]; then
        pause "${SLOW_SLEEP:?}"
    else
        pause "${STEP_SLEEP:-0.2}"
    fi
    loss=1.0
    if [ -n "${LOSS_SEQ:-}" ] && [ "${AUTORESUME_ATTEMPT:-1}" -eq 1 ]; then
        read -r -a seq <<< "$LOSS_SEQ"
        loss=${seq[$(( (s - 1) % ${#seq[@]} ))]}
    fi
    echo "rank=$rank step=$s loss=$loss"
    if [ "$rank" -eq 0 ] && [ $(( s % ${CKPT_EVERY:-1} )) -eq 0 ]; then
        echo "$s" > "$ckpt.tmp" && mv "$ckpt.tmp" "$ckpt"
    fi
done
echo "rank=$rank training finished step=$steps"
