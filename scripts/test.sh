#!/usr/bin/env bash
# The README's test command (and CI's, through .ci/run): sets everything up and runs the whole
# suite twice, once per supported torch, against what users install: it builds the sdist and
# the wheel (python -m build, in .venv-build; the wheel is built from the sdist) and installs
# the WHEEL, not the checkout, into each leg's virtual environment (scripts/setup.sh):
#   2.13  .venv       torch 2.13.0 (CPU build) + the wheel with [test]; also scripts/checks.sh
#                     (lint, types, doctests) when that file exists
#   2.14  .venv-2.14  torch 2.14.1 + torchvision 0.29.1 (installed first), then the wheel with
#                     [test] and timm with torch held; the outside-model tests (tests/outside/)
#                     run here
# plus Graphviz and Chromium (the HTML viewer test). pytest runs from the checkout's root (the
# tests read samples/ by relative paths) with PYTHONSAFEPATH=1, so neither pytest nor the
# `python -c` / `-m` subprocesses of the tests put the checkout on sys.path: `import gradscope`
# is the installed wheel's (tests/test_wheel.py checks it, and that the wheel holds every
# package folder). GRADSCOPE_INSTALL=editable installs the checkout instead (a developer's
# quick loop). Each leg runs on GRADSCOPE_WORKERS pytest-xdist workers (default 2, one per core
# here; 0 runs in one process), a test file per worker (--dist loadfile). Extra arguments go to
# pytest, on each leg.
# GRADSCOPE_LEGS="2.13" (or "2.14") runs one leg. Exits non-zero if any leg fails, after a
# summary line per leg.
set -uo pipefail
cd "$(dirname "$0")/.."
LEGS=${GRADSCOPE_LEGS:-2.13 2.14}
# the suite fails if the compiled walk did not build (instead of quietly testing only the
# pure-Python walker); tests/capture/test_cwalk.py compares the two walkers on every test graph
export GRADSCOPE_REQUIRE_CWALK=${GRADSCOPE_REQUIRE_CWALK:-1}
logdir=$(mktemp -d "${TMPDIR:-/tmp}/gradscope-test.XXXXXX")
summary=()
status=0
INSTALL=${GRADSCOPE_INSTALL:-wheel}
WORKERS=${GRADSCOPE_WORKERS:-2}
xdist=()
[ "$WORKERS" = 0 ] || xdist=(-n "$WORKERS" --dist loadfile)

build_wheel() {  # the sdist, and the wheel built from it, into dist/; sets WHEEL
  local t0=$SECONDS bvenv=.venv-build
  echo "==== building the sdist and the wheel (python -m build)" >&2
  if [ ! -x "$bvenv/bin/python" ]; then "${PYTHON:-python3}" -m venv "$bvenv"; fi
  if ! "$bvenv/bin/python" -c "import build" 2>/dev/null; then
    "$bvenv/bin/python" -m pip install -q --disable-pip-version-check "build==1.6.1" >&2 || return 1
  fi
  rm -rf dist
  "$bvenv/bin/python" -m build --outdir dist . > "$logdir/build.log" 2>&1 \
    || { tail -n 30 "$logdir/build.log" >&2; return 1; }
  WHEEL=$(ls "$PWD"/dist/gradscope-*.whl)
  echo "built $(basename "$(ls dist/gradscope-*.tar.gz)") and $(basename "$WHEEL") in $(( SECONDS - t0 )) s" >&2
}

leg() {  # leg NAME VENV TORCH PACKAGES [pytest args...]
  local name=$1 venv=$2 torch_spec=$3 packages=$4
  shift 4
  local t0 t1 t2 rc=0 counts
  echo "==== torch $name leg ($venv): set-up" >&2
  t0=$(date +%s)
  if ! GRADSCOPE_VENV=$venv GRADSCOPE_TORCH=$torch_spec GRADSCOPE_EXTRAS=test \
      GRADSCOPE_PACKAGES=$packages GRADSCOPE_WHEEL=${WHEEL:-} bash scripts/setup.sh; then
    summary+=("torch $name: set-up FAILED after $(( $(date +%s) - t0 )) s")
    status=1
    return
  fi
  t1=$(date +%s)
  if [ "$name" = 2.13 ] && [ -f scripts/checks.sh ]; then
    echo "==== torch $name leg: scripts/checks.sh" >&2
    if ! bash scripts/checks.sh; then
      summary+=("torch $name: scripts/checks.sh FAILED")
      status=1
    fi
  fi
  echo "==== torch $name leg: pytest ($("$venv/bin/python" -c 'import torch; print(torch.__version__)'))" >&2
  PYTHONSAFEPATH=1 GRADSCOPE_WHEEL=${WHEEL:-} "$venv/bin/python" -m pytest "${xdist[@]}" --durations=15 "$@" 2>&1 \
    | tee "$logdir/$name.log"
  rc=${PIPESTATUS[0]}
  t2=$(date +%s)
  counts=$(grep -E '[0-9]+ (passed|failed|error)' "$logdir/$name.log" | tail -n 1 \
    | sed -E 's/^=+ //; s/ =+$//')
  [ "$rc" = 0 ] || status=1
  summary+=("torch $name: $([ "$rc" = 0 ] && echo ok || echo "FAILED (pytest exit $rc)") - ${counts:-no result}; set-up $(( t1 - t0 )) s, tests $(( t2 - t1 )) s")
}

WHEEL=
if [ "$INSTALL" = wheel ]; then
  if ! build_wheel; then
    echo "==== summary"
    echo "the sdist/wheel build FAILED"
    exit 1
  fi
fi
if [ -f scripts/setup-browser.sh ]; then bash scripts/setup-browser.sh; fi
for name in $LEGS; do
  case $name in
    2.13) leg 2.13 .venv "torch==2.13.0" "" "$@" ;;
    2.14) leg 2.14 .venv-2.14 "torch==2.14.1 torchvision==0.29.1" "timm==1.0.29" "$@" ;;
    *) echo "test.sh: unknown leg '$name' (GRADSCOPE_LEGS takes 2.13 and/or 2.14)" >&2; exit 2 ;;
  esac
done
echo "==== summary"
for line in "${summary[@]}"; do echo "$line"; done
rm -rf "$logdir"
exit $status
