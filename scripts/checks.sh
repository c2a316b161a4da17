#!/usr/bin/env bash
# Static checks, in the project's .venv (scripts/setup.sh makes it, with the test extras):
# ruff (the whole repository), mypy (gradscope/ and cli/, the project's config) and the doctests
# (pytest --doctest-modules gradscope). One line per check; a failing check's output follows its
# line. Exits non-zero when any check fails.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${GRADSCOPE_VENV:-.venv}
failed=0

check() {
    local name=$1
    shift
    local start=$SECONDS out rc
    out=$("$@" 2>&1)
    rc=$?
    local last
    last=$(printf '%s\n' "$out" | grep -v '^\s*$' | tail -n 1)
    if [ "$rc" -eq 0 ]; then
        printf 'ok    %-9s %3ss  %s\n' "$name" "$((SECONDS - start))" "$last"
    else
        printf 'FAIL  %-9s %3ss  exit %s: %s\n' "$name" "$((SECONDS - start))" "$rc" "$last"
        printf '%s\n' "$out" | sed 's/^/      /'
        failed=1
    fi
}

check ruff "$VENV/bin/ruff" check --no-fix .
check mypy "$VENV/bin/mypy" gradscope cli
# -p no:cacheprovider: nothing written into the tree; the config's filterwarnings apply.
check doctests "$VENV/bin/python" -m pytest --doctest-modules gradscope -q -p no:cacheprovider \
    -o addopts=""
exit "$failed"
