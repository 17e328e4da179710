#!/usr/bin/env python3
"""Kafka-mode figures, measured in one run against one tansu broker (memory storage):

1. raw: the produce-and-consume round trip of a 100-byte message (p50, p99), and how many 100-byte
   messages per second one producer and one consumer move (the floor);
2. sm4c: the latency from an incoming event to the transition it triggers to the event that
   transition sends, through one `sm4c serve --kafka` worker with transactions (p50, p99);
3. sm4c: event-triggered transitions per second through that worker (BENCH_TOTAL pings, 20,000 by
   default, to 200 instances), and the CPU time the broker, the worker and this client each spent per
   transition meanwhile.

The throughput pings are produced as the raw floor's messages are (linger.ms=5). tansu lists every
stored batch of a partition on each fetch that finds new data, so a producer sending one batch per
event makes every later fetch dearer: with linger.ms=0 for these pings, the broker spent 270-460 us of
CPU per transition instead of 45-70. BENCH_KAFKA_CONFIG="k=v ..." passes settings to the worker;
BENCH_CLIENT_FETCH_WAIT sets this client's fetch.wait.max.ms (5 by default). tansu does not answer a
waiting fetch when data arrives, as Kafka does, but at points within the wait, so a reader's fetch wait
is part of every latency measured on it: 1 ms takes the raw round trip from 4.5 to 2.8 ms here, but its
idle fetches load the broker and the sm4c figures do not improve.

Run from the repository after `source scripts/setup.sh` and `cargo build --release`:
    python3 bench/kafka/bench.py
The confluent-kafka client does all the producing and consuming, for the raw and the sm4c figures alike.
"""

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SM4C = os.environ.get("SM4C_BIN", os.path.join(ROOT, "target", "release", "sm4c"))
# The bare transactional loop the worker is measured beside (host/kafka/examples/bare_loop.rs).
BARE = os.environ.get("SM4C_BARE", os.path.join(ROOT, "target", "release", "examples", "bare_loop"))
TANSU = os.environ.get("SM4C_TANSU")
# Partitions of the worker's topics (commands, events, out): one worker owns them all.
PARTS = os.environ.get("BENCH_PARTITIONS", "2")
if not TANSU:
    sys.exit("bench.py: set SM4C_TANSU (source scripts/setup.sh)")
