#!/usr/bin/env bash
# The main job for now: collect CartPole rollouts on distributed actors (embedded Redis, local
# workers) and print throughput and episode stats. Extra arguments go to `rqrl demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. "${RQRL_VENV:-.venv}/bin/activate"
exec rqrl demo "$@"
