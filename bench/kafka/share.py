#!/usr/bin/env python3
"""Kafka mode: what each worker holds, with K workers and BENCH_INSTANCES (100,000) waiting instances
(issue 13, "Performance": each worker's RSS with 100,000 waiting instances).

For each K in BENCH_WORKERS (1,2,3), on a fresh tansu broker (memory storage) and topic prefix: K
`sm4c serve --kafka` workers (--partitions BENCH_PARTITIONS, default 6; each its own port and
temporary state directory) and the `waiter` definition of `restart.py` (started by `bench.order`
CloudEvents, then waiting two hours for a correlated event). Once every partition is owned:

1. BENCH_INSTANCES `bench.order` events are produced to `<prefix>.events` as fast as the client goes;
   the script waits until the state topic holds them all and the workers are idle (10 s);
2. each worker's RSS (VmRSS), idle (before step 1) and after, and `instances` from its `GET /healthz`
   (what its API holds), with `instancesInMemory` (what its owners keep in memory to decide) and
   `recordsInMemory` (the API's records its local stores do not have yet); the cluster's bytes per instance beyond the idle RSS (sum over workers of the
   growth, divided by BENCH_INSTANCES) and each worker's growth per instance of the cluster;
3. through worker 0: `GET /instances/{id}` of 200 instances spread over all partitions (p50/p99 ms,
   and how many another worker answered: `sm4c-answered-by`), and a listing of every instance in pages
   of 1,000 (s).

Run from the repository after `source scripts/setup.sh` and `cargo build --release -p sm4c`:
    python3 bench/kafka/share.py
Knobs: SM4C_BIN, BENCH_WORKERS (1,2,3), BENCH_INSTANCES (100000), BENCH_PARTITIONS (6),
BENCH_EVENTS (1: also the events step), BENCH_WORKER_ARGS (more arguments for the workers, space-separated),
BENCH_SETTLE (10: seconds from the last start to the RSS reading), BENCH_LOG (warn, the workers' RUST_LOG).
Prints one JSON line per K; logs stay in a temporary folder named on stderr.
"""

import http.client
import json
import os
import sys
import tempfile
import time
from datetime import datetime

from confluent_kafka import Producer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scale  # noqa: E402  (the helpers: spawn, ports, HTTP, RSS)
from restart import WAITER, state_records  # noqa: E402

N = int(os.environ.get("BENCH_INSTANCES", "100000"))
PARTS = int(os.environ.get("BENCH_PARTITIONS", "6"))
KS = [int(k) for k in os.environ.get("BENCH_WORKERS", "1,2,3").split(",")]
EVENTS = os.environ.get("BENCH_EVENTS", "1") == "1"
EXTRA = os.environ.get("BENCH_WORKER_ARGS", "").split()
# Seconds from the last start to the RSS reading: the sm4c binary gives a burst's free pages back
# every 5 s once its memory stops growing, so a reading needs a few rounds of that.
SETTLE = float(os.environ.get("BENCH_SETTLE", "10"))


