#!/usr/bin/env bash
# Creates one venv per peer under benchmarks/peers/.venvs/<peer> (git-ignored), installs torch==2.13.0 first,
# then the peer and gymnasium with torch pinned by constraints.txt, and records in .venvs/<peer>/STATUS
# "ok" or "failed: <reason>" for run.py. A peer that fails is reported and the others go on.
#
# Usage: bash benchmarks/peers/install.sh [peer ...]   (default: all of them)
# Peers: sample_factory rllib pufferlib torchrl gymnasium_async
# PYTHON picks the interpreter (default: python3.11, the one torch 2.13.0's local wheel is built for).
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENVS="$HERE/.venvs"
CONSTRAINTS="$HERE/constraints.txt"
PYTHON="${PYTHON:-python3.11}"
ALL_PEERS=(gymnasium_async sample_factory rllib pufferlib torchrl)
PEERS=("$@")
[ ${#PEERS[@]} -eq 0 ] && PEERS=("${ALL_PEERS[@]}")

# What each peer installs after torch (pip requirement specifiers).
peer_packages() {
  case "$1" in
    gymnasium_async) echo "gymnasium" ;;
    sample_factory) echo "sample-factory gymnasium" ;;
    rllib) echo "ray[rllib] gymnasium" ;;
    pufferlib) echo "pufferlib gymnasium" ;;
    torchrl) echo "torchrl tensordict gymnasium" ;;
    *) return 1 ;;
  esac
}

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
  fail() {  # fail <reason>: record why this peer did not install
    local reason="$1 ($(grep -E '^(ERROR|error):' "$log" | tail -n 1 | cut -c1-240))"
    echo "failed: $reason" > "$venv/STATUS"
    RESULT[$peer]="failed: $reason"
    echo "   $peer did not install: $reason"
  }
  rm -rf "$venv"
  : > "$log"
  if ! "$PYTHON" -m venv "$venv" >> "$log" 2>&1; then
    mkdir -p "$venv"; fail "could not create a venv with $PYTHON"; continue
  fi
  pip=("$venv/bin/python" -m pip install --no-input -c "$CONSTRAINTS")
  "${pip[@]}" --upgrade pip setuptools wheel >> "$log" 2>&1 || true
  if ! "${pip[@]}" torch==2.13.0 >> "$log" 2>&1; then fail "pip install torch==2.13.0 failed"; continue; fi
  # shellcheck disable=SC2086  # packages is a space-separated list on purpose
  if ! "${pip[@]}" $packages >> "$log" 2>&1; then
    # source builds (pufferlib's C extension) need torch and numpy in the build env: retry without isolation
    # shellcheck disable=SC2086
    if ! "${pip[@]}" --no-build-isolation numpy cython $packages >> "$log" 2>&1; then
      fail "pip install $packages failed"; continue
    fi
  fi
  torch_version="$("$venv/bin/python" -c 'import torch; print(torch.__version__)' 2>> "$log")"
  if [ "${torch_version%%+*}" != "2.13.0" ]; then fail "torch is '$torch_version', not 2.13.0"; continue; fi
  if ! "$venv/bin/python" "$HERE/${peer}_throughput.py" --check >> "$log" 2>&1; then
    fail "installed, but '${peer}_throughput.py --check' failed: see the log"; continue
  fi
  versions="$("$venv/bin/python" "$HERE/${peer}_throughput.py" --check 2>/dev/null | tail -n 1)"
  echo "ok $versions" > "$venv/STATUS"
  RESULT[$peer]="ok $versions"
  echo "   $peer installed: $versions"
done

echo
echo "| peer | install |"
echo "|---|---|"
for peer in "${PEERS[@]}"; do echo "| $peer | ${RESULT[$peer]:-?} |"; done
