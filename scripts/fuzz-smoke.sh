#!/usr/bin/env bash
# A short run of every fuzz target (fuzz/, cargo-fuzz + libFuzzer), for CI: each target for
# FUZZ_SECONDS (default 20) on its seed corpus and dictionary, one job, at low priority. Fails when a
# target finds a crash (libFuzzer leaves the input in fuzz/artifacts/<target>/). cargo-fuzz needs
# nightly features; with the one stable toolchain, RUSTC_BOOTSTRAP=1 enables them.
# cargo-fuzz comes from crates.io: when it is not on PATH, it is installed into .tools/cargo (once).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${FUZZ_SECONDS:-20}"
if ! cargo fuzz --version >/dev/null 2>&1; then
  if [ ! -x .tools/cargo/bin/cargo-fuzz ]; then
    echo "fuzz-smoke: installing cargo-fuzz 0.13.2 into .tools/cargo" >&2
    cargo install --quiet --locked --root .tools/cargo cargo-fuzz --version 0.13.2
  fi
  export PATH="$PWD/.tools/cargo/bin:$PATH"
fi
export RUSTC_BOOTSTRAP=1
cd fuzz
targets=(load_definition asl_execution asl_paths_intrinsics jq_expression timespan cloudevent_http kafka_records
  store_records store_reads store_roundtrip)
# kafka_records builds librdkafka from source (rdkafka's cmake-build): cmake from scripts/setup.sh.
if ! command -v cmake >/dev/null && [ -x ../.tools/venv/bin/cmake ]; then
  export PATH="$PWD/../.tools/venv/bin:$PATH"
fi
# Without the line tables fuzz/Cargo.toml keeps for long runs (gdb): a crash here still names its
# functions, and the build links faster. Optimised less than long runs are (opt-level 1, not 3): ten
# seconds a target need no speed, and the build is most of this script's time in CI.
export CARGO_PROFILE_RELEASE_DEBUG=0
export CARGO_PROFILE_RELEASE_OPT_LEVEL=1
nice -n 19 cargo fuzz build -O -a 2>&1 | tail -n 3 >&2 || { echo "fuzz-smoke: the fuzz targets do not build" >&2; exit 1; }
# After the build: kafka_records and store_records write seeds from the real serializers.
./seed-corpus.sh >/dev/null
dict() {
  case "$1" in
    load_definition | asl_execution) echo dict/definition.dict ;;
    cloudevent_http | kafka_records | store_records | store_reads | store_roundtrip) ;;
    *) echo "dict/$1.dict" ;;
  esac
}
# jsonata-rs leaks what it allocates on the heap for values in its arena (fuzz/README.md, "Findings"):
# the targets that evaluate JSONata run without LeakSanitizer, the others with it.
leaks() {
  case "$1" in
    asl_*) echo detect_leaks=0 ;;
    *) echo detect_leaks=1 ;;
  esac
}
for t in "${targets[@]}"; do
  log="$(mktemp)"
  d="$(dict "$t")"
  if ASAN_OPTIONS="$(leaks "$t")" nice -n 19 cargo fuzz run -O -a "$t" -- -max_total_time="$seconds" ${d:+-dict=$d} \
      -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 >"$log" 2>&1; then
    runs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)"
    cov="$(grep -E '^#[0-9]+.*(DONE|pulse|NEW|REDUCE)' "$log" | tail -n 1 | grep -oE 'cov: [0-9]+ ft: [0-9]+' || true)"
    echo "fuzz-smoke: $t ok: ${runs:-?} executions in ${seconds}s, ${cov:-coverage unknown}"
    rm -f "$log"
  else
    echo "fuzz-smoke: $t FAILED; its log:" >&2
    tail -n 60 "$log" >&2
    exit 1
  fi
done
