#!/usr/bin/env bash
# The README's test command (and CI's, through .ci/run): sets everything up and runs the suite
# on each supported torch, against what users install: it builds the sdist and the wheel
# (python -m build, in .venv-build; the wheel is built from the sdist) and installs the WHEEL,
# not the checkout, into each leg's virtual environment (scripts/setup.sh). The legs, in the
# order they run:
#   2.13  .venv       torch 2.13.0 (CPU build, the oldest supported) + the wheel with [test]:
#                     the whole suite; also scripts/checks.sh (lint, types, doctests) and
#                     scripts/docs.sh (the documentation site, mkdocs --strict) when they exist
#   2.15  .venv-2.15  torch 2.15.0 (the newest release; from the package index with its CUDA
#                     runtime packages, ~2.5 GB to download, 5.4 GB installed; the machine's pip
#                     constraint that caps torch at 2.14.1 is lifted for this leg's installs
#                     only: PIP_CONSTRAINT=/dev/null) + the wheel with [test]: the whole suite.
#                     Its triton (pulled in by torch.compile's inductor tests) prints
#                     "nanobind: leaked N instances/types/functions!" when a pytest worker
#                     exits: noise after the results (nanobind's leak check can only be turned
#                     off from C++, nb::set_leak_warnings), no exit code or count depends on it
#   2.14  .venv-2.14  torch 2.14.1 + torchvision 0.29.1 (installed first), then the wheel with
#                     [test] and timm with torch held: the outside-model tests (tests/outside/,
#                     they need torchvision and timm) and the tests that read torch internals
#                     ($LEG_214_TESTS below), not the whole suite (2.13 and 2.15 run it)
# plus Graphviz and Chromium (the HTML viewer test). pytest runs from the checkout's root (the
# tests read samples/ by relative paths) with PYTHONSAFEPATH=1, so neither pytest nor the
# `python -c` / `-m` subprocesses of the tests put the checkout on sys.path: `import gradscope`
# is the installed wheel's (tests/test_wheel.py checks it, and that the wheel holds every
# package folder). GRADSCOPE_INSTALL=editable installs the checkout instead (a developer's
# quick loop). Each leg runs on GRADSCOPE_WORKERS pytest-xdist workers (default 2, one per core
# here; 0 runs in one process), a test file per worker (--dist loadfile). Extra arguments go to
# pytest, on each leg (the 2.14 leg adds them to its own list of tests).
# GRADSCOPE_LEGS="2.13" (or "2.15", "2.14", "2.13 2.15"...) runs those legs, in that order.
# Exits non-zero if any leg fails, after a summary line per leg (set-up and test seconds) and
# one per script run in a leg.
set -uo pipefail
cd "$(dirname "$0")/.."
LEGS=${GRADSCOPE_LEGS:-2.13 2.15 2.14}
# what the 2.14 leg runs: the outside models, the wheel's own checks, and every test of the
# torch internals gradscope reads by feature (compat probes, saved-tensor handles, the compiled
# walk against the Python one, torch.compile'd regions, custom Functions' forward lines)
LEG_214_TESTS="tests/outside tests/test_outside_layout.py tests/test_wheel.py tests/compat \
  tests/graph/test_cwalk.py tests/graph/test_compiled.py tests/graph/test_torch_compile.py \
  tests/functions/test_functions.py"
# the suite fails if the compiled walk did not build (instead of quietly testing only the
# pure-Python walker); tests/graph/test_cwalk.py compares the two walkers on every test graph
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
  # the files are named after the distribution, torch-gradscope (pyproject.toml)
  WHEEL=$(ls "$PWD"/dist/torch_gradscope-*.whl)
  echo "built $(basename "$(ls dist/torch_gradscope-*.tar.gz)") and $(basename "$WHEEL") in $(( SECONDS - t0 )) s" >&2
}

in_leg() {  # in_leg NAME SCRIPT: run a script of the leg (checks, docs), one summary line
  local name=$1 script=$2 t0=$SECONDS
  echo "==== torch $name leg: $script" >&2
  if bash "$script"; then
    summary+=("torch $name: $script ok in $(( SECONDS - t0 )) s")
  else
    summary+=("torch $name: $script FAILED after $(( SECONDS - t0 )) s")
    status=1
  fi
}

