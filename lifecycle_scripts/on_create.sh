#!/usr/bin/env bash
# Cluster-creation set-up for hpresilience, run as root on every node by the provisioning system
# (HyperPod lifecycle scripts, slurm-gcp start-up scripts, cloud-init, Ansible, ...).
#
#   on_create.sh [compute|controller|login|auto] [--wheel FILE | --source git+URL@COMMIT] [--config FILE]
#
# With no role (HyperPod's OnCreate calls it without arguments) the role comes from
# /opt/ml/config/resource_config.json and provisioning_parameters.json beside this script.
# With no --wheel, the one hpresilience-*.whl beside this script is used (upload it with the scripts).
# Never a bare `pip install hpresilience`: that name is not claimed on PyPI, and this runs as root.
#
# Everything else (PATH entries, units, healthcheck.sh, the config, validated first) is done by
# `hpresilience install`, which is idempotent: run this again to upgrade.
set -euo pipefail
role=auto
case "${1:-}" in compute|controller|login|auto) role=$1; shift ;; esac
here=$(cd "$(dirname "$0")" && pwd)
prefix=/opt/hpresilience
python=${PYTHON:-python3}
wheel=""
source=""
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --wheel) wheel=$2; shift 2 ;;
    --source) source=$2; shift 2 ;;
    --config) args+=(--config "$2"); shift 2 ;;
    --prefix) prefix=$2; args+=(--prefix "$2"); shift 2 ;;
    *) echo "on_create.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
say() { printf '[hpresilience on_create %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

if [ -z "$wheel" ] && [ -z "$source" ]; then
  shopt -s nullglob
  found=("$here"/hpresilience-*.whl)
  if [ "${#found[@]}" -ne 1 ]; then
    echo "on_create.sh: give --wheel FILE or --source git+URL@COMMIT (found ${#found[@]} hpresilience-*.whl" \
         "beside $0; a bare name from a package index is refused)" >&2
    exit 2
  fi
  wheel=${found[0]}
fi
if [ "$role" = auto ]; then
  args+=(--provisioning-parameters "$here/provisioning_parameters.json")
fi
spec=${wheel:-$source}
if [ ! -x "$prefix/venv/bin/hpresilience" ]; then
  # Bootstrap only: the installer needs itself to run. It checks the Python version before anything else.
  "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
    echo "on_create.sh: $python is older than 3.11; set PYTHON=/usr/bin/python3.11" >&2; exit 3; }
  say "creating $prefix/venv from $spec"
  "$python" -m venv "$prefix/venv"
  # The `node` extra: the agent's, controller's and installer's dependencies (the base package is the
  # training library's small set).
  if [ -n "$wheel" ]; then req="$wheel[node]"; else req="hpresilience[node] @ $source"; fi
  "$prefix/venv/bin/pip" install -q "$req"
fi
if [ -n "$wheel" ]; then src=(--wheel "$wheel"); else src=(--source "$source"); fi
say "hpresilience install --role $role ${src[*]} ${args[*]}"
exec "$prefix/venv/bin/hpresilience" install --role "$role" "${src[@]}" "${args[@]}"
