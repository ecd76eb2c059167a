#!/usr/bin/env bash
# Cluster-creation set-up for hpresilience, run on every node by the provisioning system
# (HyperPod lifecycle scripts, slurm-gcp start-up scripts, cloud-init, Ansible, ...).
#
#   on_create.sh compute|controller [--config FILE] [--wheel FILE_OR_SPEC]
#
# compute:    installs the package, the agent unit and the srun shim; enables the agent.
# controller: installs the package and the controller unit; enables the controller.
set -euo pipefail
role=${1:-}
shift || true
config=""
spec="hpresilience"
while [ $# -gt 0 ]; do
  case "$1" in
    --config) config=$2; shift 2 ;;
    --wheel) spec=$2; shift 2 ;;
    *) echo "on_create.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
case "$role" in compute|controller) ;; *) echo "usage: on_create.sh compute|controller [--config FILE]" >&2; exit 2 ;; esac
here=$(cd "$(dirname "$0")" && pwd)
prefix=/opt/hpresilience

say() { printf '[hpresilience on_create %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

say "installing into $prefix/venv"
python3 -m venv "$prefix/venv"
"$prefix/venv/bin/pip" install -q "$spec"
install -d -m 0755 /etc/hpresilience
if [ -n "$config" ]; then install -m 0644 "$config" /etc/hpresilience/config.yaml; fi
# Fail early on a bad configuration, naming the file and key, rather than at service start.
"$prefix/venv/bin/hpresilience" config show >/dev/null

if [ "$role" = compute ]; then
  install -m 0644 "$here/hpresilience-agent.service" /etc/systemd/system/
  # The srun shim goes ahead of the real srun; without --auto-resume it execs the real one untouched.
  if [ -f "$here/../slurm/srun" ]; then install -m 0755 "$here/../slurm/srun" /usr/local/bin/srun; fi
  systemctl daemon-reload
  systemctl enable --now hpresilience-agent.service
  say "agent enabled; srun shim at /usr/local/bin/srun"
else
  if [ -f "$here/hpresilience-controller.service" ]; then
    install -m 0644 "$here/hpresilience-controller.service" /etc/systemd/system/
    systemctl daemon-reload
    systemctl enable --now hpresilience-controller.service
  fi
  say "controller enabled"
fi
