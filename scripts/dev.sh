#!/usr/bin/env bash
# Set-up and run, on a fresh Debian 12 machine as root (idempotent; fast when already set up).
#   bash scripts/dev.sh demo   install, then run the main job on the embedded local Slurm cluster
#   bash scripts/dev.sh test   install, then run the whole test suite (ruff check and format, mypy strict, pytest), then the
#                              Slurm-facing integration tests again on Slurm 24.11 and 26.05, each inside its Debian
#                              root (built on first use with debootstrap, cached in /var/cache/hpresilience/roots);
#                              HPRESILIENCE_TEST_RELEASES="24.11" picks the releases, "" runs only the host's 22.05
#   bash scripts/dev.sh setup  install only
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=$ROOT/.venv
APT_PACKAGES="slurm-wlm slurmdbd mariadb-server stress-ng python3-venv prometheus debootstrap iproute2"
# The integration tests run again on these releases (hpresilience devcluster up --slurm).
RELEASES=${HPRESILIENCE_TEST_RELEASES-24.11 26.05}
# What the newer releases run: the integration tests whose outcome depends on how Slurm answers (the client's
# queries, the devcluster, the wrapper and the recipe, the controller's repairs). Left to 22.05: the agent's own
# loop, the controller's CLI and limits, the 10,000-node table, install and the demo, which ask Slurm the same
# few things the tests here pin per release.
RELEASE_TESTS=(-m integration tests/slurm/test_client_filtered.py tests/testing/test_devcluster.py
  tests/testing/test_slurmroot.py tests/autoresume/test_recipe_integration.py
  tests/autoresume/test_wrapper_integration.py tests/autoresume/test_capacity.py tests/autoresume/test_poll_queries.py
  tests/controller/test_repair_devcluster.py tests/controller/test_controller_queries.py
  tests/agent/test_agent_queries.py tests/autoresume/test_nudge_integration.py
  tests/slurm/test_accounting_hostile.py)

say() { printf '[dev.sh %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

need_apt() {
  for tool in slurmctld slurmd slurmdbd srun scontrol sinfo squeue sacct stress-ng mariadbd mariadb-install-db promtool \
      debootstrap ip tc; do
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
  # --copies: inside a Slurm root /usr/bin/python3 is the root's own Python; the venv carries its interpreter.
  [ -x "$VENV/bin/python" ] || { say "creating $VENV"; python3 -m venv --copies "$VENV"; }
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
    say "ruff (lint, then format: --check only, \`ruff format\` fixes it)"
    "$VENV/bin/ruff" check hpresilience tests bench examples
    "$VENV/bin/ruff" format --check hpresilience tests bench examples
    say "mypy --strict (package)"
    "$VENV/bin/mypy"
    say "mypy --strict (tests)"
    "$VENV/bin/mypy" tests
    # The newer releases' roots are built (first time only) while the 22.05 suite runs.
    roots_log=$(mktemp)
    ( for release in $RELEASES; do "$VENV/bin/hpresilience" devcluster exec --slurm "$release" -- true; done ) \
      >"$roots_log" 2>&1 &
    roots_pid=$!
    say "pytest (Slurm 22.05, the host's)"
    rc=0
    "$VENV/bin/python" -m pytest -q "$@" || rc=$?
    if ! wait "$roots_pid"; then say "building the Slurm roots failed:"; cat "$roots_log" >&2; exit 1; fi
    rm -f "$roots_log"
    # Arguments (a file, -k ...) select within the integration tests on every release; none: the list above.
    if [ $# -gt 0 ]; then selection=(-m integration "$@"); else selection=("${RELEASE_TESTS[@]}"); fi
    # One release after the other: two MariaDBs (one per root) share the bound /tmp and each clears the other's
    # temporary tables at start (`mariadb-install-db`: "Could not remove temporary table").
    for release in $RELEASES; do
      say "pytest: Slurm-facing integration tests on Slurm $release (inside its Debian root)"
      r=0
      "$VENV/bin/hpresilience" devcluster exec --slurm "$release" -- \
        "$VENV/bin/python" -m pytest -q -p no:cacheprovider --slurm "$release" "${selection[@]}" || r=$?
      # 5: nothing selected (arguments naming only unit tests)
      if [ "$r" != 0 ] && [ "$r" != 5 ]; then rc=$r; fi
    done
    exit "$rc"
    ;;
  *) echo "usage: bash scripts/dev.sh demo|test|setup" >&2; exit 2 ;;
esac
