#!/usr/bin/env bash
# Builds the release artifact the playbooks install on every host: dist/wheelhouse.tar, the project
# and all its dependencies as wheels (hosts need no package index). Reproducible: the same sources
# give the same tar, so a re-run of a playbook reinstalls nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist/wheelhouse.tar}
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-315532800}
"$python" -m pip wheel --quiet --wheel-dir "$work/wheels" .
mkdir -p "$(dirname "$out")"
tar --create --file "$out" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --directory "$work/wheels" .
echo "$out: $(ls "$work/wheels" | wc -l) wheels"
