"""The official Svix Python SDK, unchanged, against a real `railhook all` (issue #37).

Run by tests/it/svix_sdk.rs with RAILHOOK_URL (the server) and RAILHOOK_KEY (a project API
key). Receivers are HTTP servers in this process; every request they get is verified with
the SDK's own `Webhook(secret).verify`. Exits 0 when every step held; any failure raises
with what was expected and what was seen.
"""

import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from svix.api import (
    AppPortalAccessIn,
    ApplicationIn,
    ApplicationPatch,
    ApplicationTokenExpireIn,
    EndpointIn,
    EndpointPatch,
    EndpointSecretRotateIn,
    EventTypeIn,
    MessageAttemptListAttemptedMessagesOptions,
    MessageAttemptListByEndpointOptions,
    MessageCreateOptions,
    MessageIn,
    MessageListOptions,
    RecoverIn,
    Svix,
    SvixOptions,
)
from svix.exceptions import HttpError, HTTPValidationError
from svix.webhooks import Webhook, WebhookVerificationError

URL = os.environ["RAILHOOK_URL"]
KEY = os.environ["RAILHOOK_KEY"]
DEADLINE = float(os.environ.get("SCENARIO_WAIT_SECONDS", "120"))
MESSAGES = 200


class Inbox:
    """Requests per receiver path; `failing` paths answer 500."""

    def __init__(self):
        self.lock = threading.Lock()
        self.requests = defaultdict(list)
        self.failing = set()

    def add(self, path, headers, body):
        with self.lock:
            self.requests[path].append((headers, body))

    def of(self, path):
        with self.lock:
            return list(self.requests[path])


