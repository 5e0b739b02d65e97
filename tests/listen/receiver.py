"""A developer's local receiver for tests/it/listen.rs: answers every POST with 200, except
the first request whose payload has n == 7, which gets a 500 (so the ladder must retry it).
Each request is one JSON line in LOG: {"headers", "body", "status"}. Prints "listening"
once the port is open.

Usage: receiver.py PORT LOG
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, LOG = int(sys.argv[1]), sys.argv[2]
lock = threading.Lock()
failed_once = set()


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0"))).decode()
        status = 200
        with lock:
            n = json.loads(body).get("n")
            if n == 7 and n not in failed_once:
                failed_once.add(n)
                status = 500
            with open(LOG, "a") as f:
                f.write(json.dumps({"headers": dict(self.headers), "body": body,
                                    "status": status}) + "\n")
        self.send_response(status)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
print("listening", flush=True)
server.serve_forever()
