#!/usr/bin/env bash
# The benchmark command: installs what it needs (.ci/setup, plus Procrastinate as the peer), then runs
# arbiter vs legacy (and the peer) in one run and writes docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/setup
.venv/bin/pip install -q ".[bench]"
exec .venv/bin/python bench/run.py --write docs/benchmarks.md "$@"
