"""Each broker's own client, for tests/it/transports.rs: makes the topic, queue, exchange or
stream a test delivers into, and reads back what Railhook delivered, verifying each
message's Standard Webhooks signature with the `standardwebhooks` library, as a consumer
would. None of Railhook's code is used here.

    broker.py setup KIND TARGET          # create what the endpoint delivers into
    broker.py read KIND TARGET SECRET N  # read until N messages (or the deadline), print one
                                         # JSON line per message, then a summary line

TARGET is a JSON object (the endpoint's settings plus what the reader needs). A message
whose signature does not verify makes the exit status 1.
"""

import json
import sys
import time

from standardwebhooks.webhooks import Webhook

DEADLINE_S = 60
# After the N-th message, how long to keep reading for an unexpected extra one.
SETTLE_S = 2.0


def verify(secret, body, headers):
    """The Standard Webhooks check a consumer makes; headers by lower-case name."""
    wh = Webhook(secret)
    wh.verify(body, {k.lower(): v for k, v in headers.items()}, json_parse=False)


# ---- Kafka (confluent-kafka, librdkafka's Python client) ----

def kafka_setup(t):
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": t["brokers"][0]})
    fs = admin.create_topics([NewTopic(t["topic"], num_partitions=t.get("partitions", 3), replication_factor=1)])
    for f in fs.values():
        try:
            f.result(30)
        except Exception as e:  # already there is fine
            if "TOPIC_ALREADY_EXISTS" not in str(e):
                raise
    # Created is not yet readable: wait until the cluster's metadata names the topic with a
    # leader for every partition, as a producer's metadata request will see it (on a loaded
    # machine the broker answered CreateTopics well before; an Attempt made in between is
    # refused, and a short test ladder can spend all its Attempts in that gap).
    deadline = time.monotonic() + 30
    while True:
        topic = admin.list_topics(topic=t["topic"], timeout=5).topics.get(t["topic"])
        if topic is not None and topic.error is None and topic.partitions and all(
            p.leader >= 0 for p in topic.partitions.values()
        ):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"topic {t['topic']} not in the metadata after 30 s")
        time.sleep(0.1)


def kafka_read(t, n):
    from confluent_kafka import Consumer
    c = Consumer({
        "bootstrap.servers": t["brokers"][0],
        "group.id": "reader-" + t["topic"],
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })
    c.subscribe([t["topic"]])
    got, deadline, settle = [], time.time() + DEADLINE_S, None
    while time.time() < deadline and (settle is None or time.time() < settle):
        m = c.poll(0.5)
        if m is None or m.error():
            continue
        headers = {k: (v or b"").decode() for k, v in (m.headers() or [])}
        got.append((m.value(), headers, {"partition": m.partition(), "key": (m.key() or b"").decode()}))
        if len(got) >= n and settle is None:
            settle = time.time() + SETTLE_S
    c.close()
    return got


# ---- Amazon SQS (boto3, against moto's server) ----

def sqs_client(t):
    import boto3
    return boto3.client(
        "sqs", region_name=t["region"], endpoint_url=t["endpoint_url"],
        aws_access_key_id=t["access_key_id"], aws_secret_access_key=t["secret_access_key"])


def sqs_setup(t):
    name = t["queue_url"].rstrip("/").rsplit("/", 1)[1]
    attrs = {"FifoQueue": "true"} if name.endswith(".fifo") else {}
    sqs_client(t).create_queue(QueueName=name, Attributes=attrs)


