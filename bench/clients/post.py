#!/usr/bin/env python3
"""The peers benchmark's typical client (bench/src/peers.rs, `--client python`): Python's
`requests`, a session per thread, 16 threads, an open loop (message i is due at
start + i/rate; a thread takes the next due message when it is free, so a slow answer
delays later messages, as with a real client of that size).

Reads one JSON object from stdin: {"rate", "total", "threads", "url", "token",
"body": {... "SEQ" ...}} where the string "SEQ" in the body is replaced by the sequence
number. Prints "seq sent_micros answered_micros status" per message, wall clock."""
import json
import sys
import threading
import time

import requests


def main():
    cfg = json.load(sys.stdin)
    rate, total, threads = cfg["rate"], cfg["total"], cfg.get("threads", 16)
    template = json.dumps(cfg["body"])
    headers = {"Authorization": "Bearer " + cfg["token"], "Content-Type": "application/json"}
    start = time.time() + 0.2
    lock = threading.Lock()
    state = {"next": 0}
    out = []

    def work():
        session = requests.Session()
        while True:
            with lock:
                seq = state["next"]
                state["next"] += 1
            if seq >= total:
                return
            due = start + seq / rate
            wait = due - time.time()
            if wait > 0:
                time.sleep(wait)
            # From the message's due time: a thread still busy with an earlier answer
            # delays it, and that wait is part of its latency (open loop).
            sent = due
            body = template.replace('"SEQ"', str(seq))
            try:
                status = session.post(cfg["url"], data=body, headers=headers, timeout=30).status_code
            except requests.RequestException:
                status = 0
            done = time.time()
            with lock:
                out.append("%d %d %d %d" % (seq, int(sent * 1e6), int(done * 1e6), status))

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
