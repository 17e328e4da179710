#!/usr/bin/env python3
"""Kafka mode: a worker's time from SIGKILL and restart to serving again, with BENCH_INSTANCES (100,000)
instances waiting, warm (its --state-dir kept) and cold (a new, empty --state-dir), in one run
(issue 13, "Performance").

With a fresh tansu broker and topic prefix, one `sm4c serve --kafka` worker (--partitions BENCH_PARTITIONS,
default 6, --state-dir in a temporary folder) and a definition started by `bench.order` CloudEvents that
then waits two hours for a correlated `bench.paid` event:

1. BENCH_INSTANCES `bench.order` events (binary mode, produced to `<prefix>.events` as fast as the client
   goes) start as many instances; the script waits until the state topic holds them all (its
   partitions' end offsets add up to at least BENCH_INSTANCES records) and the worker is idle.
2. warm: SIGKILL, then start the worker again with the same --state-dir. Measured from the spawn to
   (a) every partition restored (`ownedPartitions` in `GET /healthz`, which waits for the HTTP listener)
   and to (b) the first answer of `GET /healthz`; and, from the workers' log, each partition's restore time
   and how many state records it read (the rest came from the local store).
3. cold: SIGKILL, then start it with a new, empty --state-dir: the same figures.

Also the worker's RSS once it serves after each restart, the state directory's size on disk, and how long
`GET /instances/{id}/history` takes for 20 instances (p50 and max): before the kill and after the warm
restart once the local journals caught up, and after the cold restart both at once (while the journals
catch up, history scans the journal partition) and once caught up.

Run from the repository after `source scripts/setup.sh` and `cargo build --release -p sm4c`:
    python3 bench/kafka/restart.py
Knobs (environment): SM4C_BIN (default target/release/sm4c), BENCH_INSTANCES (100000), BENCH_PARTITIONS (6),
BENCH_WORKER_ARGS (more arguments for the worker, space-separated).
Prints one JSON line on stdout; logs stay in a temporary folder named on stderr.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from confluent_kafka import Consumer, Producer, TopicPartition

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scale  # noqa: E402  (the helpers: spawn, ports, HTTP, RSS)

N = int(os.environ.get("BENCH_INSTANCES", "100000"))
PARTS = int(os.environ.get("BENCH_PARTITIONS", "6"))
EXTRA = os.environ.get("BENCH_WORKER_ARGS", "").split()

WAITER = {
    "id": "waiter",
    "version": "1.0",
    "name": "Waiter",
    "startEvent": {"type": "bench.order", "source": "bench"},
    "events": [
        {
            "name": "paid",
            "type": "bench.paid",
            "source": "bench",
            "correlation": [{"contextAttributeName": "orderid", "contextAttributeValue": "${ .orderId }"}],
        }
    ],
    "states": [
        {
            "name": "Wait",
            "start": True,
            "transitions": [
                {"nextState": "Paid", "eventGroups": [{"events": ["paid"]}]},
                {"nextState": "TimedOut", "timeout": "PT2H"},
            ],
        },
        {"name": "Paid", "final": True},
        {"name": "TimedOut", "final": True},
    ],
}

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def state_records(bootstrap, topic):
    """The end offsets of the state topic's partitions, added up."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "restart-bench-probe"})
    try:
        total = 0
        for p in range(PARTS):
            _, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            total += high
        return total
    finally:
        c.close()


def restores(logfile, since):
    """The `partition restored` lines written after byte `since`: [(partition, ms, records, known)]."""
    out = []
    with open(logfile, errors="replace") as f:
        f.seek(since)
        for line in f:
            line = ANSI.sub("", line)
            if "partition restored" not in line:
                continue
            fields = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
            out.append((int(fields["partition"]), int(fields["ms"]), int(fields["records"]), int(fields.get("known", 0))))
    return out