def sqs_read(t, n):
    sqs = sqs_client(t)
    got, deadline, settle = [], time.time() + DEADLINE_S, None
    while time.time() < deadline and (settle is None or time.time() < settle):
        r = sqs.receive_message(QueueUrl=t["queue_url"], MaxNumberOfMessages=10,
                                MessageAttributeNames=["All"], AttributeNames=["All"],
                                WaitTimeSeconds=1)
        for m in r.get("Messages", []):
            headers = {k: v["StringValue"] for k, v in m.get("MessageAttributes", {}).items()}
            group = m.get("Attributes", {}).get("MessageGroupId", "")
            got.append((m["Body"].encode(), headers, {"group": group}))
            sqs.delete_message(QueueUrl=t["queue_url"], ReceiptHandle=m["ReceiptHandle"])
        if len(got) >= n and settle is None:
            settle = time.time() + SETTLE_S
    return got


# ---- RabbitMQ (pika) ----

def rabbit_channel(t):
    import pika
    conn = pika.BlockingConnection(pika.URLParameters(t["url"]))
    return conn, conn.channel()


def rabbitmq_setup(t):
    conn, ch = rabbit_channel(t)
    ch.queue_declare(queue=t["queue"], durable=True)
    if t.get("exchange"):
        ch.exchange_declare(exchange=t["exchange"], exchange_type="direct", durable=True)
        ch.queue_bind(queue=t["queue"], exchange=t["exchange"], routing_key=t["routing_key"])
    conn.close()


def rabbitmq_read(t, n):
    conn, ch = rabbit_channel(t)
    got, deadline, settle = [], time.time() + DEADLINE_S, None
    while time.time() < deadline and (settle is None or time.time() < settle):
        method, props, body = ch.basic_get(queue=t["queue"], auto_ack=True)
        if method is None:
            time.sleep(0.1)
        else:
            headers = {k: (v.decode() if isinstance(v, bytes) else str(v)) for k, v in (props.headers or {}).items()}
            got.append((body, headers, {"message_id": props.message_id}))
        if len(got) >= n and settle is None:
            settle = time.time() + SETTLE_S
    conn.close()
    return got


# ---- NATS JetStream (nats-py) ----

def nats_run(coro):
    import asyncio
    return asyncio.run(coro)


def nats_setup(t):
    import nats

    async def go():
        nc = await nats.connect(t["url"])
        js = nc.jetstream()
        await js.add_stream(name=t["stream"], subjects=[t["subject"]])
        await nc.close()
    nats_run(go())


def nats_read(t, n):
    import nats

    async def go():
        nc = await nats.connect(t["url"])
        js = nc.jetstream()
        sub = await js.pull_subscribe(t["subject"], durable="reader", stream=t["stream"])
        got, deadline, settle = [], time.time() + DEADLINE_S, None
        while time.time() < deadline and (settle is None or time.time() < settle):
            try:
                msgs = await sub.fetch(50, timeout=1)
            except Exception:
                msgs = []
            for m in msgs:
                headers = dict(m.headers or {})
                got.append((m.data, headers, {"stream_seq": m.metadata.sequence.stream}))
                await m.ack()
            if len(got) >= n and settle is None:
                settle = time.time() + SETTLE_S
        await nc.close()
        return got
    return nats_run(go())


SETUP = {"kafka": kafka_setup, "sqs": sqs_setup, "rabbitmq": rabbitmq_setup, "nats": nats_setup}
READ = {"kafka": kafka_read, "sqs": sqs_read, "rabbitmq": rabbitmq_read, "nats": nats_read}


def main():
    op, kind, target = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    if op == "setup":
        SETUP[kind](target)
        print(json.dumps({"ok": True}))
        return 0
    secret, n = sys.argv[4], int(sys.argv[5])
    bad = 0
    messages = READ[kind](target, n)
    for body, headers, where in messages:
        try:
            verify(secret, body, headers)
            ok = True
        except Exception as e:  # a signature that does not verify
            ok, bad = False, bad + 1
            print(f"not verified: {e}", file=sys.stderr)
        print(json.dumps({
            "id": headers.get("webhook-id"),
            "event_id": headers.get("x-event-id"),
            "body": json.loads(body) if ok else None,
            "verified": ok,
            "where": where,
        }))
    print(json.dumps({"count": len(messages), "unverified": bad}))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
