#!/usr/bin/env bash
# Whole-process comparison on the counter loop: `sm4c run` against XState 5 (bench/xstate),
# both for 500,000 transitions, process start included. Prints transitions per second.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-500000}
RUNS=${2:-5}
cargo build --release -q
printf '{"count": 0, "limit": %d}\n' $((N / 2)) > target/counter-input.json
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
times=()
for _ in $(seq "$RUNS"); do
  s=$(date +%s%N)
  ./target/release/sm4c run bench/counter/counter.json --input target/counter-input.json >/dev/null
  e=$(date +%s%N)
  times+=($(( (e - s) / 1000 )))
done
sm4c_us=$(printf '%s\n' "${times[@]}" | median)
echo "sm4c:   $N transitions in $((sm4c_us / 1000)) ms (median of $RUNS) = $(( N * 1000000 / sm4c_us )) transitions/s"
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
