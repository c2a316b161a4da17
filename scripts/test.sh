#!/usr/bin/env bash
# The README's test command: sets everything up (venv, torch==2.13.0 CPU, gradscope[test],
# Graphviz, Chromium for the HTML viewer test) and runs the whole suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
GRADSCOPE_EXTRAS=${GRADSCOPE_EXTRAS:-test} bash scripts/setup.sh
if [ -f scripts/setup-browser.sh ]; then bash scripts/setup-browser.sh; fi
exec .venv/bin/python -m pytest "$@"