if not os.path.exists(BARE):
    sys.exit(f"bench.py: no {BARE}: cargo build --release -p sm4c-kafka --example bare_loop")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def cpu_s(pid):
    """User plus system CPU seconds a process has used so far (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return float("nan")


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def wait_port(port, what):
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"bench.py: {what} did not listen")


def http(method, url, body=None):
    req = urllib.request.Request(url, method=method, data=None if body is None else json.dumps(body).encode())
    req.add_header("content-type", "application/json")
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read() or b"null")


def consumer(bootstrap, topic, partitions):
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-reader",
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": int(os.environ.get("BENCH_CLIENT_FETCH_WAIT", "5")),
            "enable.auto.commit": False,
        }
    )
    c.assign([TopicPartition(topic, p, -2) for p in range(partitions)])  # fresh topics: from the start
    return c


def main():
    tmp = tempfile.mkdtemp()
    print(f"logs in {tmp}", file=sys.stderr)
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    url = f"tcp://{bootstrap}"
    broker = subprocess.Popen(
        [TANSU, "broker", "--listener-url", url, "--advertised-listener-url", url],
        stdout=open(os.path.join(tmp, "broker.log"), "w"),
        stderr=subprocess.STDOUT,
    )
    worker = None
    try:
        wait_port(port, "tansu")
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for f in admin.create_topics([NewTopic("raw", 1, 1)]).values():
            f.result()
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
        c = consumer(bootstrap, "raw", 1)
        payload = b"x" * 100
        # Warm up both clients.
        for _ in range(20):
            p.produce("raw", payload)
            p.flush()
            while c.poll(1.0) is None:
                pass
        rtts = []
        for _ in range(1000):
            t0 = time.perf_counter()
            p.produce("raw", payload)
            p.flush()
            while True:
                m = c.poll(1.0)
                if m is not None and not m.error():
                    break
            rtts.append((time.perf_counter() - t0) * 1000)
        n = 50_000
        pb = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        t0 = time.perf_counter()
        for _ in range(n):
            while True:
                try:
                    pb.produce("raw", payload)
                    break
                except BufferError:
                    pb.poll(0.01)
        pb.flush()
        got = 0
        while got < n:
            ms = c.consume(1000, 1.0)
            got += sum(1 for m in ms if not m.error())
        raw_rate = n / (time.perf_counter() - t0)

        # One worker, transactions on.
        defs = os.path.join(tmp, "defs")
        os.mkdir(defs)
        with open(os.path.join(ROOT, "bench", "kafka", "pinger.json")) as src, open(os.path.join(defs, "pinger.json"), "w") as dst:
            dst.write(src.read())
        api = free_port()
        worker = subprocess.Popen(
            [SM4C, "serve", "--kafka", bootstrap, "--group", "bench", "--topic-prefix", "bench", "--partitions", PARTS,
             "--definitions", defs, "--listen", f"127.0.0.1:{api}", "--kafka-config", "session.timeout.ms=6000"]
            + [a for kv in os.environ.get("BENCH_KAFKA_CONFIG", "").split() for a in ("--kafka-config", kv)],
            stdout=open(os.path.join(tmp, "worker.log"), "w"),
            stderr=subprocess.STDOUT,
            env={**os.environ, "RUST_LOG": os.environ.get("BENCH_LOG", "warn")},
        )
        wait_port(api, "sm4c")
        base = f"http://127.0.0.1:{api}"
        deadline = time.time() + 60
        while http("GET", base + "/healthz").get("ownedPartitions") != int(PARTS):
            if time.time() > deadline:
                sys.exit("bench.py: the worker did not take its partitions")
            time.sleep(0.1)
        instances = 200
        for i in range(instances):
            http("POST", base + "/instances", {"definition": "pinger", "id": f"p{i}", "input": {}})
        pongs = consumer(bootstrap, "bench.events.out", int(PARTS))
        pp = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})

        # The throughput pings batch as the raw floor's producer does (linger.ms=5).
        pb = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})

        def ping(i, n, flush=True, pp=pp, topic="bench.events"):
            ev = {"specversion": "1.0", "id": f"ping-{n}", "source": "bench", "type": "bench.ping",
                  "sm4cinstanceid": f"p{i}", "datacontenttype": "application/json", "data": {"n": n}}
            while True:
                try:
                    pp.produce(topic, json.dumps(ev).encode(), key=f"p{i}",
                               headers={"content-type": "application/cloudevents+json"})
                    break
                except BufferError:
                    pp.poll(0.01)
            if flush:
                pp.flush()

        def pong_n(m):
            return json.loads(m.value())["n"] if m.value() else None

        def measure(topic, pongs, procs):
            """Sequential latency (500 pings after 50 warm-up ones), then throughput (`total` pings
            in flight) and the CPU each of `procs` (and this client) spent per pong meanwhile."""
            for k in range(50):
                ping(k % instances, -1 - k, topic=topic)
                while True:
                    m = pongs.poll(5.0)
                    if m is not None and not m.error() and pong_n(m) == -1 - k:
                        break
            lat = []
            # Where each ping's time went, by the pong's create time (set when it was produced,
            # inside its transaction; millisecond resolution, one clock): ping sent -> pong produced,
            # and pong produced -> pong read (the rest of the transaction, then the reader's fetch).
            split = []
            for k in range(500):
                t0 = time.perf_counter()
                w0 = time.time()
                ping(k % instances, k, topic=topic)
                while True:
                    m = pongs.poll(5.0)
                    if m is None:
                        sys.exit(f"bench.py: no pong on {topic} within 5 s")
                    if not m.error() and pong_n(m) == k:
                        break
                lat.append((time.perf_counter() - t0) * 1000)
                split.append((m.timestamp()[1] - w0 * 1000, time.time() * 1000 - m.timestamp()[1]))
            print(f"{topic}: latency p50 {statistics.median(lat):.2f} ms, p99 {pct(lat, 0.99):.2f} ms", file=sys.stderr, flush=True)
            total = int(os.environ.get("BENCH_TOTAL", "20000"))
            cpu0 = [cpu_s(p.pid) for p in procs] + [time.process_time()]
            t0 = time.perf_counter()
            for k in range(total):
                ping(k % instances, 100_000 + k, flush=False, pp=pb, topic=topic)
                if k % 1000 == 0:
                    pb.poll(0)
            pb.flush()
            got = 0
            deadline = time.time() + 300
            while got < total and time.time() < deadline:
                for m in pongs.consume(1000, 1.0):
                    if not m.error():
                        got += 1
            rate = got / (time.perf_counter() - t0)
            cpu1 = [cpu_s(p.pid) for p in procs] + [time.process_time()]
            return {
                "ms": {"p50": round(statistics.median(lat), 2), "p99": round(pct(lat, 0.99), 2)},
                "event_to_produced_ms_p50": round(statistics.median([a for a, _ in split]), 2),
                "produced_to_read_ms_p50": round(statistics.median([b for _, b in split]), 2),
                "per_s": round(rate),
                "pongs": got,
                "cpu_us": [round((b - a) / max(got, 1) * 1e6) for a, b in zip(cpu0, cpu1)],
            }

        sm = measure("bench.events", pongs, [broker, worker])
        worker.terminate()
        worker.wait()
        worker = None
        # The same pings through a bare transactional consume-transform-produce loop (rdkafka, the
        # worker's client settings and batching), on topics of its own with as many partitions.
        for f in admin.create_topics([NewTopic(t, int(PARTS), 1) for t in ("bare.in", "bare.out")]).values():
            f.result()
        bare = subprocess.Popen([BARE, bootstrap, "bare.in", "bare.out"], stdout=open(os.path.join(tmp, "bare.log"), "w"),
                                stderr=subprocess.STDOUT)
        try:
            bl = measure("bare.in", consumer(bootstrap, "bare.out", int(PARTS)), [broker, bare])
        finally:
            bare.terminate()
            bare.wait()
        cpu_us = dict(zip(("broker", "worker", "client"), sm["cpu_us"]))
        out = {
            "raw_rtt_ms": {"p50": round(statistics.median(rtts), 2), "p99": round(pct(rtts, 0.99), 2)},
            "raw_msgs_per_s": round(raw_rate),
            "event_to_sent_event_ms": sm["ms"],
            "event_to_produced_ms_p50": sm["event_to_produced_ms_p50"],
            "produced_to_read_ms_p50": sm["produced_to_read_ms_p50"],
            "event_transitions_per_s": sm["per_s"],
            "pongs": sm["pongs"],
            "cpu_us_per_transition": cpu_us,
            "bare_loop": {"ms": bl["ms"], "event_to_produced_ms_p50": bl["event_to_produced_ms_p50"],
                          "per_s": bl["per_s"], "pongs": bl["pongs"],
                          "cpu_us": dict(zip(("broker", "loop", "client"), bl["cpu_us"]))},
        }
        print(json.dumps(out))
        print(
            f"raw round trip p50 {out['raw_rtt_ms']['p50']} ms, p99 {out['raw_rtt_ms']['p99']} ms; raw floor {out['raw_msgs_per_s']} msgs/s\n"
            f"sm4c event -> transition -> sent event p50 {sm['ms']['p50']} ms, p99 {sm['ms']['p99']} ms\n"
            f"  of which (p50): event sent -> pong produced {sm['event_to_produced_ms_p50']} ms, pong produced -> read {sm['produced_to_read_ms_p50']} ms\n"
            f"bare transactional loop: p50 {bl['ms']['p50']} ms, p99 {bl['ms']['p99']} ms "
            f"(sm4c / bare: p50 {sm['ms']['p50'] / bl['ms']['p50']:.2f}x, p99 {sm['ms']['p99'] / bl['ms']['p99']:.2f}x); "
            f"{bl['per_s']} pongs/s\n"
            f"sm4c event-triggered transitions {sm['per_s']}/s through one worker "
            f"({sm['per_s'] / out['raw_msgs_per_s']:.2f} of the raw floor)\n"
            f"CPU per transition: broker {cpu_us['broker']} us, worker {cpu_us['worker']} us, client {cpu_us['client']} us"
        )
    finally:
        if worker:
            worker.terminate()
            worker.wait()
        broker.kill()
        broker.wait()


if __name__ == "__main__":
    main()
