#!/usr/bin/env python3
"""Kafka mode: how long the HTTP API takes to answer a write, beside the broker's own floor, in one run
(issue 41).

On a fresh tansu broker (memory storage) and topic prefix, BENCH_WORKERS (3) `sm4c serve --kafka`
workers (release build, one group, --partitions BENCH_PARTITIONS (6), each its own --listen port) and
the `waiter` definition of restart.py (an instance waits two hours for a `bench.paid` event correlated
by its orderId). Once every partition is owned and none is restoring, for 2 s running:

1. **floor**: BENCH_FLOOR (300) one after another: a transactional produce of one 100-byte record
   (begin, produce, commit) read back by a `read_committed` consumer (fetch.wait.max.ms
   BENCH_CLIENT_FETCH_WAIT, 5 as in bench.py), same client library (confluent-kafka); p50/p99 from
   before the begin to the record in the reader's hand.
2. **preload** (BENCH_PRELOAD, 0 by default): that many waiting instances started from `bench.order`
   CloudEvents produced as fast as the client goes (the waiter's startEvent), until the state topic
   holds them all, then BENCH_SETTLE (10) s.
3. **starts**: `POST /instances` at each client count in BENCH_CLIENTS (1,8,64): client t talks to worker
   t mod K over one kept-alive connection and starts its instances one after another, BENCH_PER_CLIENT
   (a budget of BENCH_REQUESTS (1200) requests per count, at least 20 and at most 300 per client);
   p50/p99 of the answers (each must be 201). Then the floor again, so the ratio is to the floor taken
   around the starts.
4. **events and cancels** at 8 clients: `POST /events` of a `bench.paid` event correlated to one of the
   started instances (answered once the event is in the events topic), and `POST /instances/{id}/cancel`
   of others (answered once the owner committed the cancel).

With each client count, the CPU the broker and the workers spent per start and how many cores they kept
busy (the machine has 2, shared with this client): at N clients each starting one after another, the
latency is N over the starts per second, so where the cores are busy the latency is bound by the CPU
per start.

Per-hop timings: with BENCH_HOPS=1 the workers log at debug for the sm4c crates, and the script reads
from their logs, for the starts of step 3, the hops each build logs: `write forwarded` (the receiving
worker's forward to the owner, whole), `start answered` (at the owner's API: the instance looked up,
the command appended to P.commands, the decision seen committed), `batch` (the age of a polled batch's
oldest record: from its produce to the owner's poll), `decided` (the engine) and `transaction` (the
commit: produce, offsets, acknowledgements, commit). Debug logging costs a little: compare figures of
runs with the same BENCH_HOPS.

Run from the repository after `source scripts/setup.sh` and `cargo build --release -p sm4c`:
    python3 bench/kafka/latency.py
Knobs (environment): SM4C_BIN (target/release/sm4c; a comma-separated list runs each build in turn, each
on a fresh broker), BENCH_WORKERS (3), BENCH_PARTITIONS (6), BENCH_CLIENTS (1,8,64), BENCH_REQUESTS
(1200), BENCH_FLOOR (300), BENCH_PRELOAD (0), BENCH_SETTLE (10), BENCH_HOPS (0), BENCH_ROUNDS (1: the
builds' turns), BENCH_WORKER_ARGS (more arguments for the workers, space-separated). Prints one JSON line per build and round, then a table; logs stay in a temporary folder
named on stderr.
"""

import http.client
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scale  # noqa: E402  (the helpers: spawn, ports, HTTP)
from restart import WAITER  # noqa: E402

ROOT = scale.ROOT
BINS = [b for b in os.environ.get("SM4C_BIN", os.path.join(ROOT, "target", "release", "sm4c")).split(",") if b]
K = int(os.environ.get("BENCH_WORKERS", "3"))
PARTS = int(os.environ.get("BENCH_PARTITIONS", "6"))
scale.PARTS = PARTS
CLIENTS = [int(c) for c in os.environ.get("BENCH_CLIENTS", "1,8,64").split(",") if c.strip()]
REQUESTS = int(os.environ.get("BENCH_REQUESTS", "1200"))
FLOOR_N = int(os.environ.get("BENCH_FLOOR", "300"))
PRELOAD = int(os.environ.get("BENCH_PRELOAD", "0"))
SETTLE = float(os.environ.get("BENCH_SETTLE", "10"))
HOPS = os.environ.get("BENCH_HOPS", "0") == "1"
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "1"))
FETCH_WAIT = int(os.environ.get("BENCH_CLIENT_FETCH_WAIT", "5"))
EXTRA = os.environ.get("BENCH_WORKER_ARGS", "").split()


