#!/usr/bin/env bash
# The README's main job: set up what rendering needs (.venv with torch 2.13.0 CPU, gradscope
# without the test extras, Graphviz), render a bundled sample to SVG, print its tree, and end
# with the picture's path and a one-line summary. What the installers say goes to
# out/setup.log (its tail is shown when the set-up fails).
#
#   bash scripts/demo.sh [SAMPLE.py] [OUT.svg]
set -euo pipefail
cd "$(dirname "$0")/.."
sample=${1:-samples/mlp.py}
out=${2:-out/$(basename "${sample%.py}").svg}
log=out/setup.log
mkdir -p out "$(dirname "$out")"

printf 'setting up .venv and Graphviz (a few minutes the first time; log: %s) ... ' "$log"
if ! GRADSCOPE_EXTRAS= bash scripts/setup.sh >"$log" 2>&1; then
    echo "failed"
    echo "--- the last lines of $log:" >&2
    tail -n 25 "$log" >&2
    exit 1
fi
echo "done"

.venv/bin/gradscope tree "$sample"
# render says "wrote PATH: N nodes (...), N edges, ..." on stderr: its summary ends the demo
if ! said=$(.venv/bin/gradscope render "$sample" -o "$out" 2>&1); then
    printf '%s\n' "$said" >&2
    exit 1
fi
summary=$(printf '%s\n' "$said" | sed -n 's/^wrote [^:]*: //p' | tail -n 1)
echo
echo "picture: $out"
echo "${summary:-rendered $sample}"
