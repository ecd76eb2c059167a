#!/bin/sh
# Slurm HealthCheckProgram / prolog hook: one pass of the agent's checks with its guard rails.
# Slurm ignores a HealthCheckProgram's exit status, so the agent marks the node itself. Stress checks
# run only when due by the agent's state file, shared with the agent daemon, so every idle node is not
# stress-tested every HealthCheckInterval (Slurm kills a HealthCheckProgram after 60 s).
exec @VENV@/bin/hpresilience --config @CONFIG@ agent --once
