#!/usr/bin/env bash
# The README's test command (and CI's, through .ci/run): sets everything up and runs the whole
# suite twice, once per supported torch, each in its own virtual environment made by
# scripts/setup.sh:
#   2.13  .venv       torch 2.13.0 (CPU build) + gradscope[test]; also scripts/checks.sh
#                     (lint, types, doctests) when that file exists
#   2.14  .venv-2.14  torch 2.14.1 + torchvision 0.29.1 (installed first), then gradscope[test]
#                     and timm with torch held; the outside-model tests (tests/outside/) run here
# plus Graphviz and Chromium (the HTML viewer test). Extra arguments go to pytest, on each leg.
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

leg() {  # leg NAME VENV TORCH PACKAGES [pytest args...]
  local name=$1 venv=$2 torch_spec=$3 packages=$4
  shift 4
  local t0 t1 t2 rc=0 counts
  echo "==== torch $name leg ($venv): set-up" >&2
  t0=$(date +%s)
  if ! GRADSCOPE_VENV=$venv GRADSCOPE_TORCH=$torch_spec GRADSCOPE_EXTRAS=test \
      GRADSCOPE_PACKAGES=$packages bash scripts/setup.sh; then
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
  "$venv/bin/python" -m pytest "$@" 2>&1 | tee "$logdir/$name.log"
  rc=${PIPESTATUS[0]}
  t2=$(date +%s)
  counts=$(grep -E '[0-9]+ (passed|failed|error)' "$logdir/$name.log" | tail -n 1 \
    | sed -E 's/^=+ //; s/ =+$//')
  [ "$rc" = 0 ] || status=1
  summary+=("torch $name: $([ "$rc" = 0 ] && echo ok || echo "FAILED (pytest exit $rc)") - ${counts:-no result}; set-up $(( t1 - t0 )) s, tests $(( t2 - t1 )) s")
}

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
