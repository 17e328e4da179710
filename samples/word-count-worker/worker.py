#!/usr/bin/env python3
"""A worker for the `text-analysis` task list of `sm4c serve`, in plain Python (standard library only).

It speaks the task list protocol of docs/src/worker-task-lists.md: it long-polls for a task,
heartbeats while it works, and completes or fails the task by its token. No SDK is needed.

    python3 worker.py --server http://127.0.0.1:8080 [--task-list text-analysis] [--max-tasks N] [--ca FILE]

When the server requires authentication, give the worker a token with the `operate` role in the
SM4C_TOKEN environment variable; it is sent as `Authorization: Bearer TOKEN`. For an https:// server
whose certificate is not signed by a CA the system trusts, pass that CA with --ca.
"""

import argparse
import json
import os
import socket
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request


class Server:
    """The few HTTP calls a worker makes."""

    def __init__(self, base, token=None, ca=None):
        self.base = base.rstrip("/")
        self.token = token
        self.context = ssl.create_default_context(cafile=ca) if ca else None

    def post(self, path, body=None, timeout=30):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method="POST")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        # A server without tokens takes a POST without a JSON body (a poll) only with this header,
        # which a web page cannot send to it cross-site.
        request.add_header("X-Sm4c-Request", "1")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=self.context) as response:
                text = response.read()
                return response.status, (json.loads(text) if text else None)
        except urllib.error.HTTPError as e:
            text = e.read()
            return e.code, (json.loads(text) if text else None)

    def poll(self, task_list, worker, wait_seconds):
        query = urllib.parse.urlencode({"wait": f"{wait_seconds}s", "worker": worker})
        path = f"/tasklists/{urllib.parse.quote(task_list)}/poll?{query}"
        status, body = self.post(path, timeout=wait_seconds + 30)
        if status == 204:
            return None
        if status in (401, 403):
            raise PermissionError(f"poll: {status} {body['message'] if body else ''} (set SM4C_TOKEN to a token with the operate role)")
        if status != 200:
            raise RuntimeError(f"poll: {status} {body}")
        return body

    def answer(self, token, what, body=None):
        """`what` is complete, fail or heartbeat. A 409 means the task is closed: nothing to do."""
        return self.post(f"/tasks/{token}/{what}", body)


def count_words(arguments):
    """The work: count the words of a document (an empty one is an error)."""
    text = arguments.get("text", "")
    if text == "":
        raise ValueError(f'document "{arguments.get("title")}" is empty')
    words = [w for w in text.split(" ") if w]
    return {"title": arguments.get("title"), "words": len(words), "characters": len(text)}


def work(server, task):
    token = task["token"]
    # Tell sm4c this worker is alive (and how far it got); it answers whether to stop.
    status, body = server.answer(token, "heartbeat", {"stage": "counting"})
    if status == 200 and body.get("cancelRequested"):
        print(f"task {task['operation']} of {task['instanceId']}: cancelled, stopping", file=sys.stderr)
        return
    try:
        result = count_words(task["arguments"])
    except ValueError as e:
        status, body = server.answer(token, "fail", {"error": "EmptyDocument", "message": str(e)})
    else:
        status, body = server.answer(token, "complete", result)
    if status not in (200, 409):
        raise RuntimeError(f"answer: {status} {body}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", default="http://127.0.0.1:8080")
    parser.add_argument("--task-list", default="text-analysis")
    parser.add_argument("--name", default=f"word-counter@{socket.gethostname()}")
    parser.add_argument("--wait", type=int, default=20, help="seconds one poll waits for a task")
    parser.add_argument("--max-tasks", type=int, default=0, help="stop after this many tasks (0: never)")
    parser.add_argument("--ca", help="PEM file of the CA of an https:// server's certificate")
    args = parser.parse_args()
    server = Server(args.server, token=os.environ.get("SM4C_TOKEN") or None, ca=args.ca)
    done = 0
    while args.max_tasks == 0 or done < args.max_tasks:
        try:
            task = server.poll(args.task_list, args.name, args.wait)
        except (urllib.error.URLError, ConnectionError) as e:
            print(f"poll failed ({e}); retrying", file=sys.stderr)
            time.sleep(1)
            continue
        except PermissionError as e:
            print(f"worker.py: {e}", file=sys.stderr)
            sys.exit(2)
        if task is None:
            continue
        work(server, task)
        done += 1


if __name__ == "__main__":
    main()
