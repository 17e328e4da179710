#!/usr/bin/env bash
# Soak: `sm4c serve` on a fresh SQLite store under a steady load of three-step durable workflows
# (bench/restate/three.json) at a fraction of its measured maximum, for a number of windows; after
# each window it prints the window's throughput, p50/p99/max latency of a start (one whole workflow),
# the server's RSS and the store's size, so that latency and memory can be read over time.
#
# Usage: bench/serve/soak.sh [SECONDS] [WINDOW_SECONDS] [PERCENT] [CLIENTS]
#   defaults: 600 s (10 minutes) in 60 s windows at 80% of the maximum, 16 clients (wrk connections).
#   SM4C=path/to/sm4c (default target/release/sm4c).
#
# It fails (exit 1) when a request is not answered 2xx, when an instance is left running, or when RSS
# grows by more than SOAK_RSS_GROWTH_MB (default 64) from the first window to the last: the server
# holds no per-instance memory once an instance has ended. Latency is reported, never asserted.
set -euo pipefail
cd "$(dirname "$0")/../.."
total="${1:-600}"
window="${2:-60}"
percent="${3:-80}"
clients="${4:-16}"
growth_mb="${SOAK_RSS_GROWTH_MB:-64}"
sm4c="${SM4C:-target/release/sm4c}"
[ -x "$sm4c" ] || { echo "soak.sh: build sm4c first: cargo build --release (see docs/src/building.md)" >&2; exit 1; }
command -v wrk >/dev/null || { echo "soak.sh: needs wrk (apt-get install wrk)" >&2; exit 1; }
lua=bench/wrk/post.lua
threads=$((clients < 2 ? clients : 2))
body='{"definition": "three", "id": "{id}", "input": {"x": 1}}'

work=$(mktemp -d)
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
RUST_LOG=warn "$sm4c" serve --db "$work/soak.db" --listen "127.0.0.1:$port" >"$work/sm4c.log" 2>&1 &
pid=$!
for _ in $(seq 300); do
  curl -s -o /dev/null "http://127.0.0.1:$port/healthz" && break
  sleep 0.1
done
url="http://127.0.0.1:$port/instances"
curl -sf -XPOST "http://127.0.0.1:$port/definitions" -H 'content-type: application/json' \
  -d @bench/restate/three.json >/dev/null

wrk_json() { # seconds rate run
  RUN=$3 RATE=$2 THREADS=$threads BODY=$body wrk -t"$threads" -c"$clients" -d"$1s" --timeout 30s -s "$lua" "$url" |
    grep '^{"requests"'
}
field() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }
rss_kib() { awk '$1 == "VmRSS:" {print $2}' "/proc/$pid/status"; }
# The store's block device as /proc/diskstats counts it (sectors written, ms writing, writes, flushes,
# ms flushing), so that each window says what the disk did beside what the server did; empty when the
# store is not on a device listed there.
device=$(basename "$(df --output=source "$work" | tail -n 1)")
disk_stats() { awk -v d="$device" '$3 == d {print $10, $11, $8, $19, $20}' /proc/diskstats; }

max=$(wrk_json 15 0 max)
max_rate=$(python3 -c "import json,sys; r=json.loads(sys.argv[1]); print(round(r['requests'] / r['seconds']))" "$max")
rate=$((max_rate * percent / 100))
windows=$((total / window))
echo "# $(nproc) cores; maximum $max_rate workflows/s at $clients clients (15 s); soak at $percent%: $rate/s,"
echo "# $windows windows of $window s; three durable steps per workflow; SQLite WAL synchronous=FULL"
echo
echo "| window | ends at | workflows/s | p50 ms | p99 ms | max ms | RSS MiB | store MiB | disk MB/s written | ms per write | flushes/s | ms per flush |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
first_rss=
for w in $(seq "$windows"); do
  before=$(disk_stats)
  r=$(wrk_json "$window" "$rate" "w$w")
  after=$(disk_stats)
  non2xx=$(field "$r" non2xx)
  errors=$(field "$r" socketErrors)
  if [ "$non2xx" != 0 ] || [ "$errors" != 0 ]; then
    echo "soak.sh: window $w: $non2xx answers not 2xx, $errors socket errors" >&2
    tail -n 20 "$work/sm4c.log" >&2
    exit 1
  fi
  rss=$(rss_kib)
  [ -n "$first_rss" ] || first_rss=$rss
  db=$(du -k "$work"/soak.db* | awk '{s += $1} END {print s}')
  python3 - "$w" "$((w * window))" "$r" "$rss" "$db" "$window" "$before" "$after" <<'EOF'
import json, sys
w, at, r, rss, db, window, before, after = sys.argv[1:]
r = json.loads(r)
disk = "| - | - | - | - |"
if before.split() and after.split():
    # sectors written, ms writing, writes completed, flushes completed, ms flushing
    sectors, wms, writes, flushes, fms = (int(b) - int(a) for a, b in zip(before.split(), after.split()))
    s = int(window)
    disk = (f"| {sectors * 512 / 1e6 / s:.1f} | {wms / max(writes, 1):.2f} | {flushes / s:,.0f} | "
            f"{fms / max(flushes, 1):.2f} |")
print(f"| {w} | {at} s | {r['requests'] / r['seconds']:,.0f} | {r['p50ms']:.2f} | {r['p99ms']:.2f} | "
      f"{r['maxms']:.1f} | {int(rss) / 1024:.1f} | {int(db) / 1024:.0f} {disk}")
EOF
done
left=$(curl -sf "http://127.0.0.1:$port/instances?status=running&limit=1")
[ "$left" = '{"instances":[],"next":null}' ] || { echo "soak.sh: instances still running: $left" >&2; exit 1; }
last_rss=$(rss_kib)
echo
echo "RSS: $((first_rss / 1024)) MiB after the first window, $((last_rss / 1024)) MiB at the end."
if [ $((last_rss - first_rss)) -gt $((growth_mb * 1024)) ]; then
  echo "soak.sh: RSS grew by more than $growth_mb MiB from the first window to the last" >&2
  exit 1
fi
