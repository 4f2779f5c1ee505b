#!/usr/bin/env bash
# Set up, lint, and run the test suite (unit, integration with a private redis-server and real
# worker processes, e2e CLI). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. "${RQRL_VENV:-.venv}/bin/activate"
echo "==> ruff"
ruff check rqrl tests benchmarks
echo "==> pytest"
exec python -m pytest -q "$@"
