#!/usr/bin/env bash
# The README's main job: set up what rendering needs (.venv with torch 2.13.0 CPU, gradscope
# without the test extras, Graphviz), render a bundled sample to SVG, and print its tree.
set -euo pipefail
cd "$(dirname "$0")/.."
GRADSCOPE_EXTRAS= bash scripts/setup.sh
sample=${1:-samples/mlp.py}
out=${2:-out/$(basename "${sample%.py}").svg}
mkdir -p "$(dirname "$out")"
.venv/bin/gradscope render "$sample" -o "$out"
.venv/bin/gradscope tree "$sample"
