#!/usr/bin/env bash
# Idempotent set-up used by the README's commands and by CI: a virtual environment, a pinned
# torch, gradscope (editable, or the wheel GRADSCOPE_WHEEL names; pip compiles the optional C
# walk, gradscope/graph/_cwalk.c, when a C compiler is present) with the extras asked for,
# and the Graphviz binary.
#
#   GRADSCOPE_VENV      the environment's folder (default .venv)
#   GRADSCOPE_TORCH     what to install first (default "torch==2.13.0", the CPU build here:
#                       a bare `torch` pulls a multi-GB CUDA build); may name several packages,
#                       e.g. "torch==2.14.1 torchvision==0.29.1"
#   GRADSCOPE_EXTRAS    gradscope's extras (default test; empty: gradscope and its
#                       dependencies only, what rendering needs)
#   GRADSCOPE_PACKAGES  more packages installed after gradscope (e.g. timm)
#   GRADSCOPE_WHEEL     a built wheel (dist/torch_gradscope-*.whl: the distribution is
#                       torch-gradscope) to install instead of the editable checkout: what
#                       users get from pip (scripts/test.sh sets it)
#   PIP_CONSTRAINT      pip's own variable, passed through: a machine-wide constraint file
#                       that caps torch is lifted for one install with PIP_CONSTRAINT=/dev/null
#                       (scripts/test.sh does so for its torch 2.15 leg)
# Everything after the first step is installed with torch (and torchvision) held at the
# versions the first step installed, so nothing downloads another torch.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${GRADSCOPE_VENV:-.venv}
TORCH_SPEC=${GRADSCOPE_TORCH:-torch==2.13.0}
EXTRAS=${GRADSCOPE_EXTRAS-test}
PACKAGES=${GRADSCOPE_PACKAGES:-}
WHEEL=${GRADSCOPE_WHEEL:-}
pip_q() { "$VPY" -m pip install -q --disable-pip-version-check "$@" >&2; }

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV" >&2
  "$PY" -m venv "$VENV"
fi
VPY=$VENV/bin/python
if [ -n "$WHEEL" ]; then
  target=$WHEEL
  [ -n "$EXTRAS" ] && target="$WHEEL[$EXTRAS]"
  wheel_id=$(sha1sum "$WHEEL" | cut -c1-12)
else
  target=.
  [ -n "$EXTRAS" ] && target=".[$EXTRAS]"
  wheel_id=editable
fi
# the stamp covers everything the install builds from, so an edited C file is rebuilt
stamp="$VENV/.gradscope-setup-$( (cat pyproject.toml setup.py gradscope/graph/_cwalk.c \
  scripts/setup.sh; echo "$TORCH_SPEC|$EXTRAS|$PACKAGES|$wheel_id") | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  echo "setup: installing $TORCH_SPEC and gradscope${EXTRAS:+[$EXTRAS]}${PACKAGES:+ and $PACKAGES} into $VENV" >&2
  pip_q --upgrade pip || true
  # shellcheck disable=SC2086  # a list of requirements
  pip_q $TORCH_SPEC
  # the distribution was called `gradscope` before it became torch-gradscope: an older install
  # under that name (its dist-info, its editable finder) would shadow or outlive the new one
  if "$VPY" -I -c "import importlib.metadata as m; m.distribution('gradscope')" 2>/dev/null; then
    "$VPY" -m pip uninstall -y -q gradscope >&2 || true
  fi
  held="$VENV/.gradscope-held.txt"
  "$VPY" - > "$held" <<'EOF'
from importlib import metadata
for name in ("torch", "torchvision"):
    try:
        print(f"{name}=={metadata.version(name)}")
    except metadata.PackageNotFoundError:
        pass
EOF
  if [ -n "$WHEEL" ]; then
    pip_q -c "$held" "$target"
    # the same version may be installed already (editable, or an older wheel): replace it
    pip_q --force-reinstall --no-deps "$WHEEL"
  else
    pip_q -c "$held" -e "$target"
  fi
  # shellcheck disable=SC2086
  [ -z "$PACKAGES" ] || pip_q -c "$held" $PACKAGES
  rm -f "$VENV"/.gradscope-setup-*
  touch "$stamp"
fi
# from another folder (the checkout is not on sys.path there), with the venv's python by an
# absolute path that keeps the venv (no symlink resolved)
case $VPY in /*) vpy_abs=$VPY ;; *) vpy_abs=$PWD/$VPY ;; esac
if ! (cd / && "$vpy_abs" -c "import gradscope.graph._cwalk") 2>/dev/null; then
  echo "setup: the compiled walk (gradscope/graph/_cwalk.c) is not built, so gs.trace uses its slower pure-Python walker; install a C compiler and the Python headers (apt-get install gcc python3-dev) and run: $VENV/bin/pip install -e ." >&2
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
