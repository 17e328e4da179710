#!/usr/bin/env python3
"""Kafka mode with 1, 2 and 3 workers: starts per second, correlated events turned into transitions per
second, and each worker's RSS, measured in one run (issue 13, "Performance").

For each K in BENCH_WORKERS (default 1,2,3), with a fresh tansu broker (memory storage) and a fresh topic
prefix, K `sm4c serve --kafka` workers (same group, --partitions 6, each on its own --listen port,
--definitions a folder holding host/cli/tests/data/kafka/saga.json) and:

1. starts/s: BENCH_STARTS (3,000) starts through `POST /instances`, 8 client threads spread over the
   workers (thread t talks to worker t mod K over one kept-alive connection), each instance with its own
   orderId. Starts per second from the first request to the last 201 (a 201 comes once the start is
   committed and the answering worker's view has it), and the p50/p99 request latency. A start answered
   503 (the API waited 30 s for it to show) is counted and asked again with the same id;
2. events -> transitions/s: with those instances waiting in state Request, BENCH_STARTS `payment.done`
   CloudEvents in binary mode (attribute orderid = the instance's orderId, source `payments`, no
   sm4cinstanceid, so each is correlated, not addressed) produced to `<prefix>.events` as fast as the
   client goes (linger.ms=5, keyed by orderId), until every instance is in state Paid, as polling
   `GET /instances?status=completed` on worker 0 every BENCH_POLL seconds (0.25) sees it. Two rates:
   "decided", to the latest `endedAt` of the instances (set when the owner decided the transition, on
   this machine's clock), and "seen", to the poll that saw them all Paid (committed, and in worker 0's
   copy of the state topic);
3. VmRSS of each worker (from /proc/PID/status) when idle (all partitions owned, nothing started), after
   step 1 and after step 2, and the cluster's bytes per instance beyond the idle RSS:
   sum over workers of (RSS - idle RSS) / instances.

Also the CPU time the broker, each worker and this client spent per instance in steps 1 and 2 (the 2-core
machine is shared by all of them), and the load average before and after each step.

The saga times out after PT2M: the events must all be taken within two minutes of the first start, else
the run fails and says so. Every wait has a deadline; every process this script starts is stopped on exit,
also on Ctrl-C.

Run from the repository after `source scripts/setup.sh` and `cargo build --release -p sm4c`:
    python3 bench/kafka/scale.py
Knobs (environment): SM4C_BIN (default target/release/sm4c), BENCH_WORKERS (1,2,3), BENCH_STARTS (3000),
BENCH_THREADS (8), BENCH_PARTITIONS (6), BENCH_POLL (0.25), BENCH_LOG (warn, the workers' RUST_LOG).
Prints one JSON line per K on stdout, then a table; logs stay in a temporary folder named on stderr.
"""

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime

from confluent_kafka import Producer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SM4C = os.environ.get("SM4C_BIN", os.path.join(ROOT, "target", "release", "sm4c"))
TANSU = os.environ.get("SM4C_TANSU")
SAGA = os.path.join(ROOT, "host", "cli", "tests", "data", "kafka", "saga.json")
WORKERS = [int(k) for k in os.environ.get("BENCH_WORKERS", "1,2,3").split(",") if k.strip()]
STARTS = int(os.environ.get("BENCH_STARTS", "3000"))
THREADS = int(os.environ.get("BENCH_THREADS", "8"))
PARTS = int(os.environ.get("BENCH_PARTITIONS", "6"))
POLL = float(os.environ.get("BENCH_POLL", "0.25"))
SAGA_TIMEOUT_S = 120  # the saga's PT2M

PROCS = []  # every process started, stopped on exit


