#!/usr/bin/env bash
# Builds the documentation site into site/ with `mkdocs build --strict` (mkdocs.yml): a broken
# link, a missing page or an API reference that does not resolve fails the build. Runs in the
# project's .venv (GRADSCOPE_VENV to use another); when mkdocs is missing there, installs the
# pinned packages of pyproject.toml's `docs` extra into it first (only those: gradscope itself
# is whatever the environment already has, the checkout or the wheel scripts/test.sh built).
# The pictures are drawn during the build from samples/ (docs/hooks.py): Graphviz's `dot` and
# an installed `gradscope` are needed. Extra arguments go to mkdocs build.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${GRADSCOPE_VENV:-.venv}
if ! "$VENV/bin/python" -c "import mkdocs" 2>/dev/null; then
    mapfile -t packages < <("$VENV/bin/python" -c '
import tomllib
with open("pyproject.toml", "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["optional-dependencies"]["docs"]))')
    echo "docs.sh: installing ${packages[*]} into $VENV" >&2
    "$VENV/bin/python" -m pip install --quiet "${packages[@]}"
fi
start=$SECONDS
NO_MKDOCS_2_WARNING=1 "$VENV/bin/python" -m mkdocs build --strict "$@"
echo "docs.sh: built site/ in $((SECONDS - start)) s" >&2
