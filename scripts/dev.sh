#!/usr/bin/env bash
# Set-up and run, on a fresh Debian 12 machine as root (idempotent; fast when already set up).
#   bash scripts/dev.sh demo   install, then run the main job on the embedded local Slurm cluster
#   bash scripts/dev.sh test   install, then run the whole test suite (ruff check and format, mypy strict, pytest on
#                              HPRESILIENCE_TEST_WORKERS (4) workers), and beside it the Slurm-facing integration tests
#                              again on Slurm 24.11 and 26.05, each inside its Debian root (built on first use with
#                              debootstrap, cached in /var/cache/hpresilience/roots); prints the time of each phase.
#                              HPRESILIENCE_TEST_RELEASES="24.11" picks the releases, "" runs only the host's 22.05
#   bash scripts/dev.sh setup  install only
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=$ROOT/.venv
APT_PACKAGES="slurm-wlm slurmdbd mariadb-server stress-ng python3-venv prometheus debootstrap iproute2"
# The integration tests run again on these releases (hpresilience devcluster up --slurm).
RELEASES=${HPRESILIENCE_TEST_RELEASES-24.11 26.05}
# pytest-xdist workers for the 22.05 suite: the tests mostly wait on Slurm, so more workers than cores pay. Each worker
# runs its own devcluster on its own block of 1000 ports above the base (tests/conftest.py).
WORKERS=${HPRESILIENCE_TEST_WORKERS-4}
# The releases' runs take the blocks above the workers' (the default base 18817 plus 1000 per worker).
RELEASE_BASE_PORT=$((${HPRESILIENCE_TEST_BASE_PORT-18817} + 1000 * WORKERS))
# What the newer releases run: the integration tests whose outcome depends on how Slurm answers (the client's
# queries, the devcluster, the wrapper and the recipe, the controller's repairs). Left to 22.05: the agent's own
# loop, the controller's CLI and limits, the 10,000-node table, install and the demo, which ask Slurm the same
# few things the tests here pin per release.
RELEASE_TESTS=(-m integration tests/slurm/test_client_filtered.py tests/testing/test_devcluster.py
  tests/testing/test_slurmroot.py tests/autoresume/test_recipe_integration.py
  tests/autoresume/test_wrapper_integration.py tests/autoresume/test_capacity.py tests/autoresume/test_spares.py
  tests/autoresume/test_poll_queries.py
  tests/controller/test_repair_devcluster.py tests/controller/test_controller_queries.py
  tests/agent/test_agent_queries.py tests/autoresume/test_nudge_integration.py
  tests/slurm/test_accounting_hostile.py tests/controller/test_slurm_features.py
  # Recovery without rollback (per-node steps, a warm standby taken, a step cancelled by name, the liveness probe)
  # when a node dies outright: what Slurm does with a per-node step of a dead node differs by release.
  tests/autoresume/test_inprocess_integration.py::test_a_node_that_dies_outright_is_replaced_in_process_long_before_slurmd_timeout
  # Nodes as hosts on each release (--isolation netns in the root): the two partition tests, about 30 s with the
  # module's cluster.
  tests/testing/test_netns_integration.py::test_a_partitioned_node_is_unreachable_while_its_processes_run_and_heal_restores_it
  tests/testing/test_netns_integration.py::test_a_partitioned_training_node_is_replaced_by_the_spare_and_its_old_tasks_die_once_healed)

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
    test_started=$SECONDS
    phases=()
    last=$SECONDS
    phase() { phases+=("$1: $((SECONDS - last)) s"); last=$SECONDS; }
    setup
    phase "set-up"
    shift
    # The suite starts thousands of Python processes (the CLI, the wrapper, pytest's workers and their collection);
    # with PYTHONDONTWRITEBYTECODE set (as some images do) each would compile what it imports again. The caches go
    # to __pycache__ folders git ignores.
    unset PYTHONDONTWRITEBYTECODE
    # Short: slurmstepd makes Unix sockets (108 bytes at most) in spool directories below the tests' temporary ones.
    logs=$(mktemp -d /tmp/hpr.XXXXXX)
    say "ruff (lint, then format: --check only, \`ruff format\` fixes it)"
    "$VENV/bin/ruff" check hpresilience tests bench examples
    "$VENV/bin/ruff" format --check hpresilience tests bench examples
    say "mypy --strict (package)"
    "$VENV/bin/mypy"
    say "mypy --strict (tests)"
    "$VENV/bin/mypy" tests
    phase "ruff and mypy"
    # The newer releases' roots (built on first use, then cached), before anything runs beside them.
    for release in $RELEASES; do
      "$VENV/bin/hpresilience" devcluster exec --slurm "$release" -- true >"$logs/root-$release.log" 2>&1 \
        || { say "building the Slurm $release root failed:"; cat "$logs/root-$release.log" >&2; exit 1; }
    done
    phase "Slurm roots"
    # Arguments (a file, -k ...) select within the integration tests on every release; none: the list above.
    if [ $# -gt 0 ]; then selection=(-m integration "$@"); else selection=("${RELEASE_TESTS[@]}"); fi
    # Each release runs beside the 22.05 suite, in its own root, on its own block of ports (below Linux's ephemeral
    # range, 32768+, and above the 22.05 workers' blocks: tests/conftest.py) with its own pytest and MariaDB
    # temporary directories.
    i=0
    phase_start_releases=$SECONDS
    for release in $RELEASES; do
      say "pytest: Slurm-facing integration tests on Slurm $release (inside its Debian root, in the background)"
      (
        r=0
        HPRESILIENCE_TEST_BASE_PORT=$((RELEASE_BASE_PORT + 1000 * i)) \
          "$VENV/bin/hpresilience" devcluster exec --slurm "$release" -- "$VENV/bin/python" -m pytest -q \
          -p no:cacheprovider --basetemp="$logs/$release" --slurm "$release" "${selection[@]}" \
          >"$logs/pytest-$release.log" 2>&1 || r=$?
        echo "$r $SECONDS" >"$logs/rc-$release"
      ) &
      i=$((i + 1))
    done
    say "pytest (Slurm 22.05, the host's; $WORKERS workers)"
    rc=0
    "$VENV/bin/python" -m pytest -q -n "$WORKERS" --dist loadfile --no-loadscope-reorder "$@" || rc=$?
    phase "pytest, Slurm 22.05"
    wait
    for release in $RELEASES; do
      read -r r ended <"$logs/rc-$release"
      say "pytest on Slurm $release (ended $((ended - phase_start_releases)) s after it started):"
      cat "$logs/pytest-$release.log"
      # 5: nothing selected (arguments naming only unit tests)
      if [ "$r" != 0 ] && [ "$r" != 5 ]; then rc=$r; fi
      phases+=("pytest, Slurm $release (beside 22.05): $((ended - phase_start_releases)) s")
    done
    phase "waiting for the releases"
    say "time per phase:"
    printf '  %s\n' "${phases[@]}" >&2
    say "total: $((SECONDS - test_started)) s"
    # The releases' clusters, spools and logs (hundreds of MB a run): kept only when something failed.
    if [ "$rc" = 0 ]; then rm -rf "$logs"; else say "the releases' test directories are kept in $logs"; fi
    exit "$rc"
    ;;
  *) echo "usage: bash scripts/dev.sh demo|test|setup" >&2; exit 2 ;;
esac