def pct(xs, p):
    return round(scale.pct(xs, p), 2) if xs else None


def floor(bootstrap, prefix, n):
    """The broker's floor: a transactional produce of one record read back read_committed."""
    topic = f"{prefix}.floor"
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{prefix}-floor-{uuid.uuid4()}",
                  "linger.ms": 1})
    p.init_transactions(30)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{prefix}-floor", "isolation.level": "read_committed",
                  "fetch.wait.max.ms": FETCH_WAIT, "enable.auto.commit": False})
    # The topic made by a first produce; the reader placed at its end before the first measured one.
    p.begin_transaction()
    p.produce(topic, b"x" * 100, partition=0)
    p.commit_transaction(30)
    c.assign([TopicPartition(topic, 0, 1)])
    deadline = time.time() + 30
    times = []
    payload = b"x" * 100
    for i in range(n + 10):
        t0 = time.perf_counter()
        p.begin_transaction()
        p.produce(topic, payload, partition=0)
        p.commit_transaction(30)
        while True:
            m = c.poll(1)
            if m is not None and not m.error():
                break
            if time.time() > deadline + n:
                raise scale.Fail("the floor's reader did not get its record")
        if i >= 10:
            times.append((time.perf_counter() - t0) * 1000)
    c.close()
    return {"p50": pct(times, 0.5), "p99": pct(times, 0.99), "n": len(times)}


