#!/usr/bin/env bash
# sm4c serve beside Restate, in one run on one machine, with one client (wrk, bench/wrk/post.lua)
# at the same concurrency: a three-step durable workflow (bench/restate/three.json on sm4c; the
# `three` service of service.mjs on Restate, as three `ctx.run` steps and as plain handler code).
#
# Usage: bench/restate/run.sh [SECONDS] [CLIENTS ...]      (defaults: 15 s per run; 1 16 64 clients)
#
# It runs sm4c at each concurrency, stops it, then Restate `steps` and `plain` at each concurrency,
# each run after a 2 s warm-up, and prints a Markdown table row and a JSON line per run: requests per second,
# p50 and p99 latency of one request (one whole workflow: both sides answer once it has finished),
# CPU used by the server side (cores, from /proc: sm4c's one process; restate-server plus the Node
# service), and the server side's RSS at the end of the run and its peak.
#
# Needs: target/release/sm4c (built by `cargo build --release`), wrk (Debian's package), npm (installs
# the pinned Restate server, SDK and Node 22 into node_modules with `npm ci`). Ports: sm4c on a free
# port; Restate on its defaults (8080 ingress, 9070 admin, 5122 node, 9080 for the service), which must
# be free.
set -euo pipefail
cd "$(dirname "$0")"
secs="${1:-15}"
shift || true
clients=("$@")
[ ${#clients[@]} -gt 0 ] || clients=(1 16 64)
sm4c=../../target/release/sm4c
[ -x "$sm4c" ] || { echo "run.sh: build sm4c first: cargo build --release (see docs/src/building.md)" >&2; exit 1; }
command -v wrk >/dev/null || { echo "run.sh: needs wrk (apt-get install wrk)" >&2; exit 1; }
[ -x node_modules/.bin/node ] || npm ci --no-audit --no-fund >&2
for p in 8080 9070 5122 9080; do
  if (echo > "/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
    echo "run.sh: port $p is in use; Restate needs it" >&2
    exit 1
  fi
done

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

wait_http() { # url
  for _ in $(seq 300); do
    curl -s -o /dev/null "$1" && return 0
    sleep 0.1
  done
  echo "run.sh: $1 did not answer" >&2
  exit 1
}
wait_port() { # port (the Node service speaks HTTP/2 only)
  for _ in $(seq 300); do
    (echo > "/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "run.sh: nothing listens on port $1" >&2
  exit 1
}

# sm4c: WAL with synchronous=FULL (every committed batch is fsynced; see docs/src/serve.md).
start_sm4c() {
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  RUST_LOG=warn "$sm4c" serve --db "$work/sm4c.db" --listen "127.0.0.1:$port" >"$work/sm4c.log" 2>&1 &
  sm4c_pid=$!
  pids+=("$sm4c_pid")
  wait_http "http://127.0.0.1:$port/healthz"
  curl -sf -XPOST "http://127.0.0.1:$port/definitions" -H 'content-type: application/json' -d @three.json >/dev/null
}

# Restate: its defaults (a single node, the replicated loglet on RocksDB with its WAL fsynced).
start_restate() {
  node_modules/.bin/restate-server --base-dir "$work/restate" >"$work/restate.log" 2>&1 &
  restate_pid=$!
  pids+=("$restate_pid")
  PORT=9080 node_modules/.bin/node service.mjs >"$work/service.log" 2>&1 &
  service_pid=$!
  pids+=("$service_pid")
  wait_http http://127.0.0.1:9070/health
  wait_port 9080
  curl -sf -XPOST http://127.0.0.1:9070/deployments -H 'content-type: application/json' \
    -d '{"uri": "http://127.0.0.1:9080"}' >/dev/null
}

stop() { # pids...
  kill "$@" 2>/dev/null || true
  for p in "$@"; do
    while kill -0 "$p" 2>/dev/null; do sleep 0.1; done
  done
}
durability=$(node_modules/.bin/restate-server --dump-config 2>/dev/null |
  grep -E '^(default-provider|rocksdb-disable-wal|rocksdb-disable-wal-fsync) ' | sort -u | tr '\n' ' ')

tck=$(getconf CLK_TCK)
ticks() { # pids...: user + system clock ticks
  local t=0 p
  for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
  echo "$t"
}
kib() { # field (VmRSS, VmHWM) pids...: summed, in KiB
  local f=$1 t=0 p
  shift
  for p in "$@"; do t=$((t + $(awk -v f="$f:" '$1 == f {print $2}' "/proc/$p/status"))); done
  echo "$t"
}

# run NAME URL BODY CLIENTS PIDS...
run() {
  local name=$1 url=$2 body=$3 c=$4
  shift 4
  local threads=$((c < 2 ? c : 2))
  RUN="warm$RANDOM" BODY=$body THREADS=$threads wrk -t"$threads" -c"$c" -d2s -s ../wrk/post.lua "$url" >/dev/null
  local t0 s
  t0=$(ticks "$@")
  s=$(RUN="$name-$c-$RANDOM" BODY=$body THREADS=$threads wrk -t"$threads" -c"$c" -d"${secs}s" --timeout 30s -s ../wrk/post.lua "$url" |
    grep '^{"requests"')
  local cpu rss peak
  cpu=$(python3 -c "print(round(($(ticks "$@") - $t0) / $tck / $(echo "$s" | python3 -c 'import json,sys; print(json.load(sys.stdin)["seconds"])'), 2))")
  rss=$(kib VmRSS "$@")
  peak=$(kib VmHWM "$@")
  python3 - "$name" "$c" "$cpu" "$rss" "$peak" "$s" <<'EOF'
import json, sys
name, c, cpu, rss, peak, s = sys.argv[1:]
r = json.loads(s)
rps = r["requests"] / r["seconds"]
if r["non2xx"] or r["socketErrors"]:
    sys.exit(f"run.sh: {name} at {c} clients: {r['non2xx']} answers not 2xx, {r['socketErrors']} socket errors")
print(f"| {name} | {c} | {rps:,.0f} | {r['p50ms']:.2f} | {r['p99ms']:.2f} | {float(cpu):.2f} | "
      f"{int(rss) / 1024:.0f} | {int(peak) / 1024:.0f} |")
print(json.dumps({"side": name, "clients": int(c), "perSecond": round(rps), "p50ms": r["p50ms"],
                  "p99ms": r["p99ms"], "cpuCores": float(cpu), "rssMiB": round(int(rss) / 1024),
                  "peakRssMiB": round(int(peak) / 1024)}), file=sys.stderr)
EOF
}

echo "# $(nproc) cores, ${secs} s per run; sm4c $("$sm4c" --version | head -n 1), SQLite WAL synchronous=FULL;"
echo "# restate-server $(node_modules/.bin/restate-server --version | head -n 1), SDK $(node_modules/.bin/node -p "require('./node_modules/@restatedev/restate-sdk/package.json').version"), node $(node_modules/.bin/node --version); $durability"
echo
echo "| side | clients | workflows/s | p50 ms | p99 ms | server CPU (cores) | server RSS MiB | peak RSS MiB |"
echo "|---|---|---|---|---|---|---|---|"
# One side at a time, so that neither's background work (RocksDB flushes, SQLite checkpoints) lands
# in the other's runs: sm4c at every concurrency, then Restate's two forms at every concurrency.
start_sm4c
for c in "${clients[@]}"; do
  run sm4c "http://127.0.0.1:$port/instances" '{"definition": "three", "id": "{id}", "input": {"x": 1}}' "$c" "$sm4c_pid"
  # Every start was answered once its instance had finished: none is left running.
  left=$(curl -sf "http://127.0.0.1:$port/instances?status=running&limit=1")
  [ "$left" = '{"instances":[],"next":null}' ] || { echo "run.sh: sm4c instances still running: $left" >&2; exit 1; }
done
stop "$sm4c_pid"
start_restate
for form in steps plain; do
  for c in "${clients[@]}"; do
    run "restate-$form" "http://127.0.0.1:8080/three/$form" '{"x": 1}' "$c" "$restate_pid" "$service_pid"
  done
done
