#!/usr/bin/env bash
# Two builds of sm4c side by side on the counter loop, as bench/compare.sh times one: `sm4c run` of
# the SM4C loop and of the ASL loop, process start included, the two binaries' runs interleaved,
# then XState 5 on the same loop (when node is installed). For before/after figures taken in one run.
# Usage: bench/compare-binaries.sh OLD_BINARY NEW_BINARY [N] [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: bench/compare-binaries.sh OLD_BINARY NEW_BINARY [N] [RUNS]" >&2; exit 2; }
OLD=$1
NEW=$2
N=${3:-500000}
RUNS=${4:-5}
mkdir -p target
printf '{"count": 0, "limit": %d}\n' $((N / 2)) > target/counter-input.json
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# Microseconds one run of binary $1 on definition $2 takes (its output checked: the loop must finish).
run_us() {
  local s e out
  s=$(date +%s%N)
  out=$("$1" run "$2" --input target/counter-input.json)
  e=$(date +%s%N)
  case "$out" in *"\"count\": $((N / 2))"*) ;; *) echo "bench/compare-binaries.sh: $1 $2 did not count to $((N / 2)): $out" >&2; exit 1 ;; esac
  echo $(( (e - s) / 1000 ))
}
declare -A t
for _ in $(seq "$RUNS"); do
  for b in old new; do
    bin=$OLD; [ $b = new ] && bin=$NEW
    t[$b-sm4c]+="$(run_us "$bin" bench/counter/counter.json) "
    t[$b-asl]+="$(run_us "$bin" bench/counter/counter.asl.json) "
  done
done
x_us=
if command -v node >/dev/null; then
  (cd bench/xstate && [ -d node_modules ] || npm ci --silent)
  xs=()
  for _ in $(seq "$RUNS"); do
    s=$(date +%s%N)
    node bench/xstate/counter.mjs "$N" >/dev/null
    e=$(date +%s%N)
    xs+=($(( (e - s) / 1000 )))
  done
  x_us=$(printf '%s\n' "${xs[@]}" | median)
  echo "xstate:     $N transitions in $((x_us / 1000)) ms (median of $RUNS) = $(( N * 1000000 / x_us )) transitions/s"
fi
for b in old new; do
  s_us=$(printf '%s\n' ${t[$b-sm4c]} | median)
  a_us=$(printf '%s\n' ${t[$b-asl]} | median)
  echo "$b sm4c:   $N transitions in $((s_us / 1000)) ms (median of $RUNS) = $(( N * 1000000 / s_us )) transitions/s${x_us:+, $(( x_us * 10 / s_us / 10 )).$(( x_us * 10 / s_us % 10 ))x XState}"
  echo "$b asl:    $N transitions in $((a_us / 1000)) ms (median of $RUNS) = $(( N * 1000000 / a_us )) transitions/s; ASL takes $(( a_us * 100 / s_us / 100 )).$(printf '%02d' $(( a_us * 100 / s_us % 100 )))x the time of SM4C"
done
