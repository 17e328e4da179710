#!/usr/bin/env bash
# Rewrites the golden stored-format fixtures with this checkout's build (docs/src/testing.md, "The golden
# stored formats"):
#   host/durable/tests/golden/store.sqlite  a SQLite store that `sm4c serve` writes (scripts/golden.py drives it)
#   host/kafka/tests/golden/records.jsonl   the state and journal records the Kafka worker's decision code writes
# The test suite reads them and never runs this. Rewrite them only together with a change of a stored format
# that also changes its stamp (the SQLite store's `sm4c-store-N`, or a Kafka record's reader of older records),
# and say in the fixtures' READMEs which commit wrote them: a rewrite to make a failing golden test pass hides
# exactly the change the tests are there to catch.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# shellcheck source=/dev/null
source scripts/setup.sh
cargo build -p sm4c --locked
python3 scripts/golden.py target/debug/sm4c
cargo test -p sm4c-kafka --lib --locked worker::golden::write_golden_records -- --ignored --exact
echo "scripts/golden.sh: rewrote the golden fixtures with the build of $(git rev-parse --short HEAD)$(git diff --quiet || echo ' (with uncommitted changes)')"
