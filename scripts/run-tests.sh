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
# types are checked against the newest allowed dependencies only: the lowest ones' stubs (numpy 1.24,
# gymnasium 1.1) disagree with the newest about generics and annotations, not about the code
if [ -z "${RQRL_CONSTRAINTS:-}" ]; then
  echo "==> mypy"
  mypy  # settings and files in pyproject.toml [tool.mypy]
fi
echo "==> pytest"
exec python -m pytest -q "$@"
