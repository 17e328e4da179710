#!/usr/bin/env python3
"""What the runtime adds to a REST call: sm4c's time per call minus the server's own time per call
(from reading a request's headers to writing its response), against a local HTTP/1.1 server with
keep-alive. For reference it also times two direct clients on the same server: Python's http.client
and curl (one process, the same connection for every URL).

sm4c runs a definition whose foreach calls the operation N times one after another
(maxParallel 1, waitForCompletion); its process time for N = 0 is subtracted.
Usage: overhead.py [N]
"""
import http.client, http.server, json, os, socket, subprocess, sys, tempfile, threading, time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SM4C = os.path.join(ROOT, "target", "release", "sm4c")


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        # Headers and body go out in separate writes; without this, Nagle and delayed ACKs add ~40 ms.
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    own = []  # seconds per request, parse to response written

    def parse_request(self):
        self._t0 = time.perf_counter()
        return super().parse_request()

    def do_GET(self):
        body = json.dumps({"id": self.path.rsplit("/", 1)[-1], "ok": True}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()
        Handler.own.append(time.perf_counter() - self._t0)

    def log_message(self, *a):
        pass


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]
    c = http.client.HTTPConnection("127.0.0.1", port)
    t = time.perf_counter()
    for i in range(n):
        c.request("GET", f"/items/{i}"); c.getresponse().read()
    direct = (time.perf_counter() - t) / n

    def curl(k):
        urls = [f"http://127.0.0.1:{port}/items/{i}" for i in range(k)]
        t = time.perf_counter()
        subprocess.run(["curl", "-s"] + urls, check=True, stdout=subprocess.DEVNULL)
        return time.perf_counter() - t
    curl_per_call = (min(curl(n) for _ in range(3)) - min(curl(1) for _ in range(3))) / (n - 1)
    with tempfile.TemporaryDirectory() as d:
        json.dump({"openapi": "3.0.1", "servers": [{"url": f"http://127.0.0.1:{port}"}],
                   "paths": {"/items/{id}": {"get": {"operationId": "getItem",
                                                     "parameters": [{"name": "id", "in": "path"}]}}}},
                  open(os.path.join(d, "api.json"), "w"))
        json.dump({"id": "calls", "name": "calls", "version": "1",
                   "functions": [{"name": "getItem", "operation": "file://api.json#getItem"}],
                   "states": [{"name": "A", "start": True, "enterAction": {
                       "type": "foreach", "input": "${ .ids }", "maxParallel": 1,
                       "action": {"type": "invokeFunction", "functionName": "getItem",
                                  "arguments": {"id": "${ . }"}, "waitForCompletion": True}},
                       "enterResultHandler": "${ .n = ($value | length) }"}]},
                  open(os.path.join(d, "def.json"), "w"))

        def run(k):
            json.dump({"ids": list(range(k))}, open(os.path.join(d, "in.json"), "w"))
            t = time.perf_counter()
            out = subprocess.run([SM4C, "run", os.path.join(d, "def.json"), "--input", os.path.join(d, "in.json")],
                                 capture_output=True, text=True)
            dt = time.perf_counter() - t
            assert out.returncode == 0 and json.loads(out.stdout)["n"] == k, out.stderr
            return dt
        base = min(run(0) for _ in range(3))
        Handler.own.clear()
        total = min(run(n) for _ in range(3))
    per_call = (total - base) / n
    own = sorted(Handler.own)[len(Handler.own) // 2]
    print(json.dumps({"calls": n, "serverOwnMicros": round(own * 1e6, 1), "sm4cMicros": round(per_call * 1e6, 1),
                      "overheadMicros": round((per_call - own) * 1e6, 1),
                      "pythonClientMicros": round(direct * 1e6, 1), "curlMicros": round(curl_per_call * 1e6, 1)}))


if __name__ == "__main__":
    main()
