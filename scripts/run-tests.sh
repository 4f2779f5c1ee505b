#!/usr/bin/env bash
# Set up .venv, then lint, type-check and test, tier by tier (tests/tiers.py):
#
#   bash scripts/run-tests.sh          ruff, the import contracts, mypy and the default tier: unit tests,
#                                      Redis-only integration tests, CliRunner tests and the doctests in rqrl/
#                                      (about 2 minutes on 2 cores)
#   bash scripts/run-tests.sh --all    the same checks and every tier: the default one, the processes tier (real
#                                      workers and signals) and the e2e tier (whole rqrl commands, compose, the
#                                      dashboard, the benchmarks' smoke runs, the docs' examples), two tests at a
#                                      time with pytest-xdist (about 8 minutes on 2 cores); beside them, in the
#                                      background, the docs site: `mkdocs build --strict` (the docs extra is
#                                      installed first if missing), whose failure fails the run
#
# Other arguments go to pytest (e.g. -x, -k NAME). RQRL_TEST_PROCESSES sets how many tests run at once with
# --all (default 2; 0 runs them one by one).
set -euo pipefail
cd "$(dirname "$0")/.."
ALL=0
if [ "${1:-}" = "--all" ]; then
  ALL=1
  shift
fi
bash scripts/setup.sh
# shellcheck disable=SC1091
. "${RQRL_VENV:-.venv}/bin/activate"
echo "==> ruff"
ruff check rqrl tests benchmarks
echo "==> import contracts (pyproject.toml [tool.importlinter])"
lint-imports
# types are checked against the newest allowed dependencies only: the lowest ones' stubs (numpy 1.24,
# gymnasium 1.1) disagree with the newest about generics and annotations, not about the code
if [ -z "${RQRL_CONSTRAINTS:-}" ]; then
  echo "==> mypy"
  mypy  # settings and files in pyproject.toml [tool.mypy]
fi
if [ "$ALL" = 0 ]; then
  echo "==> pytest: default tier"
  exec python -m pytest -q "$@"
fi
if ! python -c "import mkdocs, material, mkdocstrings_handlers.python, mkdocs_click" 2>/dev/null; then
  echo "==> installing the docs extra (mkdocs.yml's plugins)"
  pip install -q -e ".[docs]" ${RQRL_CONSTRAINTS:+-c "$RQRL_CONSTRAINTS"}
fi
echo "==> mkdocs build --strict, in the background (its log follows the tests)"
DOCS_LOG="$(mktemp)"
NO_MKDOCS_2_WARNING=1 mkdocs build --strict >"$DOCS_LOG" 2>&1 &
docs_pid=$!
trap 'kill "$docs_pid" 2>/dev/null || true' EXIT
PARALLEL="${RQRL_TEST_PROCESSES:-2}"
echo "==> pytest: every tier, ${PARALLEL} tests at a time"
tests_status=0
if [ "$PARALLEL" -gt 0 ]; then
  python -m pytest -q --all -n "$PARALLEL" "$@" || tests_status=$?
else
  python -m pytest -q --all "$@" || tests_status=$?
fi
docs_status=0
wait "$docs_pid" || docs_status=$?
trap - EXIT
if [ "$docs_status" != 0 ]; then
  cat "$DOCS_LOG"
  echo "the docs site did not build: mkdocs build --strict exited with $docs_status (its log is above)" >&2
else
  echo "==> docs site built in site/"
fi
rm -f "$DOCS_LOG"
[ "$tests_status" = 0 ] && [ "$docs_status" = 0 ]
