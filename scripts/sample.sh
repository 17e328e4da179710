#!/usr/bin/env bash
# Runs a sample with `sm4c run`: the order-fulfilment one by default, or the one named (a folder of
# samples/). Installs what the build needs first (cmake for librdkafka, via scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
name="${1:-order-fulfilment}"
dir="samples/$name"
if [ ! -f "$dir/definition.json" ]; then
  echo "scripts/sample.sh: no sample $name (samples: $(ls samples | grep -v README | tr '\n' ' '))" >&2
  exit 2
fi
args=(run "$dir/definition.json")
[ -f "$dir/input.json" ] && args+=(--input "$dir/input.json")
[ -f "$dir/mocks.json" ] && args+=(--mock "$dir/mocks.json")
[ -f "$dir/events.ndjson" ] && args+=(--events "$dir/events.ndjson")
[ -d "$dir/subflows" ] && args+=(--subflows "$dir/subflows")
exec cargo run --release -q --locked --bin sm4c -- "${args[@]}" --virtual-time