INBOX = Inbox()


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        path = self.path
        INBOX.add(path, {k.lower(): v for k, v in self.headers.items()}, body)
        self.send_response(500 if path in INBOX.failing else 200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def wait_for(what, probe, seconds=DEADLINE):
    end = time.monotonic() + seconds
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


T0 = time.monotonic()


def step(name):
    """Progress on stderr (shown when the scenario fails)."""
    print(f"{time.monotonic() - T0:7.2f}s {name}", file=sys.stderr, flush=True)


def expect_error(kind, status, call):
    try:
        call()
    except kind as e:
        assert e.status_code == status, f"expected {status}, got {e.status_code}: {e}"
        return e
    raise AssertionError(f"expected {kind.__name__} {status}, got no error")


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    receiver = f"http://127.0.0.1:{server.server_address[1]}"
    started = datetime.now(timezone.utc) - timedelta(seconds=5)

    # Only the server URL changes; the client is the SDK as published.
    svix = Svix(KEY, SvixOptions(server_url=URL))

    step("applications")
    # Applications: get-or-create twice is one application; uids are unique.
    acme = svix.application.get_or_create(ApplicationIn(name="Acme", uid="acme"))
    again = svix.application.get_or_create(ApplicationIn(name="Acme", uid="acme"))
    assert again.id == acme.id, (again.id, acme.id)
    assert acme.id.startswith("app_")
    beta = svix.application.create(ApplicationIn(name="Beta", uid="beta", metadata={"tier": "2"}))
    assert svix.application.get("beta").id == beta.id
    expect_error(HttpError, 409, lambda: svix.application.create(ApplicationIn(name="x", uid="acme")))
    expect_error(HttpError, 404, lambda: svix.application.get("nobody"))
    patched = svix.application.patch("beta", ApplicationPatch(name="Beta Corp"))
    assert patched.name == "Beta Corp" and patched.metadata == {"tier": "2"}, patched

    step("event types")
    # Event types with a schema the ingest enforces.
    svix.event_type.create(
        EventTypeIn(
            name="invoice.paid",
            description="An invoice was paid",
            schemas={"1": {"type": "object", "required": ["amount"],
                           "properties": {"amount": {"type": "number"}}}},
        )
    )
    svix.event_type.create(EventTypeIn(name="user.created", description="A user signed up"))
    names = {t.name for t in svix.event_type.list().data}
    assert {"invoice.paid", "user.created"} <= names, names
    assert svix.event_type.get("invoice.paid").schemas["1"]["required"] == ["amount"]

    step("endpoints")
    # Endpoints: everything, one type only, one channel only, and another application's.
    expect_error(HTTPValidationError, 422,
                 lambda: svix.endpoint.create(acme.id, EndpointIn(url="not a url")))
    ep_all = svix.endpoint.create("acme", EndpointIn(url=f"{receiver}/all", uid="all"))
    ep_inv = svix.endpoint.create(acme.id, EndpointIn(url=f"{receiver}/invoices",
                                                      event_types=["invoice.paid"]))
    assert ep_inv.event_types == ["invoice.paid"], ep_inv
    ep_eu = svix.endpoint.create(acme.id, EndpointIn(url=f"{receiver}/eu", channels=["eu"]))
    ep_beta = svix.endpoint.create(beta.id, EndpointIn(url=f"{receiver}/beta"))
    assert svix.endpoint.get("acme", "all").id == ep_all.id
    expect_error(HttpError, 409, lambda: svix.endpoint.create(
        acme.id, EndpointIn(url=f"{receiver}/dup", uid="all")))
    secrets = {
        "/all": svix.endpoint.get_secret(acme.id, ep_all.id).key,
        "/invoices": svix.endpoint.get_secret(acme.id, ep_inv.id).key,
        "/eu": svix.endpoint.get_secret(acme.id, ep_eu.id).key,
        "/beta": svix.endpoint.get_secret(beta.id, ep_beta.id).key,
    }

    step("messages")
    # 200 messages to Acme and 5 to Beta.
    sent = []
    for n in range(MESSAGES):
        kind = "invoice.paid" if n % 2 == 0 else "user.created"
        channels = ["eu"] if n % 10 == 0 else None
        msg = svix.message.create(acme.id, MessageIn(
            event_type=kind, payload={"n": n, "amount": n}, channels=channels,
            event_id=f"order-{n}"))
        sent.append(msg)
    for n in range(5):
        svix.message.create("beta", MessageIn(event_type="user.created", payload={"beta": n}))
    # A payload that breaks its type's schema is refused, and nothing is stored.
    expect_error(HTTPValidationError, 422, lambda: svix.message.create(
        acme.id, MessageIn(event_type="invoice.paid", payload={"amount": "ten"})))
    # The same idempotency key is the same message.
    first = svix.message.create(acme.id, MessageIn(event_type="user.created", payload={"k": 1}),
                                options=MessageCreateOptions(idempotency_key="same-key"))
    second = svix.message.create(acme.id, MessageIn(event_type="user.created", payload={"k": 1}),
                                 options=MessageCreateOptions(idempotency_key="same-key"))
    assert first.id == second.id, (first.id, second.id)
    total_acme = MESSAGES + 1

    step("waiting for deliveries")
    expected = {"/all": total_acme, "/invoices": MESSAGES // 2, "/eu": MESSAGES // 10, "/beta": 5}
    for path, count in expected.items():
        wait_for(f"{count} deliveries at {path}", lambda p=path, c=count: len(INBOX.of(p)) >= c)
    time.sleep(2)  # anything extra would arrive now
    for path, count in expected.items():
        got = INBOX.of(path)
        ids = {h["webhook-id"] for h, _ in got}
        assert len(got) == count and len(ids) == count, (path, len(got), len(ids), count)
        for headers, body in got:
            Webhook(secrets[path]).verify(body, headers)
        bodies = [json.loads(b) for _, b in got]
        if path == "/invoices":
            assert all(b["n"] % 2 == 0 for b in bodies)
        if path == "/eu":
            assert all(b["n"] % 10 == 0 for b in bodies)
        if path == "/beta":
            assert all("beta" in b for b in bodies)
    # A wrong secret does not verify.
    headers, body = INBOX.of("/all")[0]
    try:
        Webhook(secrets["/beta"]).verify(body, headers)
        raise AssertionError("verified with another endpoint's secret")
    except WebhookVerificationError:
        pass

    step("lists")
    # Lists across pages: messages, and attempts per endpoint.
    seen, iterator = [], None
    while True:
        page = svix.message.list(acme.id, MessageListOptions(limit=50, iterator=iterator,
                                                             with_content=True))
        seen.extend(page.data)
        if page.done:
            break
        iterator = page.iterator
    assert len(seen) == total_acme, len(seen)
    assert len({m.id for m in seen}) == total_acme
    assert seen[-1].payload == {"n": 0, "amount": 0} and seen[-1].event_id == "order-0", seen[-1]
    eu_only = svix.message.list(acme.id, MessageListOptions(channel="eu", limit=100))
    assert len(eu_only.data) == MESSAGES // 10, len(eu_only.data)
    assert svix.message.get(acme.id, "order-3").id == sent[3].id
    attempts, iterator = [], None
    while True:
        page = svix.message_attempt.list_by_endpoint(
            acme.id, ep_inv.id, MessageAttemptListByEndpointOptions(limit=30, iterator=iterator))
        attempts.extend(page.data)
        if page.done:
            break
        iterator = page.iterator
    assert len(attempts) == MESSAGES // 2, len(attempts)
    assert all(a.response_status_code == 200 and int(a.status) == 0 for a in attempts)
    by_msg = svix.message_attempt.list_by_msg(acme.id, sent[0].id)
    assert {a.endpoint_id for a in by_msg.data} == {ep_all.id, ep_inv.id, ep_eu.id}, by_msg
    one = svix.message_attempt.get(acme.id, sent[0].id, by_msg.data[0].id)
    assert one.msg_id == sent[0].id
    dests = svix.message_attempt.list_attempted_destinations(acme.id, sent[0].id)
    assert {d.id for d in dests.data} == {ep_all.id, ep_inv.id, ep_eu.id}
    # A page read at once (issue #55): each row still carries its own message and endpoint.
    for d in dests.data:
        assert d.url == svix.endpoint.get(acme.id, d.id).url, d
    with_msg = svix.message_attempt.list_by_endpoint(
        acme.id, ep_inv.id, MessageAttemptListByEndpointOptions(limit=30, with_msg=True))
    assert len(with_msg.data) == 30
    assert all(a.msg is not None and a.msg.id == a.msg_id for a in with_msg.data)
    assert all(a.msg.payload["n"] % 2 == 0 for a in with_msg.data)
    attempted = svix.message_attempt.list_attempted_messages(
        acme.id, ep_inv.id, MessageAttemptListAttemptedMessagesOptions(with_content=True))
    assert attempted.data, attempted
    for m in attempted.data[:5]:
        assert m.payload == svix.message.get(acme.id, m.id).payload, m
    assert len({m.id for m in attempted.data}) == len(attempted.data)
    stats = svix.endpoint.get_stats(acme.id, ep_inv.id)
    assert stats.success == MESSAGES // 2, stats

    step("resend")
    # Resend: the endpoint gets the message again.
    before = len(INBOX.of("/invoices"))
    svix.message_attempt.resend(acme.id, sent[2].id, ep_inv.id)
    wait_for("the resent message", lambda: len(INBOX.of("/invoices")) == before + 1)
    assert json.loads(INBOX.of("/invoices")[-1][1])["n"] == 2

    step("rotation")
    # Rotation: the new secret verifies what is sent next.
    rotated = svix.endpoint.rotate_secret(acme.id, ep_all.id, EndpointSecretRotateIn())
    new_secret = svix.endpoint.get_secret(acme.id, ep_all.id).key
    assert new_secret != secrets["/all"] and rotated.key == new_secret
    before = len(INBOX.of("/all"))
    svix.message.create(acme.id, MessageIn(event_type="user.created", payload={"after": "rotate"}))
    wait_for("the message after rotation", lambda: len(INBOX.of("/all")) == before + 1)
    headers, body = INBOX.of("/all")[-1]
    Webhook(new_secret).verify(body, headers)

    step("recover")
    # Recover: messages that failed while the receiver was down are sent again.
    flaky = svix.endpoint.create(acme.id, EndpointIn(url=f"{receiver}/flaky",
                                                     event_types=["user.created"]))
    flaky_secret = svix.endpoint.get_secret(acme.id, flaky.id).key
    INBOX.failing.add("/flaky")
    failed = [svix.message.create(acme.id, MessageIn(event_type="user.created",
                                                     payload={"flaky": n})) for n in range(3)]
    wait_for("three failed deliveries", lambda: svix.endpoint.get_stats(acme.id, flaky.id).fail == 3)
    step("recover: all three failed")
    INBOX.failing.discard("/flaky")
    svix.endpoint.recover(acme.id, flaky.id, RecoverIn(since=started))
    wait_for("the recovered deliveries",
             lambda: svix.endpoint.get_stats(acme.id, flaky.id).success == 3)
    for headers, body in INBOX.of("/flaky")[-3:]:
        Webhook(flaky_secret).verify(body, headers)
    assert {json.loads(b)["flaky"] for _, b in INBOX.of("/flaky")} == {0, 1, 2}, failed

    step("expunge")
    # Expunge: the content is gone, the message stays.
    svix.message.expunge_content(acme.id, sent[5].id)
    assert svix.message.get(acme.id, sent[5].id).payload == {}

    step("patch filter")
    # Patching the filter changes what the endpoint receives.
    svix.endpoint.patch(acme.id, ep_inv.id, EndpointPatch(event_types=["user.created"]))
    before = len(INBOX.of("/invoices"))
    svix.message.create(acme.id, MessageIn(event_type="user.created", payload={"n": 1001}))
    wait_for("the patched filter's delivery", lambda: len(INBOX.of("/invoices")) == before + 1)

    step("portal access")
    # A portal link opens a read-only session once; logout with its token ends it.
    access = svix.authentication.app_portal_access(
        acme.id, AppPortalAccessIn(read_only=True, expiry=600))
    assert "/portal/access/" in access.url, access.url
    with urllib.request.urlopen(access.url) as page:  # follows the redirect into the session
        session_url = page.geturl()
        assert "/portal/s/" in session_url and b"read-only" in page.read(), session_url
    Svix(access.token, SvixOptions(server_url=URL)).authentication.logout()
    try:
        urllib.request.urlopen(session_url)
        raise AssertionError("the session outlived logout")
    except urllib.error.HTTPError as e:
        assert e.code == 401, e.code
    svix.authentication.expire_all(acme.id, ApplicationTokenExpireIn())

    step("delete")
    # Deleting an application ends its endpoints; hosted-only routes say so.
    svix.application.delete(beta.id)
    expect_error(HttpError, 404, lambda: svix.endpoint.list(beta.id))
    err = expect_error(HttpError, 501, lambda: svix.background_task.list())
    assert err.code == "not_supported_by_this_server", err
    print("svix sdk scenario: ok", file=sys.stderr)
    server.shutdown()


if __name__ == "__main__":
    main()
