#!/usr/bin/env bash
# Set-up and run, on a fresh Debian 12 machine as root (idempotent; fast when already set up).
#   bash scripts/dev.sh demo   install, then run the main job on the embedded local Slurm cluster
#   bash scripts/dev.sh test   install, then run the whole test suite (ruff, mypy strict, pytest)
#   bash scripts/dev.sh setup  install only
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=$ROOT/.venv
APT_PACKAGES="slurm-wlm slurmdbd mariadb-server stress-ng python3-venv prometheus"

say() { printf '[dev.sh %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

need_apt() {
  for tool in slurmctld slurmd slurmdbd srun scontrol sinfo squeue sacct stress-ng mariadbd mariadb-install-db promtool; do
    command -v "$tool" >/dev/null 2>&1 || return 0
  done
  python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || return 0
  return 1
}

setup() {
  if need_apt; then
    if [ "$(id -u)" != 0 ]; then say "missing Debian packages; run as root or: apt-get install -y $APT_PACKAGES"; exit 3; fi
    say "installing Debian packages: $APT_PACKAGES"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq $APT_PACKAGES >/dev/null
  fi
  local stamp="$VENV/.hpresilience-installed"
  local want
  want=$(cat pyproject.toml setup.cfg | sha256sum | cut -c1-16)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return; fi
  [ -x "$VENV/bin/python" ] || { say "creating $VENV"; python3 -m venv "$VENV"; }
  say "installing torch 2.13.0 (CPU build) and hpresilience[node,test,torch] into $VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  # torch first, pinned: a range in the extras that 2.13.0 satisfies then pulls nothing (never CUDA wheels).
  "$VENV/bin/python" -m pip install -q torch==2.13.0
  "$VENV/bin/python" -m pip install -q -e ".[node,test,torch]"
  echo "$want" > "$stamp"
}

cmd=${1:-}
case "$cmd" in
  setup) setup ;;
  demo)
    setup
    shift
    exec "$VENV/bin/hpresilience" demo "$@"
    ;;
  test)
    setup
    shift
    say "ruff"
    "$VENV/bin/ruff" check hpresilience tests bench
    say "mypy --strict (package)"
    "$VENV/bin/mypy"
    say "pytest"
    exec "$VENV/bin/python" -m pytest -q "$@"
    ;;
  *) echo "usage: bash scripts/dev.sh demo|test|setup" >&2; exit 2 ;;
esac
