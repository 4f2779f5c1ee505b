#!/usr/bin/env bash
# Creates one venv per peer under benchmarks/peers/.venvs/<peer> (git-ignored), installs torch==2.13.0 first,
# then the peer and gymnasium with torch pinned by constraints.txt, and records in .venvs/<peer>/STATUS
# "ok" or "failed: <reason>" for run.py. A peer that fails is reported and the others go on.
#
# Usage: bash benchmarks/peers/install.sh [peer ...]   (default: all of them)
#        CHECK_ONLY=1 bash benchmarks/peers/install.sh   re-runs only the import check of existing venvs
# Peers: sample_factory rllib pufferlib torchrl gymnasium_async envpool
# The peers with an Atari path (run.py --workload atari) get ale-py (its PyPI wheels ship the ROMs) and
# opencv-python-headless (gymnasium's AtariPreprocessing resizes with cv2), and their check makes and steps one
# ALE/Pong-v5 env; EnvPool (Atari only here) brings its own emulator and ROMs (envpool-assets).
# PufferLib 3.0.0 (and 2.0.x) ship only an sdist whose setup.py downloads raylib from GitHub while building, so
# it does not install where only package registries are reachable; install.sh records that as its reason.
# PYTHON picks the interpreter (default: python3.11, the one torch 2.13.0's local wheel is built for).
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENVS="$HERE/.venvs"
CONSTRAINTS="$HERE/constraints.txt"
PYTHON="${PYTHON:-python3.11}"
ALL_PEERS=(gymnasium_async sample_factory rllib pufferlib torchrl envpool)
PEERS=("$@")
[ ${#PEERS[@]} -eq 0 ] && PEERS=("${ALL_PEERS[@]}")

# What each peer installs after torch (pip requirement specifiers).
peer_packages() {
  case "$1" in
    gymnasium_async) echo "gymnasium" ;;
    sample_factory) echo "sample-factory gymnasium ale-py opencv-python-headless" ;;
    rllib) echo "ray[rllib] gymnasium ale-py opencv-python-headless" ;;
    pufferlib) echo "pufferlib gymnasium" ;;
    torchrl) echo "torchrl tensordict gymnasium" ;;
    envpool) echo "envpool" ;;
    *) return 1 ;;
  esac
}

# The workloads each peer's script has a path for (run.py --workload), each checked after the install.
peer_workloads() {
  case "$1" in
    sample_factory|rllib) echo "cartpole atari" ;;
    envpool) echo "atari" ;;
    *) echo "cartpole" ;;
  esac
}

# -c reaches pip's resolver, PIP_CONSTRAINT also the isolated environments that build sdists (which may ask for
# torch, as pufferlib's does): no torch but 2.13.0 anywhere.
export PIP_CONSTRAINT="$CONSTRAINTS"
mkdir -p "$VENVS"
declare -A RESULT
for peer in "${PEERS[@]}"; do
  if ! packages="$(peer_packages "$peer")"; then
    echo "unknown peer '$peer'; expected one of: ${ALL_PEERS[*]}" >&2
    exit 2
  fi
  venv="$VENVS/$peer"
  log="$venv.install.log"
  echo "== $peer: $packages (log: $log)"
  fail() {  # fail <reason>: record why this peer did not install, with the telling line of its log
    local cause
    cause="$(grep -E 'URLError|gaierror|No matching distribution|ResolutionImpossible|conflicting dependencies|ModuleNotFoundError|Could not find a version' "$log" | tail -n 1 | sed 's/^ *//' | cut -c1-200)"
    [ -z "$cause" ] && cause="$(grep -E '^(ERROR|error):' "$log" | tail -n 1 | cut -c1-200)"
    case "$cause" in
      *URLError*|*gaierror*) cause="its build downloads from outside the package registries: $cause" ;;
    esac
    local reason="$1${cause:+ ($cause)}"
    echo "failed: $reason" > "$venv/STATUS"
    RESULT[$peer]="failed: $reason"
    echo "   $peer did not install: $reason"
  }
  if [ -z "${CHECK_ONLY:-}" ]; then
    rm -rf "$venv"
    : > "$log"
    if ! "$PYTHON" -m venv "$venv" >> "$log" 2>&1; then
      mkdir -p "$venv"; fail "could not create a venv with $PYTHON"; continue
    fi
    pip=("$venv/bin/python" -m pip install --no-input -c "$CONSTRAINTS")
    "${pip[@]}" --upgrade pip setuptools wheel >> "$log" 2>&1 || true
    if ! "${pip[@]}" torch==2.13.0 >> "$log" 2>&1; then fail "pip install torch==2.13.0 failed"; continue; fi
    # shellcheck disable=SC2086  # packages is a space-separated list on purpose
    if ! "${pip[@]}" $packages >> "$log" 2>&1; then fail "pip install $packages failed"; continue; fi
  elif [ ! -x "$venv/bin/python" ]; then
    mkdir -p "$venv"; fail "CHECK_ONLY=1 but no venv at $venv"; continue
  elif grep -q "^failed: pip install\|^failed: could not" "$venv/STATUS" 2>/dev/null; then
    RESULT[$peer]="$(cat "$venv/STATUS")"; continue
  fi
  torch_version="$("$venv/bin/python" -c 'import torch; print(torch.__version__)' 2>> "$log")"
  if [ "${torch_version%%+*}" != "2.13.0" ]; then fail "torch is '$torch_version', not 2.13.0"; continue; fi
  checked=1
  for workload in $(peer_workloads "$peer"); do
    if ! "$venv/bin/python" "$HERE/${peer}_throughput.py" --check --workload "$workload" >> "$log" 2>&1; then
      fail "installed, but '${peer}_throughput.py --check --workload $workload' failed: see the log"
      checked=0; break
    fi
  done
  [ "$checked" = 1 ] || continue
  versions="$("$venv/bin/python" "$HERE/${peer}_throughput.py" --check --workload "$workload" 2>/dev/null | tail -n 1)"
  echo "ok $versions" > "$venv/STATUS"
  RESULT[$peer]="ok $versions"
  echo "   $peer installed: $versions"
done

echo
echo "| peer | install |"
echo "|---|---|"
for peer in "${PEERS[@]}"; do echo "| $peer | ${RESULT[$peer]:-?} |"; done
