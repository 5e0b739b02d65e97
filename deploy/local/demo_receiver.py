"""A demo webhook receiver: verifies each request with the official Standard Webhooks
library, deduplicates on webhook-id, and logs one JSON line per request.

Usage: demo_receiver.py PORT SECRET_FILE LOG_FILE
The secret is read from SECRET_FILE on each request (the demo writes it after creating the
endpoint). Listens on 127.0.0.1 only.
"""
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

from standardwebhooks.webhooks import Webhook

PORT, SECRET_FILE, LOG_FILE = int(sys.argv[1]), sys.argv[2], sys.argv[3]
seen = set()


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        arrived_ms = time.time() * 1000
        body = self.rfile.read(int(self.headers.get("content-length", 0))).decode()
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            with open(SECRET_FILE) as f:
                Webhook(f.read().strip()).verify(body, headers)
            verified = True
        except Exception:
            verified = False
        webhook_id = headers.get("webhook-id")
        duplicate = webhook_id in seen
        seen.add(webhook_id)
        with open(LOG_FILE, "a") as log:
            log.write(json.dumps({"arrived_ms": arrived_ms, "webhook_id": webhook_id,
                                  "event_id": headers.get("x-event-id"), "verified": verified,
                                  "duplicate": duplicate, "body": body}) + "\n")
        self.send_response(204 if verified else 401)
        self.end_headers()

    def log_message(self, *args):
        pass


HTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
