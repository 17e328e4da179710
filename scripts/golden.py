#!/usr/bin/env python3
"""Writes the golden SQLite store (host/durable/tests/golden/store.sqlite) through the real product.

It starts `sm4c serve` (the binary given as the first argument) on a fresh SQLite file with the
definitions of host/durable/tests/golden/definitions/, drives it over HTTP into the stored shapes
the golden tests read (see host/durable/tests/golden/README.md), checks that each instance is where it
should be, stops the server with SIGTERM and copies the file into the fixture folder with its
write-ahead log folded in. Run by scripts/golden.sh; never by the test suite.
"""

import base64
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "host", "durable", "tests", "golden")


class Server:
    def __init__(self, binary, db, log):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.base = f"http://127.0.0.1:{port}"
        self.log = log
        self.proc = subprocess.Popen(
            [binary, "serve", "--db", db, "--listen", f"127.0.0.1:{port}",
             "--definitions", os.path.join(FIXTURE, "definitions")],
            stdout=open(log, "w"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.time() + 60
        while True:
            if self.proc.poll() is not None:
                sys.exit(f"sm4c serve exited; log:\n{open(log).read()}")
            try:
                if self.request("GET", "/healthz")[0] == 200:
                    return
            except OSError:
                pass
            if time.time() > deadline:
                sys.exit("sm4c serve did not start")
            time.sleep(0.1)

    def request(self, method, path, body=None, headers=None):
        data = None if body is None else json.dumps(body).encode()
        h = {"X-Sm4c-Request": "1"}
        if body is not None:
            h["Content-Type"] = "application/json"
        h.update(headers or {})
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                text = r.read().decode()
                return r.status, (json.loads(text) if text else None)
        except urllib.error.HTTPError as e:
            text = e.read().decode()
            try:
                return e.code, json.loads(text)
            except ValueError:
                return e.code, text

    def ok(self, method, path, body=None, headers=None, expect=(200, 201, 202)):
        status, answer = self.request(method, path, body, headers)
        if status not in expect:
            sys.exit(f"{method} {path}: {status} {answer}")
        return answer

    def start(self, definition, id, data):
        self.ok("POST", "/instances", {"definition": definition, "id": id, "input": data})

    def status(self, id):
        return self.ok("GET", f"/instances/{id}")["status"]

    def until(self, id, statuses):
        deadline = time.time() + 30
        while (s := self.status(id)) not in statuses:
            if time.time() > deadline:
                sys.exit(f"instance {id} is {s}, not one of {statuses}")
            time.sleep(0.05)

    def poll(self, task_list, instance):
        task = self.ok("POST", f"/tasklists/{task_list}/poll?wait=10s&worker=golden", expect=(200,))
        if task["instanceId"] != instance:
            sys.exit(f"task list {task_list} handed out a task of {task['instanceId']}, not of {instance}")
        return task

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        if self.proc.wait(timeout=60) != 0:
            sys.exit(f"sm4c serve did not stop cleanly; log:\n{open(self.log).read()}")


def main():
    binary = sys.argv[1]
    work = tempfile.mkdtemp(prefix="sm4c-golden-")
    db = os.path.join(work, "store.sqlite")
    s = Server(binary, db, os.path.join(work, "serve.log"))

    # SM4C: an instance that completes after its parallel and foreach calls to workers.
    s.start("g-work", "sm4c-completed", {"items": ["a", "b", "c"]})
    while s.status("sm4c-completed") != "completed":
        task = s.poll("golden-work", "sm4c-completed")
        s.ok("POST", f"/tasks/{task['token']}/complete", {"done": task["arguments"]})
        time.sleep(0.05)

    # One whose call fails: it fails with the redrive point its snapshot keeps.
    s.start("g-work", "sm4c-failed", {"items": ["x", "y"]})
    task = s.poll("golden-work", "sm4c-failed")
    s.ok("POST", f"/tasks/{task['token']}/fail",
         {"error": "Broken", "message": "the golden worker fails", "details": {"n": 1}})
    s.until("sm4c-failed", {"failed"})

    # One in the middle of its parallel and foreach actions: one call answered, the others out.
    s.start("g-work", "sm4c-parallel", {"items": ["p", "q", "r"]})
    task = s.poll("golden-work", "sm4c-parallel")
    s.ok("POST", f"/tasks/{task['token']}/complete", {"done": task["arguments"]})

    # A subflow parent and its child, which waits for a worker (its task is left queued).
    s.start("g-parent", "sm4c-parent", {"n": 7})
    s.until("sm4c-parent", {"running", "waiting"})

    # Waiting on an event; and another that a batch cancels.
    s.start("g-event", "sm4c-event", {"order": "o-1"})
    s.start("g-event", "sm4c-cancelled", {"order": "o-2", "cancel": True})
    batch = s.ok("POST", "/batches", {"operation": "cancel",
                                      "where": {"definition": "g-event", "jq": ".cancel == true"}})
    deadline = time.time() + 30
    while s.ok("GET", f"/batches/{batch['id']}")["running"]:
        if time.time() > deadline:
            sys.exit("the batch did not end")
        time.sleep(0.05)
    s.until("sm4c-cancelled", {"cancelled"})

    # ASL: a Map inside a Parallel with one of its tasks answered, a task token, a success, a failure.
    s.start("asl-map", "asl-map", {"items": [1, 2, 3]})
    task = s.poll("Handle", "asl-map")
    s.ok("POST", "/tasks/send-task-success",
         {"taskToken": task["token"], "output": json.dumps({"handled": task["arguments"]["item"]})})
    s.start("asl-token", "asl-token", {"amount": 5})
    s.start("asl-pass", "asl-succeeded", {})
    s.start("asl-fail", "asl-failed", {})
    s.until("asl-succeeded", {"completed"})
    s.until("asl-failed", {"failed"})

    # A schedule that ran once, then paused (so that it starts nothing when the tests serve the file).
    s.ok("POST", "/schedules", {"id": "golden-hourly", "definition": "asl-pass", "every": "PT1H"})
    s.ok("POST", "/schedules/golden-hourly/trigger")
    s.ok("POST", "/schedules/golden-hourly/pause")

    # Last, so that their 30 s timers are not due before the server stops.
    s.start("g-timer", "sm4c-timer", {})
    s.start("asl-wait", "asl-wait", {})

    waiting = ["sm4c-event", "sm4c-timer", "sm4c-parallel", "sm4c-parent", "asl-wait", "asl-map", "asl-token"]
    for id in waiting:
        s.until(id, {"running", "waiting"})
    for id, end in [("sm4c-completed", "completed"), ("sm4c-failed", "failed"), ("sm4c-cancelled", "cancelled"),
                    ("asl-succeeded", "completed"), ("asl-failed", "failed")]:
        s.until(id, {end})
    s.stop()

    # Fold the write-ahead log into the file, so that the fixture is one file.
    c = sqlite3.connect(db)
    c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    c.close()
    for suffix in ("-wal", "-shm"):
        p = db + suffix
        if os.path.exists(p) and os.path.getsize(p) > 0:
            sys.exit(f"{p} is not empty after the checkpoint")
    shutil.copyfile(db, os.path.join(FIXTURE, "store.sqlite"))
    shutil.rmtree(work)
    print(f"wrote {os.path.join(FIXTURE, 'store.sqlite')}")


if __name__ == "__main__":
    main()
