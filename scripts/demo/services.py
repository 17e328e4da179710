#!/usr/bin/env python3
"""The airline and the hotel of scripts/demo.sh, in one small program.

The demo's saga (definitions/trip-booking.json) sends its requests as CloudEvents, which the sm4c
workers put on the topic `<prefix>.events.out`. This program reads them and, after a short random
delay (so that there is always something waiting to look at in the inspector), answers each one with
a CloudEvent on `<prefix>.events` that carries the trip's id in the `tripid` attribute, which the
saga correlates the answer by, and the `sm4cinstanceid` of the request, so that the workers route the
answer straight to the instance's partition (an answer without it would go to every partition and be
parked, for the event window, on those where no instance takes it). The answers:

    flight.requested          -> flight.booked, or flight.refused (1 in 10)
    hotel.requested           -> hotel.booked, or hotel.full (1 in 5), or nothing (1 in 25: the
                                 saga's 20 s timeout fires and it cancels the flight)
    flight.cancel.requested   -> flight.cancelled

It needs confluent-kafka and the CloudEvents SDK, which scripts/setup.sh installs, and runs until it
gets SIGTERM or SIGINT (or its parent, given by --parent, is gone):

    python3 services.py --bootstrap 127.0.0.1:9092 [--prefix sm4c] [--parent PID]
"""

import argparse
import heapq
import json
import os
import random
import signal
import sys
import time
import uuid

from cloudevents.core.bindings import kafka
from cloudevents.core.v1.event import CloudEvent
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

HOTELS = ["Hotel Jq", "The Transition", "Grand Parallel", "Foreach Inn", "Saga Suites"]


def answer_to(kind, data, rng):
    """What the airline or the hotel answers to a request: (type, source, data), or None for no answer."""
    if kind == "flight.requested":
        if rng.random() < 0.1:
            return "flight.refused", "airline", {"reason": f"no seat left to {data.get('to')}"}
        seat = f"{rng.randint(1, 40)}{rng.choice('ABCDEF')}"
        return "flight.booked", "airline", {"number": f"SM{rng.randint(100, 999)}", "seat": seat}
    if kind == "hotel.requested":
        r = rng.random()
        if r < 0.04:
            return None
        if r < 0.24:
            return "hotel.full", "hotel", {"reason": f"no room left in {data.get('city')}"}
        return "hotel.booked", "hotel", {"hotel": rng.choice(HOTELS), "room": rng.randint(101, 520)}
    if kind == "flight.cancel.requested":
        return "flight.cancelled", "airline", {"number": data.get("flight")}
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--prefix", default="sm4c")
    parser.add_argument("--parent", type=int, default=0, help="stop when this process is gone")
    args = parser.parse_args()

    stopping = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.append(True))

    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": "demo-services",
            "enable.auto.commit": False,
            # Only what the workers' transactions committed.
            "isolation.level": "read_committed",
        }
    )
    # Every partition of the topic (which the workers created), from its beginning: the only reader, it
    # needs no consumer group, whose forming would delay the first answers by seconds.
    out = f"{args.prefix}.events.out"
    partitions = consumer.list_topics(out, timeout=30).topics[out].partitions
    consumer.assign([TopicPartition(out, p, OFFSET_BEGINNING) for p in sorted(partitions)])
    producer = Producer({"bootstrap.servers": args.bootstrap, "linger.ms": 5})
    rng = random.Random()
    seen = set()
    due = []  # (when, sequence, trip id, instance id, request type, answer): answers waiting for their delay
    sequence = 0
    print(f"services: answering {out} ({len(partitions)} partitions) on {args.prefix}.events", flush=True)
    while not stopping:
        if args.parent and not os.path.exists(f"/proc/{args.parent}"):
            break
        m = consumer.poll(0.1)
        if m is not None and not m.error():
            headers = {k: v for k, v in (m.headers() or [])}
            if "ce_type" in headers:
                request = kafka.from_binary_event(kafka.KafkaMessage(headers=headers, key=m.key(), value=m.value()))
                # A request read twice is answered once.
                if (request.get_source(), request.get_id()) not in seen:
                    seen.add((request.get_source(), request.get_id()))
                    data = request.get_data() or {}
                    if not isinstance(data, dict):
                        data = json.loads(data)
                    trip = request.get_extension("tripid") or data.get("tripId")
                    instance = request.get_extension("sm4cinstanceid")
                    answer = answer_to(request.get_type(), data, rng)
                    if answer is None:
                        print(f"services: {trip}: {request.get_type()}, left unanswered", flush=True)
                    else:
                        sequence += 1
                        when = time.monotonic() + rng.uniform(0.5, 3.0)
                        heapq.heappush(due, (when, sequence, trip, instance, request.get_type(), answer))
        elif m is not None:
            print(f"services: {m.error()}", file=sys.stderr, flush=True)
        while due and due[0][0] <= time.monotonic():
            _, _, trip, instance, asked, (kind, source, data) = heapq.heappop(due)
            attributes = {
                "type": kind,
                "source": source,
                "id": str(uuid.uuid4()),
                "tripid": trip,
                "datacontenttype": "application/json",
            }
            if instance:
                attributes["sm4cinstanceid"] = instance
            record = kafka.to_binary_event(CloudEvent(attributes=attributes, data=data))
            producer.produce(f"{args.prefix}.events", key=trip, value=record.value, headers=record.headers)
            print(f"services: {trip}: {asked} -> {kind} {data}", flush=True)
        producer.poll(0)
    producer.flush(2)
    consumer.close()
    print("services: stopped", flush=True)


if __name__ == "__main__":
    main()
