#!/bin/sh
# Slurm HealthCheckProgram / prolog hook: one pass of the agent's checks with its guard rails.
# Slurm ignores a HealthCheckProgram's exit status, so the agent marks the node itself.
exec /opt/hpresilience/venv/bin/hpresilience --config /etc/hpresilience/config.yaml agent --once
