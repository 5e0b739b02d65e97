"""Polling endpoints read by the official Svix Python SDK, unchanged (issue #56).

Run by tests/it/poller.rs in two phases, with Railhook killed (-9) and restarted between
them, and the state between phases in the JSON file POLLER_STATE:

  setup   creates an application and a poller endpoint (the Svix surface, with Railhook's
          `"type": "poller"`), sends 200 subscribed messages and 20 of another type, reads
          them with `message.poller.poll` (caller-kept iterator; event type and channel
          narrowing), and has two consumers read part of the stream with `consumer_poll`;
  finish  (after the restart) both consumers read on from their committed positions: each
          must have seen all 200, once, in order; 10 more arrive and are read; a seek goes back
          and re-reads; the poll token opens this stream and nothing else; bad input is refused.

RAILHOOK_URL (the server) and RAILHOOK_KEY (a project API key) as for scenario.py. Exits 0
when every step held.
"""

import json
import os
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime

from svix.api import (
    ApplicationIn,
    MessageIn,
    MessagePollerConsumerPollOptions,
    MessagePollerPollOptions,
    PollingEndpointConsumerSeekIn,
    Svix,
    SvixOptions,
)
from svix.exceptions import HttpError, HTTPValidationError

URL = os.environ["RAILHOOK_URL"]
KEY = os.environ["RAILHOOK_KEY"]
STATE = os.environ["POLLER_STATE"]
DEADLINE = float(os.environ.get("SCENARIO_WAIT_SECONDS", "120"))
MESSAGES = 200
PAGE = 30
T0 = time.monotonic()


def step(name):
    print(f"{time.monotonic() - T0:7.2f}s {name}", file=sys.stderr, flush=True)


def check(ok, *what):
    if not ok:
        raise AssertionError(f"check failed: {what!r}")


def client(token=KEY):
    return Svix(token, SvixOptions(server_url=URL, timeout=30))


def raw(method, path, body=None, token=KEY):
    """A request the SDK has no call for (Railhook's own routes and extensions)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(URL + path, data=data, method=method)
    req.add_header("authorization", f"Bearer {token}")
    req.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def refused(status, call):
    """`call` raises the SDK's exception for `status`."""
    try:
        call()
    except (HttpError, HTTPValidationError) as e:
        check(e.status_code == status, "status", status, e.status_code, str(e))
        return
    raise AssertionError(f"expected {status}, the call succeeded")


def read_all(svix, app, sink, consumer, out, limit=PAGE, pages=None):
    """`consumer_poll` until done (or `pages` pages); appends the message ids to `out`."""
    n = 0
    while pages is None or n < pages:
        page = svix.message.poller.consumer_poll(
            app, sink, consumer, MessagePollerConsumerPollOptions(limit=limit)
        )
        check(len(page.data) <= limit, "page size", len(page.data))
        out.extend(m.id for m in page.data)
        n += 1
        if page.done and not page.data:
            return


def setup():
    svix = client()
    app = svix.application.create(ApplicationIn(name="poller")).id
    status, created = raw(
        "POST",
        f"/api/v1/app/{app}/endpoint",
        {"type": "poller", "filterTypes": ["order.paid"], "description": "nightly export"},
    )
    check(status == 201, "create poller", status, created)
    sink = created["id"]
    check(svix.endpoint.get(app, sink).url == "poller:", "the poller's url")
    step("application and poller endpoint created")

    for i in range(MESSAGES):
        channels = ["eu"] if i % 2 == 0 else ["us"]
        svix.message.create(
            app, MessageIn(event_type="order.paid", payload={"n": i}, channels=channels)
        )
        if i % 10 == 0:
            svix.message.create(app, MessageIn(event_type="user.created", payload={"m": i}))
    step("220 messages sent")

    # The caller keeps the iterator: pages of 100 until all 200 are there.
    seen, iterator = [], None
    end = time.monotonic() + DEADLINE
    while len(seen) < MESSAGES:
        check(time.monotonic() < end, "200 messages readable in time", len(seen))
        page = svix.message.poller.poll(
            app, sink, MessagePollerPollOptions(limit=100, iterator=iterator)
        )
        seen.extend(page.data)
        iterator = page.iterator
        if page.done and not page.data:
            time.sleep(0.2)
    check([m.payload["n"] for m in seen] == list(range(MESSAGES)), "in order, once")
    check({m.event_type for m in seen} == {"order.paid"}, "only the subscribed type")
    ids = [m.id for m in seen]
    stamps = [m.timestamp.isoformat() for m in seen]
    step("poll: 200 in order, only order.paid")

    eu = svix.message.poller.poll(app, sink, MessagePollerPollOptions(limit=250, channel="eu"))
    check([m.payload["n"] for m in eu.data] == list(range(0, MESSAGES, 2)), "channel eu")
    other = svix.message.poller.poll(
        app, sink, MessagePollerPollOptions(limit=250, event_type="user.created")
    )
    check(other.data == [] and other.done, "an unsubscribed type is not in the stream")
    step("poll narrowed by channel and event type")

    a, b = [], []
    read_all(svix, app, sink, "consumer-a", a, pages=3)
    read_all(svix, app, sink, "consumer-b", b, pages=1)
    check(a == ids[: 3 * PAGE] and b == ids[:PAGE], "first pages", len(a), len(b))
    step("consumers a (3 pages) and b (1 page) read part of the stream")
    with open(STATE, "w") as f:
        json.dump({"app": app, "sink": sink, "ids": ids, "stamps": stamps, "a": a, "b": b}, f)


