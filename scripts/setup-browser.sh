#!/usr/bin/env bash
# Idempotent set-up for the HTML viewer's browser test (tests/render/test_html.py): Debian's `chromium`
# (apt-get, when missing and root) and the `playwright` Python driver in .venv. The driver is only
# ever pointed at /usr/bin/chromium: no browser build is downloaded (never `playwright install`).
set -euo pipefail
cd "$(dirname "$0")/.."
PLAYWRIGHT_VERSION=1.65.2

if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup-browser: installing Debian's chromium (apt-get install chromium)" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >&2 \
      || echo "setup-browser: could not install chromium; the HTML browser test will be skipped" >&2
  else
    echo "setup-browser: /usr/bin/chromium is missing; install it (sudo apt-get install chromium) to run the HTML browser test" >&2
  fi
fi

if [ -x .venv/bin/python ] && ! .venv/bin/python -c "import playwright" >/dev/null 2>&1; then
  echo "setup-browser: installing playwright==$PLAYWRIGHT_VERSION (driver only, no browsers)" >&2
  PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 .venv/bin/python -m pip install -q --disable-pip-version-check \
    "playwright==$PLAYWRIGHT_VERSION" >&2
fi
