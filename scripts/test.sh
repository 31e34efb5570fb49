#!/usr/bin/env bash
# The whole test suite (README command two). Runs from a fresh clone after .ci/run's install,
# or in a dev checkout with .venv present.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/pytest ] || { echo "no .venv: run 'bash .ci/run' once (it installs everything)" >&2; exit 2; }
# Run from tests/ so that 'import arbiter' resolves to the installed package, not the checkout.
cd tests && exec ../.venv/bin/pytest -p no:cacheprovider "$@"
