#!/usr/bin/env bash
# The README's test command: sets everything up (venv, torch==2.13.0 CPU, gradscope[test],
# Graphviz, Chromium for the HTML viewer test) and runs the whole suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
GRADSCOPE_EXTRAS=${GRADSCOPE_EXTRAS:-test} bash scripts/setup.sh
if [ -f scripts/setup-browser.sh ]; then bash scripts/setup-browser.sh; fi
# the suite fails if the compiled walk did not build (instead of quietly testing only the
# pure-Python walker); tests/test_cwalk.py compares the two walkers on every test graph
GRADSCOPE_REQUIRE_CWALK=${GRADSCOPE_REQUIRE_CWALK:-1} exec .venv/bin/python -m pytest "$@"
