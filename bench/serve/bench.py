#!/usr/bin/env python3
"""Durable throughput, latency and memory of `sm4c serve` with SQLite.

1. Steps per second: C client threads start three-step instances (three states, each an injectData
   enter action with a result handler) over HTTP; every step is journaled and committed. A start
   request is answered once its batch is committed, and these instances finish inside that batch.
2. Latency: p50/p99 of one start request (= one durable three-step instance), measured under load.
3. Memory: RSS of the server with N instances waiting for an event, minus RSS with none.

Usage: bench.py [--instances 3000] [--clients 16] [--waiting 100000]
"""
import argparse, http.client, json, os, socket, subprocess, sys, tempfile, threading, time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SM4C = os.path.join(ROOT, "target", "release", "sm4c")

THREE = {"id": "three", "name": "three steps", "version": "1", "states": [
    {"name": "One", "start": True, "enterAction": {"type": "injectData", "expression": "${ 1 }"},
     "enterResultHandler": "${ .a = $value }", "transitions": [{"nextState": "Two"}]},
    {"name": "Two", "enterAction": {"type": "injectData", "expression": "${ .a + 1 }"},
     "enterResultHandler": "${ .b = $value }", "transitions": [{"nextState": "Three"}]},
    {"name": "Three", "enterAction": {"type": "injectData", "expression": "${ .b + 1 }"},
     "enterResultHandler": "${ .c = $value }"}]}
WAITER = {"id": "waiter", "name": "waiter", "version": "1",
          "events": [{"name": "go", "type": "go", "correlation": [{"contextAttributeName": "orderId"}]}],
          "states": [{"name": "Wait", "start": True, "transitions": [{"nextState": "Done", "eventGroups": [{"events": ["go"]}]}]},
                     {"name": "Done"}]}


def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Client:
    def __init__(self, port):
        self.c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def post(self, path, body):
        self.c.request("POST", path, json.dumps(body), {"content-type": "application/json"})
        r = self.c.getresponse(); data = r.read()
        return r.status, json.loads(data) if data else None


def serve(db, port):
    p = subprocess.Popen([SM4C, "serve", "--db", db, "--listen", f"127.0.0.1:{port}"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "RUST_LOG": "warn"})
    for _ in range(200):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=1); c.request("GET", "/healthz"); c.getresponse().read(); return p
        except OSError:
            time.sleep(0.05)
    sys.exit("server did not start")


def run_clients(port, total, clients, make):
    lat, lock, idx = [], threading.Lock(), iter(range(total))

    def worker():
        c = Client(port)
        while True:
            with lock:
                i = next(idx, None)
            if i is None:
                return
            t = time.perf_counter(); status, _ = c.post("/instances", make(i)); dt = time.perf_counter() - t
            assert status == 201, status
            with lock:
                lat.append(dt)
    ts = [threading.Thread(target=worker) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in ts: t.start()
    for t in ts: t.join()
    return time.perf_counter() - t0, sorted(lat)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--instances", type=int, default=3000)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--waiting", type=int, default=100000)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        port = free_port(); p = serve(os.path.join(d, "b.db"), port)
        try:
            c = Client(port)
            assert c.post("/definitions", THREE)[0] in (200, 201)
            assert c.post("/definitions", WAITER)[0] in (200, 201)
            elapsed, lat = run_clients(port, a.instances, a.clients, lambda i: {"definition": "three", "id": f"t-{i}"})
            steps = a.instances * 3
            print(json.dumps({"benchmark": "durable steps", "instances": a.instances, "clients": a.clients,
                              "seconds": round(elapsed, 3), "stepsPerSecond": round(steps / elapsed),
                              "instancesPerSecond": round(a.instances / elapsed),
                              "latencyP50ms": round(lat[len(lat) // 2] * 1000, 2),
                              "latencyP99ms": round(lat[int(len(lat) * 0.99)] * 1000, 2)}))
            base = rss_kb(p.pid)
            if a.waiting:
                elapsed, _ = run_clients(port, a.waiting, a.clients,
                                         lambda i: {"definition": "waiter", "id": f"w-{i}", "input": {"n": i}})
                time.sleep(1)
                after = rss_kb(p.pid)
                print(json.dumps({"benchmark": "memory per waiting instance", "waiting": a.waiting,
                                  "rssBeforeKiB": base, "rssAfterKiB": after,
                                  "bytesPerWaitingInstance": round((after - base) * 1024 / a.waiting, 1),
                                  "startSeconds": round(elapsed, 1),
                                  "dbBytes": os.path.getsize(os.path.join(d, "b.db"))}))
        finally:
            p.kill(); p.wait()


if __name__ == "__main__":
    main()
