#!/usr/bin/env bash
# Whole-process comparison on the counter loop: `sm4c run` of the SM4C loop (bench/counter/counter.json)
# and of the ASL loop (bench/counter/counter.asl.json), runs interleaved, then XState 5 (bench/xstate), all
# for N transitions (default 500,000), process start included. Prints medians in transitions per second.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-500000}
RUNS=${2:-5}
cargo build --release -q
printf '{"count": 0, "limit": %d}\n' $((N / 2)) > target/counter-input.json
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# Microseconds one `sm4c run` of definition $1 takes (its output checked: the loop must finish).
run_us() {
  local s e out
  s=$(date +%s%N)
  out=$(./target/release/sm4c run "$1" --input target/counter-input.json)
  e=$(date +%s%N)
  case "$out" in *"\"count\": $((N / 2))"*) ;; *) echo "bench/compare.sh: $1 did not count to $((N / 2)): $out" >&2; exit 1 ;; esac
  echo $(( (e - s) / 1000 ))
}
times=()
asl_times=()
for _ in $(seq "$RUNS"); do
  times+=($(run_us bench/counter/counter.json))
  asl_times+=($(run_us bench/counter/counter.asl.json))
done
sm4c_us=$(printf '%s\n' "${times[@]}" | median)
asl_us=$(printf '%s\n' "${asl_times[@]}" | median)
echo "sm4c:   $N transitions in $((sm4c_us / 1000)) ms (median of $RUNS) = $(( N * 1000000 / sm4c_us )) transitions/s"
echo "asl:    $N transitions in $((asl_us / 1000)) ms (median of $RUNS) = $(( N * 1000000 / asl_us )) transitions/s"
echo "ratio:  ASL takes $(( asl_us * 100 / sm4c_us / 100 )).$(printf '%02d' $(( asl_us * 100 / sm4c_us % 100 )))x the time of SM4C (at most 1.5x allowed)"
if command -v node >/dev/null; then
  (cd bench/xstate && [ -d node_modules ] || npm ci --silent)
  xtimes=()
  for _ in $(seq "$RUNS"); do
    s=$(date +%s%N)
    node bench/xstate/counter.mjs "$N" >/dev/null
    e=$(date +%s%N)
    xtimes+=($(( (e - s) / 1000 )))
  done
  x_us=$(printf '%s\n' "${xtimes[@]}" | median)
  echo "xstate: $N transitions in $((x_us / 1000)) ms (median of $RUNS) = $(( N * 1000000 / x_us )) transitions/s"
  echo "ratio:  sm4c is $(( x_us * 10 / sm4c_us / 10 )).$(( x_us * 10 / sm4c_us % 10 ))x XState"
fi