def clients_run(workers, clients, per_client, make):
    """`clients` threads, thread t on worker t mod K over a kept-alive connection, each making
    `per_client` requests one after another: `make(t, i)` gives (method, path, body, expected
    statuses[, content type]). Latencies in ms, requests per second overall."""
    lat, errors = [], []
    lock = threading.Lock()

    def run(t):
        api = workers[t % len(workers)][1]
        conn = http.client.HTTPConnection("127.0.0.1", api, timeout=60)
        mine = []
        try:
            for i in range(per_client):
                method, path, body, ok, *ctype = make(t, i)
                t0 = time.perf_counter()
                conn.request(method, path, body, {"content-type": (ctype or ["application/json"])[0]})
                r = conn.getresponse()
                data = r.read()
                ms = (time.perf_counter() - t0) * 1000
                if r.status not in ok:
                    errors.append(f"{method} {path} on port {api}: {r.status} {data[:200]!r}")
                    return
                mine.append(ms)
        except Exception as e:  # noqa: BLE001 - reported by the caller
            errors.append(f"client {t}: {e!r}")
        finally:
            conn.close()
            with lock:
                lat.extend(mine)

    threads = [threading.Thread(target=run, args=(t,), daemon=True) for t in range(clients)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join(600)
    wall = time.perf_counter() - t0
    if errors:
        raise scale.Fail(errors[0])
    return {"p50": pct(lat, 0.5), "p99": pct(lat, 0.99), "n": len(lat), "per_s": round(len(lat) / wall)}


ANSI = re.compile(r"\x1b\[[0-9;]*m")
HOP = re.compile(r"sm4c_\w+(?:::\w+)*: (start answered|cancel answered|write forwarded|batch|decided|transaction) (.*)$")
FIELD = re.compile(r"(\w+)=(\d+)")


def hop_marks(logs):
    """Byte offsets of each worker log now: hops() reads what comes after."""
    return [os.path.getsize(f) if os.path.exists(f) else 0 for f in logs]


def hops(logs, marks):
    """Medians (and p99) of each hop's fields over what the logs gained since `marks`."""
    seen = {}
    for f, m in zip(logs, marks):
        with open(f, errors="replace") as fh:
            fh.seek(m)
            for line in fh:
                h = HOP.search(ANSI.sub("", line))
                if not h:
                    continue
                fields = dict(FIELD.findall(h.group(2)))
                # The settling transactions (no records) and empty batches are not on a write's path.
                if h.group(1) == "transaction" and fields.get("records") == "0":
                    continue
                for k, v in fields.items():
                    if k.endswith("_us") or k.endswith("_ms") or k in ("messages", "commands", "records"):
                        seen.setdefault(f"{h.group(1)}.{k}", []).append(int(v))
    return {k: {"p50": statistics.median(v), "p99": scale.pct(v, 0.99), "n": len(v)} for k, v in sorted(seen.items())}


def run(sm4c, tmp, tag):
    prefix = f"lat{tag}x{int(time.time())}"
    port = scale.free_port()
    bootstrap = f"127.0.0.1:{port}"
    url = f"tcp://{bootstrap}"
    broker = scale.spawn("tansu", [scale.TANSU, "broker", "--listener-url", url, "--advertised-listener-url", url],
                         os.path.join(tmp, f"broker-{tag}.log"))
    scale.wait_port(port, "tansu")
    defs = os.path.join(tmp, "defs")
    os.makedirs(defs, exist_ok=True)
    with open(os.path.join(defs, "waiter.json"), "w") as f:
        json.dump(WAITER, f)
    level = "warn,sm4c_kafka=debug,sm4c_api=debug" if HOPS else os.environ.get("BENCH_LOG", "warn")
    workers, logs = [], []
    for w in range(K):
        api = scale.free_port()
        log = os.path.join(tmp, f"worker-{tag}-{w}.log")
        p = scale.spawn(f"worker {w}", [sm4c, "serve", "--kafka", bootstrap, "--group", prefix, "--topic-prefix", prefix,
                                        "--partitions", str(PARTS), "--definitions", defs, "--listen", f"127.0.0.1:{api}",
                                        "--kafka-config", "session.timeout.ms=6000", *EXTRA],
                        log, env={**os.environ, "RUST_LOG": level})
        workers.append((p, api))
        logs.append(log)
    for w, (_, api) in enumerate(workers):
        scale.wait_port(api, f"worker {w}", timeout=60)
    deadline = time.time() + 120
    stable = None
    while True:
        scale.check_alive()
        hs = [scale.get(api, "/healthz") for _, api in workers]
        owned = [h.get("ownedPartitions", 0) for h in hs]
        if sum(owned) == PARTS and all(h.get("restoringPartitions", 0) == 0 for h in hs) and all(o > 0 for o in owned):
            stable = stable or time.time()
            if time.time() - stable >= 2:
                break
        else:
            stable = None
        if time.time() > deadline:
            raise scale.Fail(f"the workers did not settle on {PARTS} partitions within 120 s: owned {owned}")
        time.sleep(0.2)
    scale.log(f"[{tag}] partitions owned {owned}")
    out = {"binary": sm4c, "args": EXTRA, "workers": K, "partitions": PARTS, "owned": owned, "preload": PRELOAD, "hops": HOPS}
    out["floor_before"] = floor(bootstrap, prefix, FLOOR_N)
    scale.log(f"[{tag}] floor {out['floor_before']}")
    if PRELOAD:
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "queue.buffering.max.messages": 1000000})
        t0 = time.time()
        for i in range(PRELOAD):
            headers = [("ce_specversion", b"1.0"), ("ce_id", f"pre{i}".encode()), ("ce_source", b"bench"),
                       ("ce_type", b"bench.order"), ("content-type", b"application/json")]
            while True:
                try:
                    producer.produce(f"{prefix}.events", value=json.dumps({"orderId": f"pre-{i}"}).encode(),
                                     key=f"pre{i}".encode(), headers=headers)
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.flush(120)
        deadline = time.time() + 1800
        # Every instance held by its owner's API (the rows of the local stores; the state topic's
        # end offsets also count subscriptions and transaction markers).
        while sum(scale.get(api, "/healthz").get("instances", 0) for _, api in workers) < PRELOAD:
            scale.check_alive()
            if time.time() > deadline:
                raise scale.Fail("the preloaded instances did not all start within 30 minutes")
            time.sleep(1)
        out["preload_s"] = round(time.time() - t0, 1)
        scale.log(f"[{tag}] {PRELOAD} instances waiting after {out['preload_s']} s")
        time.sleep(SETTLE)

    def start(t, i):
        body = json.dumps({"definition": "waiter", "id": f"s{t}-{i}-{tag}", "input": {"orderId": f"ord-{t}-{i}-{tag}"}})
        return "POST", "/instances", body, (201,)

    # A warm-up: every worker's connections to the others made.
    clients_run(workers, 2 * K, 5, lambda t, i: ("POST", "/instances",
                json.dumps({"definition": "waiter", "id": f"w{t}-{i}-{tag}", "input": {"orderId": f"w-{t}-{i}"}}), (201,)))
    out["starts"] = {}
    started = {}
    pids = [broker.pid] + [p.pid for p, _ in workers]
    for n in CLIENTS:
        per = max(20, min(300, REQUESTS // n))
        marks = hop_marks(logs)
        cpu0, wall0 = [scale.cpu_s(x) for x in pids], time.time()
        r = clients_run(workers, n, per, lambda t, i, n=n: start(t, i + n * 1000))
        cpu1, wall1 = [scale.cpu_s(x) for x in pids], time.time()
        # CPU per start (ms) of the broker and of the workers together, and how busy the machine's
        # cores were with them (the client's own CPU not counted).
        used = [b - a for a, b in zip(cpu0, cpu1)]
        r["cpu_ms_per_start"] = {"broker": round(used[0] / r["n"] * 1000, 2),
                                 "workers": round(sum(used[1:]) / r["n"] * 1000, 2)}
        r["cores_busy"] = round(sum(used) / (wall1 - wall0), 2)
        if HOPS:
            r["hops"] = hops(logs, marks)
        out["starts"][str(n)] = r
        started[n] = per
        scale.log(f"[{tag}] starts, {n} clients: {r['p50']} / {r['p99']} ms, {r['per_s']}/s")
    out["floor_after"] = floor(bootstrap, prefix, FLOOR_N)
    scale.log(f"[{tag}] floor {out['floor_after']}")
    # Events and cancels at 8 clients, on the instances the 8-client starts made (or the first count's).
    n8 = 8 if 8 in started else CLIENTS[0]
    per = started[n8]
    half = per // 2

    def event(t, i):
        ev = {"specversion": "1.0", "id": f"paid-{t}-{i}-{tag}", "source": "bench", "type": "bench.paid",
              "orderid": f"ord-{t}-{i + n8 * 1000}-{tag}", "data": {}}
        return "POST", "/events", json.dumps(ev), (202, 200), "application/cloudevents+json"

    def cancel(t, i):
        return "POST", f"/instances/s{t}-{half + i + n8 * 1000}-{tag}/cancel", "", (200,)

    marks = hop_marks(logs)
    out["events"] = clients_run(workers, n8, half, event)
    if HOPS:
        out["events"]["hops"] = hops(logs, marks)
    marks = hop_marks(logs)
    out["cancels"] = clients_run(workers, n8, per - half, cancel)
    if HOPS:
        out["cancels"]["hops"] = hops(logs, marks)
    scale.log(f"[{tag}] events {out['events']['p50']} / {out['events']['p99']} ms; "
              f"cancels {out['cancels']['p50']} / {out['cancels']['p99']} ms")
    f50 = (out["floor_before"]["p50"] + out["floor_after"]["p50"]) / 2
    f99 = (out["floor_before"]["p99"] + out["floor_after"]["p99"]) / 2
    out["ratio"] = {n: {"p50": round(r["p50"] / f50, 2), "p99": round(r["p99"] / f99, 2)} for n, r in out["starts"].items()}
    out["loadavg"] = scale.loadavg()
    del broker
    return out


def table(results):
    print(f"\n{'binary':<28} {'floor p50/p99':>15} " + " ".join(f"{str(n) + ' cl p50/p99 (x floor) /s cores':>36}" for n in CLIENTS)
          + f" {'events p50/p99':>15} {'cancels p50/p99':>16}")
    for r in results:
        if "error" in r:
            print(f"{os.path.basename(r['binary']):<28} failed: {r['error']}")
            continue
        f = r["floor_before"], r["floor_after"]
        cells = []
        for n in CLIENTS:
            s, q = r["starts"][str(n)], r["ratio"][str(n)]
            cells.append(f"{s['p50']}/{s['p99']} ({q['p50']}x/{q['p99']}x) {s['per_s']}/s {s['cores_busy']}c")
        print(f"{os.path.basename(r['binary']):<28} {f[0]['p50']}/{f[0]['p99']},{f[1]['p50']}/{f[1]['p99']} "
              + " ".join(f"{c:>36}" for c in cells)
              + f" {r['events']['p50']}/{r['events']['p99']:>8} {r['cancels']['p50']}/{r['cancels']['p99']:>8}")


def main():
    if not scale.TANSU:
        sys.exit("latency.py: set SM4C_TANSU (source scripts/setup.sh)")
    for b in BINS:
        if not os.access(b, os.X_OK):
            sys.exit(f"latency.py: no sm4c binary at {b} (cargo build --release -p sm4c, or set SM4C_BIN)")
    tmp = tempfile.mkdtemp(prefix="sm4c-latency-")
    scale.log(f"logs in {tmp}; binaries {BINS}; {K} workers, {PARTS} partitions, clients {CLIENTS}, preload {PRELOAD}")
    results = []
    try:
        for rnd in range(ROUNDS):
            for i, b in enumerate(BINS):
                try:
                    r = run(b, tmp, f"{rnd}b{i}")
                except scale.Fail as e:
                    r = {"binary": b, "error": str(e)}
                finally:
                    scale.stop_all()
                print(json.dumps(r), flush=True)
                results.append(r)
    except KeyboardInterrupt:
        print("latency.py: interrupted; processes stopped", file=sys.stderr)
    finally:
        scale.stop_all()
    table(results)


if __name__ == "__main__":
    main()