def timed_get(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        t = time.time()
        c.request("GET", path)
        r = c.getresponse()
        body = r.read()
        ms = (time.time() - t) * 1000
        if r.status != 200:
            raise scale.Fail(f"GET {path}: {r.status} {body[:200]!r}")
        return ms, r.getheader("sm4c-answered-by"), json.loads(body)
    finally:
        c.close()


def run_k(k, tmp):
    prefix = f"share{k}x{int(time.time())}"
    port = scale.free_port()
    bootstrap = f"127.0.0.1:{port}"
    url = f"tcp://{bootstrap}"
    scale.spawn("tansu", [scale.TANSU, "broker", "--listener-url", url, "--advertised-listener-url", url],
                os.path.join(tmp, f"broker-{k}.log"))
    scale.wait_port(port, "tansu")
    defs = os.path.join(tmp, "defs")
    os.makedirs(defs, exist_ok=True)
    with open(os.path.join(defs, "waiter.json"), "w") as f:
        json.dump(WAITER, f)
    workers = []
    for i in range(k):
        api = scale.free_port()
        p = scale.spawn(f"worker{i}", [
            scale.SM4C, "serve", "--kafka", bootstrap, "--group", prefix, "--topic-prefix", prefix,
            "--partitions", str(PARTS), "--definitions", defs, "--listen", f"127.0.0.1:{api}",
            "--kafka-config", "session.timeout.ms=6000", *EXTRA],
            os.path.join(tmp, f"worker-{k}-{i}.log"), env={**os.environ, "RUST_LOG": os.environ.get("BENCH_LOG", "warn")})
        workers.append((p, api))
    for p, api in workers:
        scale.wait_port(api, "worker", timeout=60)
    deadline = time.time() + 120
    while sum(scale.get(api, "/healthz").get("ownedPartitions", 0) for _, api in workers) != PARTS:
        if time.time() > deadline:
            raise scale.Fail(f"K={k}: the partitions were not all owned within 120 s")
        time.sleep(0.2)
    time.sleep(3)
    rss_idle = [scale.rss_bytes(p.pid) for p, _ in workers]
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "queue.buffering.max.messages": 1000000})
    t0 = time.time()
    for i in range(N):
        headers = [("ce_specversion", b"1.0"), ("ce_id", f"o{i}".encode()), ("ce_source", b"bench"),
                   ("ce_type", b"bench.order"), ("content-type", b"application/json")]
        while True:
            try:
                producer.produce(f"{prefix}.events", value=json.dumps({"orderId": f"order-{i}"}).encode(),
                                 key=f"o{i}".encode(), headers=headers)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(120)
    deadline = time.time() + 1800
    while state_records(bootstrap, f"{prefix}.state") < N:
        if time.time() > deadline:
            raise scale.Fail(f"K={k}: the instances did not all start within 30 minutes")
        time.sleep(1)
    started_s = time.time() - t0
    time.sleep(SETTLE)
    rss = [scale.rss_bytes(p.pid) for p, _ in workers]
    health = [scale.get(api, "/healthz") for _, api in workers]
    held = [h.get("instances") for h in health]
    # Reads through worker 0.
    api0 = workers[0][1]
    listed, after, t = [], None, time.time()
    while True:
        _, _, page = timed_get(api0, "/instances?limit=1000" + (f"&after={after}" if after else ""))
        listed.extend(i["id"] for i in page["instances"])
        after = page.get("next")
        if not after:
            break
    list_s = time.time() - t
    if len(set(listed)) != N or len(listed) != N:
        raise scale.Fail(f"K={k}: the listing through worker 0 gave {len(listed)} ({len(set(listed))} distinct) of {N}")
    times, forwarded = [], 0
    for i in listed[:: max(1, N // 200)][:200]:
        ms, by, _ = timed_get(api0, f"/instances/{i}")
        times.append(ms)
        forwarded += by is not None
    times.sort()
    grow = [b - a for a, b in zip(rss_idle, rss)]
    paid = pay_all(k, bootstrap, prefix, producer, api0) if EVENTS else None
    return {
        "workers": k,
        "instances": N,
        "start_s": round(started_s, 1),
        "held": held,
        # What the owners keep in memory for deciding, and the API's records not yet in the local
        # stores (absent from builds before the bounded cache).
        "instances_in_memory": [h.get("instancesInMemory") for h in health],
        "records_in_memory": [h.get("recordsInMemory") for h in health],
        "rss_mb": {"idle": [round(x / 2**20, 1) for x in rss_idle], "waiting": [round(x / 2**20, 1) for x in rss]},
        "bytes_per_instance": {"cluster": round(sum(grow) / N), "per_worker": [round(g / N) for g in grow]},
        "get_ms": {"p50": round(times[len(times) // 2], 2), "p99": round(times[int(len(times) * 0.99)], 2),
                   "answered_by_another": forwarded, "of": len(times)},
        "list_all_s": round(list_s, 2),
        "paid": paid,
    }


def pay_all(k, bootstrap, prefix, producer, api0):
    """Step 4: a `bench.paid` event for every waiting instance, correlated by its `orderid` attribute
    (binary mode, no sm4cinstanceid), produced as fast as the client goes; then waits until no instance
    waits (`GET /instances?status=waiting&limit=1` on worker 0, every 0.25 s) and reads every instance
    once: each must be in state Paid. Two rates, as scale.py's: "decided", to the latest `endedAt` (set
    when an owner decided the transition, on this machine's clock), and "seen", to the poll that saw
    none waiting."""
    t0 = time.time()
    for i in range(N):
        headers = [("ce_specversion", b"1.0"), ("ce_id", f"p{i}".encode()), ("ce_source", b"bench"),
                   ("ce_type", b"bench.paid"), ("ce_orderid", f"order-{i}".encode()),
                   ("content-type", b"application/json")]
        while True:
            try:
                producer.produce(f"{prefix}.events", value=b"{}", key=f"order-{i}".encode(), headers=headers)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(120)
    produced_s = time.time() - t0
    deadline = time.time() + 1800
    while True:
        _, _, page = timed_get(api0, "/instances?status=waiting&limit=1")
        if not page["instances"]:
            break
        if time.time() > deadline:
            raise scale.Fail(f"K={k}: instances still wait 30 minutes after their events")
        time.sleep(0.25)
    seen_s = time.time() - t0
    ended, states, after = [], {}, None
    while True:
        _, _, page = timed_get(api0, "/instances?limit=1000" + (f"&after={after}" if after else ""))
        for i in page["instances"]:
            states[i.get("state")] = states.get(i.get("state"), 0) + 1
            if i.get("endedAt"):
                ended.append(datetime.fromisoformat(i["endedAt"].replace("Z", "+00:00")).timestamp())
        after = page.get("next")
        if not after:
            break
    if states.get("Paid") != N:
        raise scale.Fail(f"K={k}: after the events the instances are in states {states}, not {N} Paid")
    decided_s = max(ended) - t0
    return {"produced_s": round(produced_s, 1), "decided_per_s": round(N / decided_s),
            "seen_per_s": round(N / seen_s)}


def main():
    if not scale.TANSU:
        sys.exit("share.py: set SM4C_TANSU (source scripts/setup.sh)")
    tmp = tempfile.mkdtemp(prefix="sm4c-share-")
    scale.log(f"logs in {tmp}; {N} instances, {PARTS} partitions, K in {KS}, {scale.SM4C}")
    for k in KS:
        try:
            r = run_k(k, tmp)
        except scale.Fail as e:
            r = {"workers": k, "error": str(e)}
        finally:
            scale.stop_all()
        print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