def finish():
    with open(STATE) as f:
        state = json.load(f)
    app, sink, ids = state["app"], state["sink"], state["ids"]
    svix = client()

    a, b = state["a"], state["b"]
    read_all(svix, app, sink, "consumer-a", a)
    read_all(svix, app, sink, "consumer-b", b)
    check(a == ids, "consumer a saw all 200 once, in order", len(a))
    check(b == ids, "consumer b saw all 200 once, in order", len(b))
    step("after the restart both consumers read on: 200 each, once, in order")

    for i in range(10):
        svix.message.create(app, MessageIn(event_type="order.paid", payload={"n": 1000 + i}))
    more = []
    end = time.monotonic() + DEADLINE
    while len(more) < 10:
        check(time.monotonic() < end, "10 more readable in time", len(more))
        before = len(more)
        read_all(svix, app, sink, "consumer-a", more, pages=1)
        if len(more) == before:
            time.sleep(0.2)
    check(len(more) == 10 and not set(more) & set(ids), "10 new messages", more)
    step("10 sent after the restart reach the consumer")

    # A resend is a new Delivery: it joins the stream at its end.
    svix.message_attempt.resend(app, ids[0], sink)
    resent = []
    end = time.monotonic() + DEADLINE
    while not resent:
        check(time.monotonic() < end, "the resent message readable in time")
        read_all(svix, app, sink, "consumer-a", resent, pages=1)
        if not resent:
            time.sleep(0.2)
    check(resent == [ids[0]], "the resent message at the end", resent)
    more += resent
    step("a resent message joins the stream at its end")

    # Back to message 150's time: everything from it on is read again (a few earlier ones
    # may come too: numbers follow creation closely, not exactly), in order.
    after = datetime.fromisoformat(state["stamps"][150])
    seek = svix.message.poller.consumer_seek(
        app, sink, "consumer-a", PollingEndpointConsumerSeekIn(after=after)
    )
    check(seek.iterator.startswith("itr_"), "seek iterator", seek.iterator)
    again = []
    read_all(svix, app, sink, "consumer-a", again)
    full = ids + more
    start = full.index(again[0])
    check(start <= 150 and again == full[start:], "re-read from the seek", start, len(again))
    step(f"seek back: re-read {len(again)} from message {start}")

    # The poll token: this stream, nothing else.
    status, token = raw("POST", f"/v1/endpoints/{sink}/poll-token")
    check(status == 201 and token["token"].startswith("rhpoll_"), "poll token", status, token)
    check(token["poll_path"] == f"/api/v1/app/{app}/poller/{sink}", "poll path", token)
    customer = client(token["token"])
    mine = []
    read_all(customer, app, sink, "customer", mine, limit=250)
    check(mine == full, "the token reads the stream", len(mine))
    check(raw("GET", "/v1/endpoints", token=token["token"])[0] == 401, "token on /v1")
    refused(401, lambda: customer.application.list())
    other_app = svix.application.create(ApplicationIn(name="other")).id
    refused(404, lambda: customer.message.poller.poll(other_app, sink))
    status, second = raw("POST", f"/v1/endpoints/{sink}/poll-token")
    check(status == 201, "second token", status)
    refused(401, lambda: customer.message.poller.poll(app, sink))
    step("poll token: reads its stream; refused elsewhere and once replaced")

    # Bad input: each a clear 4xx, nothing moved.
    position = raw("GET", f"/v1/endpoints/{sink}/consumers")[1]["data"]
    refused(
        422,
        lambda: svix.message.poller.poll(app, sink, MessagePollerPollOptions(iterator="garbage")),
    )
    refused(
        422,
        lambda: svix.message.poller.consumer_poll(
            app, sink, "consumer-a", MessagePollerConsumerPollOptions(iterator="itr_x")
        ),
    )
    refused(422, lambda: svix.message.poller.poll(app, sink, MessagePollerPollOptions(limit=0)))
    refused(422, lambda: svix.message.poller.consumer_poll(app, sink, "a b"))
    refused(404, lambda: svix.message.poller.poll(other_app, sink))
    refused(404, lambda: svix.message.poller.poll(app, "ep_00000000000000000000000000"))
    status, http_ep = raw("POST", f"/api/v1/app/{app}/endpoint", {"url": "https://example.com/h"})
    check(status == 201, "http endpoint", status, http_ep)
    refused(404, lambda: svix.message.poller.poll(app, http_ep["id"]))
    status, body = raw("DELETE", f"/v1/endpoints/{sink}/consumers/never-seen")
    check(status == 404, "unknown consumer", status, body)
    status, body = raw("POST", f"/v1/endpoints/{http_ep['id']}/poll-token")
    check(status == 422, "a token for an http endpoint", status, body)
    status, body = raw("POST", f"/api/v1/app/{app}/endpoint", {"type": "poller", "url": "https://x.example"})
    check(status == 422, "a poller with a url", status, body)
    check(raw("GET", f"/v1/endpoints/{sink}/consumers")[1]["data"] == position, "nothing moved")
    step("bad input refused; no consumer moved")


if __name__ == "__main__":
    {"setup": setup, "finish": finish}[sys.argv[1]]()