free_gb() {  # whole GB free on the disk that holds the checkout
  df -Pk . | awk 'NR == 2 { print int($4 / 1048576) }'
}

leg() {  # leg NAME VENV TORCH PACKAGES PIP_CONSTRAINT TESTS [pytest args...]
  # PIP_CONSTRAINT: what the leg's installs use ("" keeps the machine's, /dev/null lifts it);
  # TESTS: the test paths ("" = the whole suite)
  local name=$1 venv=$2 torch_spec=$3 packages=$4 constraint=$5 tests=$6
  shift 6
  local t0 t1 t2 t3 rc=0 counts
  local -a cenv=()
  [ -z "$constraint" ] || cenv=("PIP_CONSTRAINT=$constraint")
  echo "==== torch $name leg ($venv): set-up" >&2
  t0=$(date +%s)
  # a leg's environment takes 2 (2.13) to about 9 GB (2.15, 2.14: torch's CUDA packages,
  # downloaded, then installed): say so before pip runs out of space half-way
  local free
  free=$(free_gb)
  if [ ! -d "$venv" ] && [ "$free" -lt 10 ]; then
    echo "test.sh: warning: $free GB free on this disk; the torch $name leg's set-up needs up to 9 GB" >&2
  fi
  if ! env "${cenv[@]}" GRADSCOPE_VENV="$venv" GRADSCOPE_TORCH="$torch_spec" \
      GRADSCOPE_EXTRAS=test GRADSCOPE_PACKAGES="$packages" GRADSCOPE_WHEEL="${WHEEL:-}" \
      bash scripts/setup.sh; then
    summary+=("torch $name: set-up FAILED after $(( $(date +%s) - t0 )) s ($(free_gb) GB free on the disk)")
    status=1
    return
  fi
  t1=$(date +%s)
  if [ "$name" = 2.13 ]; then
    [ ! -f scripts/checks.sh ] || in_leg "$name" scripts/checks.sh
    [ ! -f scripts/docs.sh ] || in_leg "$name" scripts/docs.sh
  fi
  t2=$(date +%s)
  echo "==== torch $name leg: pytest ($("$venv/bin/python" -c 'import torch; print(torch.__version__)'))${tests:+ on $tests}" >&2
  # shellcheck disable=SC2086  # a list of test paths
  PYTHONSAFEPATH=1 GRADSCOPE_WHEEL=${WHEEL:-} "$venv/bin/python" -m pytest "${xdist[@]}" \
    --durations=15 $tests "$@" 2>&1 | tee "$logdir/$name.log"
  rc=${PIPESTATUS[0]}
  t3=$(date +%s)
  counts=$(grep -E '[0-9]+ (passed|failed|error)' "$logdir/$name.log" | tail -n 1 \
    | sed -E 's/^=+ //; s/ =+$//')
  [ "$rc" = 0 ] || status=1
  summary+=("torch $name: $([ "$rc" = 0 ] && echo ok || echo "FAILED (pytest exit $rc)") - ${counts:-no result}; set-up $(( t1 - t0 )) s, tests $(( t3 - t2 )) s${tests:+ (a part: $(echo $tests | wc -w) paths)}")
}

for name in $LEGS; do  # before anything is built or installed
  case $name in
    2.13 | 2.14 | 2.15) ;;
    *) echo "test.sh: unknown leg '$name' (GRADSCOPE_LEGS takes 2.13, 2.15 and 2.14)" >&2
      rm -rf "$logdir"
      exit 2 ;;
  esac
done
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
    2.13) leg 2.13 .venv "torch==2.13.0" "" "" "" "$@" ;;
    2.15) leg 2.15 .venv-2.15 "torch==2.15.0" "" /dev/null "" "$@" ;;
    2.14) leg 2.14 .venv-2.14 "torch==2.14.1 torchvision==0.29.1" "timm==1.0.29" "" \
      "$LEG_214_TESTS" "$@" ;;
  esac
done
echo "==== summary"
for line in "${summary[@]}"; do echo "$line"; done
rm -rf "$logdir"
exit $status
