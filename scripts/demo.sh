#!/usr/bin/env bash
# A demo to watch sm4c at work: starts a tansu broker, two `sm4c serve --kafka` workers in one consumer
# group and a small Python program playing an airline and a hotel (scripts/demo/services.py), then starts
# an instance of a trip-booking saga (scripts/demo/definitions/trip-booking.json) every half second,
# alternately on each worker, and prints the web inspector's URLs. Ctrl-C (or SIGTERM) stops everything
# it started and removes its temporary directory.
#
#   scripts/demo.sh [--debug]
#
# It builds sm4c with `cargo build --release -p sm4c` (`--debug`: the debug build), unless SM4C_BIN names
# an sm4c binary. Settings, from the environment:
#   SM4C_BIN                  an sm4c binary to use instead of building one
#   SM4C_DEMO_BROKER_PORT     the broker's port (9092)
#   SM4C_DEMO_PORT_A          the first worker's HTTP port (8080)
#   SM4C_DEMO_PORT_B          the second worker's HTTP port (8081)
#   SM4C_DEMO_INTERVAL        seconds between two starts (0.5)
#   SM4C_TANSU, SM4C_PYTHON   the broker and a Python with confluent-kafka and cloudevents (when both are
#                             given with SM4C_BIN, scripts/setup.sh is not sourced)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

profile=release
for arg in "$@"; do
  case "$arg" in
    --debug) profile=debug ;;
    -h | --help)
      sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "demo: unknown argument $arg (see scripts/demo.sh --help)" >&2
      exit 2
      ;;
  esac
done

broker_port="${SM4C_DEMO_BROKER_PORT:-9092}"
port_a="${SM4C_DEMO_PORT_A:-8080}"
port_b="${SM4C_DEMO_PORT_B:-8081}"
interval="${SM4C_DEMO_INTERVAL:-0.5}"
partitions=4
prefix=demo
definition=trip-booking

say() { echo "demo: $*"; }
fail() {
  echo "demo: $*" >&2
  exit 1
}

tmp="$(mktemp -d "${TMPDIR:-/tmp}/sm4c-demo.XXXXXX")"
names=()
pids=()
waiting_on="" # the cargo build, curl or sleep the script waits for, if any

# Stops what the demo started: the services and the workers first (SIGTERM; SIGKILL after 10 s), the
# broker last, so that the workers can leave their group; then removes the temporary directory.
stop_all() {
  trap - INT TERM EXIT
  echo
  say "stopping"
  # A build runs in a process group of its own (see below): its compilers stop with it.
  if [ -n "$waiting_on" ]; then kill -TERM -- "-$waiting_on" "$waiting_on" 2>/dev/null || true; fi
  local i
  for i in "${!pids[@]}"; do
    if [ "${names[$i]}" != broker ]; then kill -TERM "${pids[$i]}" 2>/dev/null || true; fi
  done
  stop_wait 10 services worker-a worker-b
  for i in "${!pids[@]}"; do
    if [ "${names[$i]}" = broker ]; then kill -TERM "${pids[$i]}" 2>/dev/null || true; fi
  done
  stop_wait 10 broker
  # Anything else still running in the background (a process started just as the signal came).
  for i in $(jobs -p); do kill -KILL "$i" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
  say "stopped everything it started"
}

# stop_wait SECONDS NAME...: waits for the named processes to end, then SIGKILLs those left.
stop_wait() {
  local seconds="$1" i name left t
  shift
  for ((t = 0; t < seconds * 10; t++)); do
    left=0
    for i in "${!pids[@]}"; do
      for name in "$@"; do
        if [ "${names[$i]}" = "$name" ] && kill -0 "${pids[$i]}" 2>/dev/null; then left=1; fi
      done
    done
    [ "$left" = 0 ] && return 0
    sleep 0.1
  done
  for i in "${!pids[@]}"; do
    for name in "$@"; do
      if [ "${names[$i]}" = "$name" ] && kill -0 "${pids[$i]}" 2>/dev/null; then
        say "$name (pid ${pids[$i]}) did not stop within ${seconds} s: SIGKILL"
        kill -KILL "${pids[$i]}" 2>/dev/null || true
      fi
    done
  done
}

trap 'stop_all; exit 130' INT
trap 'stop_all; exit 143' TERM
trap 'stop_all' EXIT

# What the demo needs beyond sm4c: the tansu broker and a Python with confluent-kafka and the
# CloudEvents SDK (and cmake, to build sm4c), all from scripts/setup.sh, which installs them into .tools/.
if [ -z "${SM4C_BIN:-}" ] || [ -z "${SM4C_TANSU:-}" ] || [ -z "${SM4C_PYTHON:-}" ]; then
  given_tansu="${SM4C_TANSU:-}"
  given_python="${SM4C_PYTHON:-}"
  # shellcheck disable=SC1091 # (scripts/setup.sh is checked on its own)
  source scripts/setup.sh
  SM4C_TANSU="${given_tansu:-$SM4C_TANSU}"
  SM4C_PYTHON="${given_python:-$SM4C_PYTHON}"
