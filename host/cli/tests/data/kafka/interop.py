"""Interop with clients nobody on this project wrote: the official CloudEvents Python SDK with
confluent-kafka. Sends two order.created events (binary and structured content modes), reads the
payment.requested events the sm4c workers send with the SDK, checks their attributes, and answers
them with payment.done. Prints one JSON line per request it answered."""

import json
import sys
import time
import uuid

from cloudevents.core.bindings import kafka
from cloudevents.core.v1.event import CloudEvent
from confluent_kafka import Consumer, Producer

bootstrap, prefix = sys.argv[1], sys.argv[2]
p = Producer({"bootstrap.servers": bootstrap})


def send(event, structured):
    m = kafka.to_structured_event(event) if structured else kafka.to_binary_event(event)
    p.produce(f"{prefix}.events", key=m.key, value=m.value, headers=m.headers)
    p.flush(10)


for i, structured in ((1, False), (2, True)):
    send(
        CloudEvent(
            attributes={"type": "order.created", "source": "shop", "id": f"py-{i}", "datacontenttype": "application/json"},
            data={"orderId": f"py-o{i}", "amount": 100 + i},
        ),
        structured,
    )

c = Consumer(
    {
        "bootstrap.servers": bootstrap,
        "group.id": "py-" + uuid.uuid4().hex,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
    }
)
c.subscribe([f"{prefix}.events.out"])
answered = set()
deadline = time.time() + 90
while len(answered) < 2 and time.time() < deadline:
    m = c.poll(0.5)
    if m is None or m.error():
        continue
    headers = {k: v for k, v in (m.headers() or [])}
    if "ce_type" not in headers:
        continue
    ev = kafka.from_binary_event(kafka.KafkaMessage(headers=headers, key=m.key(), value=m.value()))
    if ev.get_type() != "payment.requested" or ev.get_id() in answered:
        continue
    data = ev.get_data()
    data = data if isinstance(data, dict) else json.loads(data)
    assert ev.get_source() == "sm4c/saga", ev.get_attributes()
    assert ev.get_extension("sm4cinstanceid"), ev.get_attributes()
    assert ev.get_extension("orderid") == data["orderId"], ev.get_attributes()
    answered.add(ev.get_id())
    send(
        CloudEvent(
            attributes={"type": "payment.done", "source": "payments", "orderid": data["orderId"], "datacontenttype": "application/json"},
            data={"paid": data["amount"]},
        ),
        structured=len(answered) % 2 == 0,
    )
    print(json.dumps({"answered": ev.get_id(), "instance": ev.get_extension("sm4cinstanceid"), "order": data["orderId"]}), flush=True)
c.close()
sys.exit(0 if len(answered) == 2 else 1)
