#!/usr/bin/env python3
"""How late 10,000 one-minute schedules start their runs on one `sm4c serve` (SQLite).

Starts a server on a fresh store, registers a definition that ends at once, creates N schedules
(`every: PT1M`, overlap `allowAll`, optionally with jitter), lets them fire for M minutes, and measures
each run's lateness as its instance's `startedAt` (when its start step was decided and journaled) minus
the nominal time in its id (`<schedule>@<time>`). Prints the distribution, and the schedules' own
`lateMs` (when the schedule decided to start the run) beside it. Needs only Python's standard library and a built
binary (default target/release/sm4c).

    python3 bench/schedules/bench.py [--schedules 10000] [--minutes 2] [--jitter PT0S] [--bin target/release/sm4c]
"""
import argparse, datetime, json, os, socket, subprocess, sys, tempfile, time, urllib.parse, urllib.request
from concurrent.futures import ThreadPoolExecutor


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ms(text):
    """Milliseconds since the epoch of an RFC 3339 time (`2026-11-28T02:00:00Z`, `...00.123Z`)."""
    return int(datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def call(base, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"content-type": "application/json", "x-sm4c-request": "1"})
    with urllib.request.urlopen(req, timeout=120) as r:
        text = r.read()
        return r.status, (json.loads(text) if text else None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--schedules", type=int, default=10_000)
    ap.add_argument("--minutes", type=int, default=2)
    ap.add_argument("--jitter", default="PT0S")
    ap.add_argument("--bin", default="target/release/sm4c")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="sm4c-sched-bench-")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(os.path.join(tmp, "server.log"), "w")
    srv = subprocess.Popen([a.bin, "serve", "--db", os.path.join(tmp, "s.db"), "--listen", f"127.0.0.1:{port}"],
                           stdout=log, stderr=log)
    try:
        for _ in range(200):
            try:
                call(base, "GET", "/healthz")
                break
            except OSError:
                time.sleep(0.05)
        call(base, "POST", "/definitions", {"id": "quick", "name": "Quick", "version": "1.0",
                                            "states": [{"name": "Done", "start": True, "end": True}]})
        t0 = time.time()

        def create(i):
            st, _ = call(base, "POST", "/schedules", {"id": f"s{i}", "definition": "quick", "every": "PT1M",
                                                     "overlap": "allowAll", "jitter": a.jitter})
            assert st == 201, st

        with ThreadPoolExecutor(16) as ex:
            list(ex.map(create, range(a.schedules)))
        created = time.time() - t0
        # Fire for the minutes asked, from the next whole minute.
        start = (int(time.time()) // 60 + 1) * 60
        end = start + 60 * a.minutes
        time.sleep(max(0, end - time.time()) + 5)
        rss = 0
        with open(f"/proc/{srv.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    rss = int(line.split()[1]) // 1024
        lates = []
        after = ""
        while True:
            _, page = call(base, "GET", f"/instances?definition=quick&limit=1000{after}")
            for i in page["instances"]:
                nominal = i["id"].split("@", 1)[1]
                lates.append(ms(i["startedAt"]) - ms(nominal))
            if not page.get("next"):
                break
            after = "&after=" + urllib.parse.quote(page["next"])
        decided = []

        def runs(i):
            _, v = call(base, "GET", f"/schedules/s{i}")
            return [r["lateMs"] for r in v["recentRuns"]]

        with ThreadPoolExecutor(16) as ex:
            for r in ex.map(runs, range(a.schedules)):
                decided.extend(r)
        decided.sort()
        lates.sort()
        n = len(lates)
        q = lambda p: lates[min(n - 1, int(p * n))] if n else None
        expected = a.schedules * a.minutes
        print(json.dumps({
            "schedules": a.schedules, "minutes": a.minutes, "jitter": a.jitter,
            "created_in_s": round(created, 1), "runs": n, "runs_expected_at_least": expected,
            "late_ms": {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": lates[-1] if n else None},
            "within_1s": sum(1 for x in lates if x <= 1000), "peak_rss_mb": rss,
            "decided_late_ms": {"p50": decided[len(decided) // 2] if decided else None,
                                "max": decided[-1] if decided else None},
        }, indent=1))
    finally:
        srv.terminate()
        srv.wait()


if __name__ == "__main__":
    sys.exit(main())