class Fail(Exception):
    pass


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def loadavg():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def rss_bytes(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def cpu_s(pid):
    """User plus system CPU seconds a process has used so far (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return float("nan")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def check_alive():
    for name, p in PROCS:
        if p.poll() is not None:
            raise Fail(f"{name} exited with code {p.returncode} (see its log)")


def wait_port(port, what, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        check_alive()
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise Fail(f"{what} did not listen on port {port} within {timeout} s")


def get(port, path, timeout=30):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        body = r.read()
        if r.status != 200:
            raise Fail(f"GET {path} on port {port}: {r.status} {body[:200]!r}")
        return json.loads(body)
    finally:
        c.close()


def spawn(name, args, logfile, env=None):
    p = subprocess.Popen(args, stdout=open(logfile, "w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    PROCS.append((name, p))
    return p


def stop_all():
    for name, p in reversed(PROCS):
        if p.poll() is None:
            try:
                p.terminate()
            except OSError:
                pass
    for name, p in reversed(PROCS):
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)
    PROCS.clear()


def count(port, status, state=None):
    """Instances with `status` (and `state`) on worker `port`'s view, paging with the cursor; also the
    latest endedAt among them (ms since the epoch)."""
    n, latest, after = 0, 0, ""
    while True:
        page = get(port, f"/instances?status={status}&definition=saga&limit=1000" + (f"&after={after}" if after else ""))
        for r in page["instances"]:
            if state is None or r.get("state") == state:
                n += 1
                if r.get("endedAt"):
                    latest = max(latest, datetime.fromisoformat(r["endedAt"].replace("Z", "+00:00")).timestamp() * 1000)
        after = page.get("next")
        if not after:
            return n, latest


def run_k(k, tmp):
    prefix = f"scale{k}x{int(time.time())}"
    group = prefix
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    url = f"tcp://{bootstrap}"
    broker = spawn("tansu", [TANSU, "broker", "--listener-url", url, "--advertised-listener-url", url],
          os.path.join(tmp, f"broker-k{k}.log"))
    wait_port(port, "tansu")
    defs = os.path.join(tmp, "defs")
    os.makedirs(defs, exist_ok=True)
    shutil.copy(SAGA, os.path.join(defs, "saga.json"))
    workers = []
    for w in range(k):
        api = free_port()
        p = spawn(f"worker {w} (K={k})",
                  [SM4C, "serve", "--kafka", bootstrap, "--group", group, "--topic-prefix", prefix,
                   "--partitions", str(PARTS), "--definitions", defs, "--listen", f"127.0.0.1:{api}",
                   "--kafka-config", "session.timeout.ms=6000"],
                  os.path.join(tmp, f"worker-k{k}-{w}.log"),
                  env={**os.environ, "RUST_LOG": os.environ.get("BENCH_LOG", "warn")})
        workers.append((p, api))
    for w, (_, api) in enumerate(workers):
        wait_port(api, f"worker {w}", timeout=60)
    # All partitions owned, none restoring, the same for 2 s running (the group has settled).
    deadline = time.time() + 120
    stable_since = None
    while True:
        check_alive()
        hs = [get(api, "/healthz") for _, api in workers]
        owned = [h.get("ownedPartitions", 0) for h in hs]
        settled = sum(owned) == PARTS and all(h.get("restoringPartitions", 0) == 0 for h in hs) \
            and all(o > 0 for o in owned[:PARTS])
        if settled:
            stable_since = stable_since or time.time()
            if time.time() - stable_since >= 2:
                break
        else:
            stable_since = None
        if time.time() > deadline:
            raise Fail(f"K={k}: the workers did not settle on {PARTS} partitions within 120 s: owned {owned}, health {hs}")
        time.sleep(0.2)
    log(f"K={k}: partitions owned {owned}")
    time.sleep(1)
    rss_idle = [rss_bytes(p.pid) for p, _ in workers]
    load0 = loadavg()
    pids = [broker.pid] + [p.pid for p, _ in workers]
    cpu0 = [cpu_s(x) for x in pids] + [time.process_time()]

    # 1. Starts through the API.
    lat = [None] * STARTS
    errors = []
    unavailable = []  # starts answered 503 before they went through
    times = {"first": None, "last": None}
    lock = threading.Lock()
    stop = threading.Event()

    def starter(t):
        api = workers[t % k][1]
        conn = http.client.HTTPConnection("127.0.0.1", api, timeout=60)
        try:
            for i in range(t, STARTS, THREADS):
                if stop.is_set():
                    return
                body = json.dumps({"definition": "saga", "id": f"o{i}", "input": {"orderId": f"ord-{i}", "amount": 1}})
                t0 = time.perf_counter()
                with lock:
                    if times["first"] is None:
                        times["first"] = t0
                retried = False
                for attempt in range(4):
                    try:
                        conn.request("POST", "/instances", body, {"content-type": "application/json"})
                        r = conn.getresponse()
                        data = r.read()
                    except (http.client.HTTPException, ConnectionError):
                        # A dropped keep-alive connection: reconnect, ask again.
                        conn.close()
                        conn = http.client.HTTPConnection("127.0.0.1", api, timeout=60)
                        if attempt == 3:
                            raise
                        retried = True
                        continue
                    if r.status == 503 and attempt < 3:
                        # "accepted but no worker has taken it into account yet" (after the API's 30 s
                        # wait): counted, and asked again with the same id, which starts nothing new.
                        with lock:
                            unavailable.append(f"o{i}")
                        retried = True
                        continue
                    break
                t1 = time.perf_counter()
                if r.status != 201 and not (retried and r.status == 200):  # 200: the retried start was in
                    errors.append(f"start o{i} on port {api}: {r.status} {data[:200]!r}")
                    stop.set()
                    return
                lat[i] = (t1 - t0) * 1000
                with lock:
                    times["last"] = max(times["last"] or t1, t1)
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append(f"thread {t}: {e!r}")
            stop.set()
        finally:
            conn.close()

    log(f"K={k}: {STARTS} starts with {THREADS} threads over {k} worker(s)")
    threads = [threading.Thread(target=starter, args=(t,), daemon=True) for t in range(THREADS)]
    wall0 = time.time()
    for th in threads:
        th.start()
    start_deadline = time.time() + max(120, STARTS / 20)
    for th in threads:
        while th.is_alive():
            th.join(0.5)
            if time.time() > start_deadline:
                stop.set()
                done = sum(1 for x in lat if x is not None)
                raise Fail(f"K={k}: starts did not finish within {start_deadline - wall0:.0f} s ({done} of {STARTS} answered 201)")
            check_alive()
    if errors:
        raise Fail(f"K={k}: starting failed: {errors[0]}")
    start_s = times["last"] - times["first"]
    starts_per_s = STARTS / start_s
    done_lat = [x for x in lat if x is not None]
    log(f"K={k}: {starts_per_s:.0f} starts/s" + (f"; {len(unavailable)} answers 503 first ({unavailable[:5]})" if unavailable else ""))
    # Every instance waiting, as worker 0 sees it.
    deadline = time.time() + 30
    while True:
        waiting, _ = count(workers[0][1], "waiting")
        if waiting == STARTS:
            break
        if time.time() > deadline:
            ended, _ = count(workers[0][1], "completed")
            raise Fail(f"K={k}: worker 0 sees {waiting} of {STARTS} instances waiting 30 s after the last start"
                       + (f", {ended} already ended (the saga's PT2M timeout: the starts took {start_s:.0f} s)" if ended else ""))
        time.sleep(POLL)
    rss_started = [rss_bytes(p.pid) for p, _ in workers]
    load1 = loadavg()
    cpu1 = [cpu_s(x) for x in pids] + [time.process_time()]

    # 2. Correlated events.
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    topic = f"{prefix}.events"
    log(f"K={k}: producing {STARTS} payment.done events to {topic}")
    t0 = time.time()
    for i in range(STARTS):
        headers = [("ce_specversion", b"1.0"), ("ce_id", f"pay-{i}".encode()), ("ce_source", b"payments"),
                   ("ce_type", b"payment.done"), ("ce_orderid", f"ord-{i}".encode()),
                   ("content-type", b"application/json")]
        while True:
            try:
                producer.produce(topic, json.dumps({"orderId": f"ord-{i}", "ok": True}).encode(),
                                 key=f"ord-{i}".encode(), headers=headers)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 1000 == 0:
            producer.poll(0)
    left = producer.flush(30)
    if left:
        raise Fail(f"K={k}: {left} events not delivered to the broker within 30 s")
    produced_s = time.time() - t0
    deadline = min(t0 + 300, wall0 + SAGA_TIMEOUT_S + 5)
    polls = 0
    while True:
        check_alive()
        paid, latest = count(workers[0][1], "completed", "Paid")
        polls += 1
        if paid == STARTS:
            seen = time.time()
            break
        timed_out, _ = count(workers[0][1], "completed", "TimedOut")
        if timed_out:
            raise Fail(f"K={k}: {timed_out} instances reached TimedOut (the saga's PT2M) before their payment.done; "
                       f"{paid} of {STARTS} Paid after {time.time() - t0:.1f} s")
        if time.time() > deadline:
            raise Fail(f"K={k}: {paid} of {STARTS} instances Paid {time.time() - t0:.1f} s after the first event "
                       f"(deadline: the saga's PT2M timeout or 300 s)")
        time.sleep(POLL)
    end_s = latest / 1000 - t0
    rss_paid = [rss_bytes(p.pid) for p, _ in workers]
    load2 = loadavg()
    cpu2 = [cpu_s(x) for x in pids] + [time.process_time()]

    def cpu_us(a, b):
        """CPU microseconds per instance in a step: broker, workers (each), this client."""
        d = [round((y - x) / STARTS * 1e6) for x, y in zip(a, b)]
        return {"broker": d[0], "workers": d[1:-1], "client": d[-1]}
    grow1 = sum(b - a for a, b in zip(rss_idle, rss_started))
    grow2 = sum(b - a for a, b in zip(rss_idle, rss_paid))
    out = {
        "workers": k,
        "partitions": PARTS,
        "instances": STARTS,
        "owned_partitions": owned,
        "starts_per_s": round(starts_per_s),
        "start_ms": {"p50": round(pct(done_lat, 0.5), 2), "p99": round(pct(done_lat, 0.99), 2),
                     "max": round(max(done_lat), 2)},
        "start_503s": len(unavailable),
        "events_produced_s": round(produced_s, 3),
        "events_to_paid_s": round(end_s, 3),
        "event_transitions_per_s": round(STARTS / end_s),
        "seen_all_paid_s": round(seen - t0, 3),
        "event_transitions_per_s_seen": round(STARTS / (seen - t0)),
        "rss_mb": {
            "idle": [round(x / 2**20, 1) for x in rss_idle],
            "after_starts": [round(x / 2**20, 1) for x in rss_started],
            "after_paid": [round(x / 2**20, 1) for x in rss_paid],
        },
        "bytes_per_instance": {"after_starts": round(grow1 / STARTS), "after_paid": round(grow2 / STARTS)},
        "cpu_us_per_instance": {"starts": cpu_us(cpu0, cpu1), "events": cpu_us(cpu1, cpu2)},
        "loadavg": {"before": load0, "after_starts": load1, "after_paid": load2},
    }
    print(json.dumps(out), flush=True)
    return out


def main():
    if not TANSU:
        sys.exit("scale.py: set SM4C_TANSU (source scripts/setup.sh)")
    if not os.access(SM4C, os.X_OK):
        sys.exit(f"scale.py: no sm4c binary at {SM4C} (cargo build --release -p sm4c, or set SM4C_BIN)")

    def on_term(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    tmp = tempfile.mkdtemp(prefix="sm4c-scale-")
    log(f"logs in {tmp}; binary {SM4C}; {STARTS} instances; workers {WORKERS}")
    results = []
    failed = False
    try:
        for k in WORKERS:
            try:
                results.append(run_k(k, tmp))
            except Fail as e:
                # Reported, and the next K runs on a fresh broker.
                failed = True
                print(f"scale.py: {e}", file=sys.stderr)
                print(f"scale.py: logs in {tmp}", file=sys.stderr)
                print(json.dumps({"workers": k, "error": str(e), "loadavg": loadavg()}), flush=True)
            finally:
                stop_all()
    except KeyboardInterrupt:
        print("scale.py: interrupted; processes stopped", file=sys.stderr)
        table(results)
        sys.exit(130)
    finally:
        stop_all()
    table(results)
    if failed:
        sys.exit(1)


def table(results):
    if not results:
        return
    print(f"\n{'K':>2} {'starts/s':>9} {'start p50/p99 ms':>17} {'ev->Paid/s dec/seen':>19} "
          f"{'RSS idle MB':>14} {'RSS started MB':>18} {'RSS paid MB':>18} {'B/inst st/paid':>15} {'load 1m':>8}")
    for r in results:
        rs = r["rss_mb"]
        print(f"{r['workers']:>2} {r['starts_per_s']:>9} {r['start_ms']['p50']:>8}/{r['start_ms']['p99']:<8} "
              f"{str(r['event_transitions_per_s']) + '/' + str(r['event_transitions_per_s_seen']):>19} {'/'.join(str(x) for x in rs['idle']):>14} "
              f"{'/'.join(str(x) for x in rs['after_starts']):>18} {'/'.join(str(x) for x in rs['after_paid']):>18} "
              f"{str(r['bytes_per_instance']['after_starts']) + '/' + str(r['bytes_per_instance']['after_paid']):>15} "
              f"{r['loadavg']['before'][0]:>4}/{r['loadavg']['after_paid'][0]}")


if __name__ == "__main__":
    main()
