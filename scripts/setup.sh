#!/usr/bin/env bash
# Idempotent set-up used by the README's two commands and by CI:
#   a virtual environment in .venv, the CPU build of torch 2.13.0 (pinned: a bare `torch`
#   pulls a multi-GB CUDA build), gradscope with its test extras (which compiles the optional
#   C walk, gradscope/capture/_cwalk.c, when a C compiler is present), and the Graphviz binary.
# Set GRADSCOPE_EXTRAS to choose extras (default: test).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
EXTRAS=${GRADSCOPE_EXTRAS:-test}

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv" >&2
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
# the stamp covers everything the install builds from, so an edited C file is rebuilt
stamp=".venv/.gradscope-setup-$(cat pyproject.toml setup.py gradscope/capture/_cwalk.c scripts/setup.sh \
  | sha1sum | cut -c1-12)-$EXTRAS"
if [ ! -f "$stamp" ]; then
  echo "setup: installing torch==2.13.0 (CPU) and gradscope[$EXTRAS]" >&2
  "$VPY" -m pip install -q --disable-pip-version-check --upgrade pip >&2 || true
  "$VPY" -m pip install -q --disable-pip-version-check "torch==2.13.0" >&2
  "$VPY" -m pip install -q --disable-pip-version-check -e ".[$EXTRAS]" >&2
  rm -f .venv/.gradscope-setup-*
  touch "$stamp"
fi
if ! "$VPY" -c "import gradscope.capture._cwalk" 2>/dev/null; then
  echo "setup: the compiled walk (gradscope/capture/_cwalk.c) is not built, so gs.trace uses its slower pure-Python walker; install a C compiler and the Python headers (apt-get install gcc python3-dev) and run: .venv/bin/pip install -e ." >&2
fi

if ! command -v dot >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing the Graphviz binary (apt-get install graphviz)" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz) >&2 \
      || echo "setup: could not install Graphviz; SVG/PNG/PDF output will be unavailable (DOT works)" >&2
  else
    echo "setup: the Graphviz binary 'dot' is missing; install it (sudo apt-get install graphviz, or brew install graphviz) for SVG/PNG/PDF output. DOT, JSON and tree output work without it." >&2
  fi
fi
