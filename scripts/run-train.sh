#!/usr/bin/env bash
# The main job: train IMPALA on CartPole-v1 with distributed actors (embedded Redis, local workers)
# until solved, with a live progress bar; the run folder lands in runs/. Extra arguments go to
# `rqrl train` (e.g. --env Acrobot-v1, --redis-url redis://host:6379/0 --workers 0).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. "${RQRL_VENV:-.venv}/bin/activate"
exec rqrl train "$@"