def du(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


def kill9(p):
    """SIGKILL, and out of the processes the helpers watch (they fail on one that exited)."""
    p.send_signal(signal.SIGKILL)
    p.wait()
    scale.PROCS[:] = [(n, q) for n, q in scale.PROCS if q is not p]


def main():
    if not scale.TANSU:
        sys.exit("restart.py: set SM4C_TANSU (source scripts/setup.sh)")
    tmp = tempfile.mkdtemp(prefix="sm4c-restart-")
    scale.log(f"logs in {tmp}; {N} instances, {PARTS} partitions")
    prefix = f"restart{int(time.time())}"
    port = scale.free_port()
    bootstrap = f"127.0.0.1:{port}"
    url = f"tcp://{bootstrap}"
    scale.spawn("tansu", [scale.TANSU, "broker", "--listener-url", url, "--advertised-listener-url", url],
                os.path.join(tmp, "broker.log"))
    scale.wait_port(port, "tansu")
    defs = os.path.join(tmp, "defs")
    os.makedirs(defs)
    with open(os.path.join(defs, "waiter.json"), "w") as f:
        json.dump(WAITER, f)
    api = scale.free_port()
    logfile = os.path.join(tmp, "worker.log")

    def worker(state_dir):
        open(logfile, "a").close()
        since = os.path.getsize(logfile)
        t0 = time.time()
        p = subprocess.Popen(
            [scale.SM4C, "serve", "--kafka", bootstrap, "--group", prefix, "--topic-prefix", prefix,
             "--partitions", str(PARTS), "--definitions", defs, "--listen", f"127.0.0.1:{api}",
             "--state-dir", state_dir, "--kafka-config", "session.timeout.ms=6000"] + EXTRA,
            stdout=open(logfile, "a"), stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "RUST_LOG": "info,librdkafka=warn"})
        scale.PROCS.append(("worker", p))
        return p, t0, since

    def serving(p, t0, since, what):
        scale.wait_port(api, what, timeout=600)
        first_answer = None
        deadline = time.time() + 600
        while True:
            if p.poll() is not None:
                raise scale.Fail(f"{what}: the worker exited with {p.returncode}")
            try:
                h = scale.get(api, "/healthz", timeout=5)
            except Exception:
                h = None
            if h is not None and first_answer is None:
                first_answer = time.time() - t0
            if h is not None and h.get("ownedPartitions", 0) == PARTS:
                owned = time.time() - t0
                break
            if time.time() > deadline:
                raise scale.Fail(f"{what}: not every partition was restored within 600 s")
            time.sleep(0.05)
        rs = restores(logfile, since)
        return {
            "serving_s": round(owned, 2),
            "first_answer_s": round(first_answer, 2),
            "restore_ms_max": max((r[1] for r in rs), default=None),
            "records_read": sum(r[2] for r in rs),
            "records_kept_locally": sum(r[3] for r in rs),
            "rss_mb": round(scale.rss_bytes(p.pid) / 1e6, 1),
        }

    def history_ms(what, local=False):
        # `history` of 20 instances (p50 and max, ms); `local`: once every partition's local journal
        # has caught up (`localJournals` in /healthz; builds without it never say so).
        if local:
            deadline = time.time() + 600
            while scale.get(api, "/healthz").get("localJournals", PARTS) < PARTS:
                if time.time() > deadline:
                    raise scale.Fail(f"{what}: the local journals did not catch up within 600 s")
                time.sleep(0.1)
        ids = [i["id"] for i in scale.get(api, "/instances?limit=2000")["instances"]][::100][:20]
        times = []
        for i in ids:
            t = time.time()
            h = scale.get(api, f"/instances/{i}/history", timeout=60)
            times.append((time.time() - t) * 1000)
            if not h.get("entries"):
                raise scale.Fail(f"{what}: no history for {i}: {h}")
        times.sort()
        return {"p50": round(times[len(times) // 2], 1), "max": round(times[-1], 1)}

    state = os.path.join(tmp, "state")
    try:
        p, t0, since = worker(state)
        serving(p, t0, since, "first start")
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "queue.buffering.max.messages": 1000000})
        t_send = time.time()
        for i in range(N):
            headers = [("ce_specversion", b"1.0"), ("ce_id", f"o{i}".encode()), ("ce_source", b"bench"),
                       ("ce_type", b"bench.order"), ("content-type", b"application/json")]
            value = json.dumps({"orderId": f"order-{i}"}).encode()
            while True:
                try:
                    producer.produce(f"{prefix}.events", value=value, key=f"o{i}".encode(), headers=headers)
                    break
                except BufferError:
                    producer.poll(0.05)
            if i % 10000 == 0:
                producer.poll(0)
        producer.flush(120)
        scale.log(f"{N} start events sent in {time.time() - t_send:.1f} s")
        deadline = time.time() + 1800
        while state_records(bootstrap, f"{prefix}.state") < N:
            if time.time() > deadline:
                raise scale.Fail("the instances did not all start within 30 minutes")
            if p.poll() is not None:
                raise scale.Fail(f"the worker exited with {p.returncode}")
            time.sleep(1)
        started = time.time() - t_send
        scale.log(f"{N} instances on the state topic after {started:.1f} s")
        time.sleep(5)
        rss_before = round(scale.rss_bytes(p.pid) / 1e6, 1)
        result = {"instances": N, "partitions": PARTS, "start_s": round(started, 1), "rss_before_kill_mb": rss_before,
                  "history_ms": history_ms("before the kill", local=True)}

        kill9(p)
        p, t0, since = worker(state)
        result["warm"] = serving(p, t0, since, "warm restart")
        result["warm"]["state_dir_mb"] = round(du(state) / 1e6, 1)
        result["warm"]["history_ms"] = history_ms("warm restart", local=True)
        scale.log(f"warm: {result['warm']}")

        kill9(p)
        cold = os.path.join(tmp, "state-cold")
        p, t0, since = worker(cold)
        result["cold"] = serving(p, t0, since, "cold restart")
        result["cold"]["history_ms_at_once"] = history_ms("cold restart")
        result["cold"]["history_ms_caught_up"] = history_ms("cold restart", local=True)
        scale.log(f"cold: {result['cold']}")
        print(json.dumps(result), flush=True)
    except scale.Fail as e:
        print(f"restart.py: {e}; logs in {tmp}", file=sys.stderr)
        sys.exit(1)
    finally:
        scale.stop_all()
        # The logs stay; the state directories go.
        for d in ("state", "state-cold"):
            shutil.rmtree(os.path.join(tmp, d), ignore_errors=True)


if __name__ == "__main__":
    main()