fi
[ -x "$SM4C_TANSU" ] || fail "no tansu broker at $SM4C_TANSU (SM4C_TANSU)"
[ -x "$SM4C_PYTHON" ] || fail "no Python at $SM4C_PYTHON (SM4C_PYTHON)"

if [ -n "${SM4C_BIN:-}" ]; then
  bin="$SM4C_BIN"
  [ -x "$bin" ] || fail "SM4C_BIN is $bin, which is not an executable"
  say "using the sm4c binary given by SM4C_BIN: $bin"
else
  target="${CARGO_TARGET_DIR:-target}"
  [[ "$target" = /* ]] || target="$root/$target"
  build=(cargo build --locked -p sm4c)
  if [ "$profile" = release ]; then
    build+=(--release)
    say "building sm4c (cargo build --release -p sm4c; the first build takes several minutes)"
  else
    say "building sm4c (cargo build -p sm4c, a debug build)"
  fi
  # In the background, waited for, and in a process group of its own when setsid is there, so that a
  # signal stops the build and its compilers at once.
  if command -v setsid >/dev/null; then
    setsid "${build[@]}" </dev/null &
  else
    "${build[@]}" </dev/null &
  fi
  waiting_on=$!
  wait "$waiting_on" || fail "the build failed (${build[*]})"
  waiting_on=""
  bin="$target/$profile/sm4c"
  [ -x "$bin" ] || fail "cargo built no $bin"
  say "using the $profile build: $bin"
fi

# Nothing may listen on the ports yet (else the demo would talk to someone else's server).
for port in "$broker_port" "$port_a" "$port_b"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    fail "port $port is in use; choose others with SM4C_DEMO_BROKER_PORT, SM4C_DEMO_PORT_A and SM4C_DEMO_PORT_B"
  fi
done

# started NAME PID: remembers a process the demo started (in $tmp/pids too, one "NAME PID" a line).
started() {
  names+=("$1")
  pids+=("$2")
  echo "$1 $2" >>"$tmp/pids"
}

# check_alive: fails, with the end of its log, when a process the demo started has ended.
check_alive() {
  local i
  for i in "${!pids[@]}"; do
    if ! kill -0 "${pids[$i]}" 2>/dev/null; then
      fail "${names[$i]} (pid ${pids[$i]}) has ended; the end of its log:
$(tail -n 30 "$tmp/${names[$i]}.log")"
    fi
  done
}

say "logs and pids in $tmp (removed when the demo stops)"

"$SM4C_TANSU" broker --listener-url "tcp://127.0.0.1:$broker_port" \
  --advertised-listener-url "tcp://127.0.0.1:$broker_port" --storage-engine memory://tansu/ \
  >"$tmp/broker.log" 2>&1 &
started broker $!
for ((t = 0; ; t++)); do
  (exec 3<>"/dev/tcp/127.0.0.1/$broker_port") 2>/dev/null && break
  check_alive
  [ "$t" -lt 200 ] || fail "the broker did not listen on 127.0.0.1:$broker_port within 20 s; the end of $tmp/broker.log:
$(tail -n 30 "$tmp/broker.log")"
  sleep 0.1
done
say "broker: tansu on 127.0.0.1:$broker_port (pid ${pids[0]})"

# Two workers of one consumer group; short group timeouts so that the group settles in seconds.
for w in a b; do
  port="$port_a"
  [ "$w" = b ] && port="$port_b"
  RUST_LOG="${RUST_LOG:-info}" "$bin" serve --kafka "127.0.0.1:$broker_port" --group demo-workers \
    --topic-prefix "$prefix" --partitions "$partitions" --definitions scripts/demo/definitions \
    --listen "127.0.0.1:$port" \
    --kafka-config session.timeout.ms=6000 --kafka-config heartbeat.interval.ms=1000 \
    </dev/null >"$tmp/worker-$w.log" 2>&1 &
  started "worker-$w" $!
done
for w in a b; do
  port="$port_a"
  [ "$w" = b ] && port="$port_b"
  for ((t = 0; ; t++)); do
    curl -fs --max-time 2 "http://127.0.0.1:$port/healthz" >/dev/null && break
    check_alive
    [ "$t" -lt 300 ] || fail "worker $w did not answer http://127.0.0.1:$port/healthz within 60 s; the end of $tmp/worker-$w.log:
$(tail -n 30 "$tmp/worker-$w.log")"
    sleep 0.2
  done
done

# owned PORT: how many commands partitions the worker on PORT owns.
owned() {
  curl -fs --max-time 2 "http://127.0.0.1:$1/healthz" | grep -o '"ownedPartitions":[0-9]*' | cut -d: -f2 || echo 0
}
for ((t = 0; ; t++)); do
  a="$(owned "$port_a")" b="$(owned "$port_b")"
  [ "$((${a:-0} + ${b:-0}))" = "$partitions" ] && break
  check_alive
  [ "$t" -lt 450 ] || fail "the workers' group did not settle within 90 s (worker a owns ${a:-0}, worker b ${b:-0} of $partitions partitions); the ends of their logs:
$(tail -n 15 "$tmp/worker-a.log")
----
$(tail -n 15 "$tmp/worker-b.log")"
  sleep 0.2
done
say "workers: a on 127.0.0.1:$port_a (pid ${pids[1]}), b on 127.0.0.1:$port_b (pid ${pids[2]}), group demo-workers, $partitions partitions"

"$SM4C_PYTHON" scripts/demo/services.py --bootstrap "127.0.0.1:$broker_port" --prefix "$prefix" --parent $$ \
  </dev/null >"$tmp/services.log" 2>&1 &
started services $!
say "services: the airline and the hotel (scripts/demo/services.py, pid ${pids[3]})"

cat <<EOF

  Open the inspector:  http://127.0.0.1:$port_a/ui   (worker a)
                       http://127.0.0.1:$port_b/ui   (worker b, the same instances)

  About every ${interval} s this script starts a trip (POST /instances, on worker a and b in turn) of the saga
  $definition (scripts/demo/definitions/trip-booking.json). Each trip asks the airline for a flight and
  then the hotel for a room, by events on the topic $prefix.events.out, and waits for their answers on
  $prefix.events, which carry its trip id (the correlation value an instance page shows under "waiting
  on", beside the 20 s timeout's countdown). A refused flight ends the trip (Rejected); a full hotel, or
  one that does not answer in time, makes the saga cancel the flight it booked (Cancelled).

  Click a trip to see its diagram, what it waits for, and its history with each step's change to its
  data; "Definitions" shows the saga. Press Ctrl-C to stop everything.

EOF

# ended PORT: the trips that ended on the partitions the worker on PORT owns (its metrics).
ended() {
  local metrics
  metrics="$(curl -fs --max-time 2 "http://127.0.0.1:$1/metrics")" || {
    echo "?"
    return
  }
  awk -v d="definition=\"$definition\"" '/^sm4c_instances_ended_total\{/ && index($0, d) { n += $NF } END { print n + 0 }' <<<"$metrics"
}

travellers=(Ada Alan Barbara Edsger Grace Ken Leslie Margaret Niklaus Robin Tony Frances)
cities=(Lisbon Oslo Kyoto Lima Nairobi Tallinn Porto Quito Hobart Reykjavik)
n=0
while :; do
  n=$((n + 1))
  id="$(printf 'trip-%04d' "$n")"
  port="$port_a"
  [ $((n % 2)) = 0 ] && port="$port_b"
  traveller="${travellers[RANDOM % ${#travellers[@]}]}"
  city="${cities[RANDOM % ${#cities[@]}]}"
  input="{\"tripId\": \"$id\", \"traveller\": \"$traveller\", \"from\": \"Zurich\", \"to\": \"$city\", \"nights\": $((RANDOM % 6 + 1))}"
  # In the background and waited for, so that Ctrl-C stops the demo at once, even during a start
  # (which a Kafka worker answers once the instance's owner has taken it).
  curl -s --max-time 35 -o "$tmp/start.json" -w '%{http_code}' -X POST "http://127.0.0.1:$port/instances" \
    -H 'Content-Type: application/json' \
    -d "{\"definition\": \"$definition\", \"id\": \"$id\", \"input\": $input}" >"$tmp/start.status" &
  waiting_on=$!
  wait "$waiting_on" || true
  waiting_on=""
  code="$(cat "$tmp/start.status" 2>/dev/null || true)"
  case "$code" in
    200 | 201) ;;
    *) say "starting $id on 127.0.0.1:$port answered ${code:-nothing}: $(cat "$tmp/start.json" 2>/dev/null || true)" ;;
  esac
  check_alive
  if [ $((n % 20)) = 0 ]; then
    a="$(ended "$port_a")" b="$(ended "$port_b")"
    say "$(date +%H:%M:%S) started $n trips; ended: $a on worker a's partitions, $b on worker b's"
  fi
  sleep "$interval" &
  waiting_on=$!
  wait "$waiting_on" || true
  waiting_on=""
done
