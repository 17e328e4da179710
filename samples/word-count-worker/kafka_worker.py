#!/usr/bin/env python3
"""A worker for the `text-analysis` task list of `sm4c serve --kafka`, in Python.

In Kafka mode a task list is a topic, `<prefix>.tasks.<task list>`; each record is a CloudEvent of
type `sm4c.task.scheduled` (binary content mode) whose data is the task. This worker consumes the
topic as a member of a consumer group (so several workers share the tasks), and answers each task
with CloudEvents on `<prefix>.events`: a heartbeat when it takes the task (that is what starts the
task's start-to-close and heartbeat timeouts), then `sm4c.task.completed` or `sm4c.task.failed`,
each carrying the task token in the `sm4ctasktoken` attribute. It commits its offset only after
answering, so a task whose worker dies is taken again by another one (at least once).

It needs `confluent-kafka` and the CloudEvents SDK (`cloudevents`), which scripts/setup.sh installs:

    python3 kafka_worker.py --bootstrap 127.0.0.1:9092 [--prefix sm4c] [--task-list text-analysis]
                            [--group word-counters] [--max-tasks N]
"""

import argparse
import json
import socket
import sys
import uuid

from cloudevents.core.bindings import kafka
from cloudevents.core.v1.event import CloudEvent
from confluent_kafka import Consumer, Producer

from worker import count_words


def answer(producer, topic, kind, token, data=None):
    """Sends one `sm4c.task.<kind>` CloudEvent for the task with this token."""
    attributes = {
        "type": f"sm4c.task.{kind}",
        "source": f"word-counter/{socket.gethostname()}",
        "id": str(uuid.uuid4()),
        "sm4ctasktoken": token,
    }
    if data is not None:
        attributes["datacontenttype"] = "application/json"
    m = kafka.to_binary_event(CloudEvent(attributes=attributes, data=data))
    producer.produce(topic, key=m.key, value=m.value, headers=m.headers)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--prefix", default="sm4c")
    parser.add_argument("--task-list", default="text-analysis")
    parser.add_argument("--group", default="word-counters")
    parser.add_argument("--max-tasks", type=int, default=0, help="stop after this many tasks (0: never)")
    args = parser.parse_args()
    events = f"{args.prefix}.events"
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
        }
    )
    consumer.subscribe([f"{args.prefix}.tasks.{args.task_list}"])
    producer = Producer({"bootstrap.servers": args.bootstrap, "linger.ms": 1})
    done = 0
    try:
        while args.max_tasks == 0 or done < args.max_tasks:
            m = consumer.poll(0.5)
            if m is None:
                continue
            if m.error():
                print(f"consumer: {m.error()}", file=sys.stderr)
                continue
            headers = {k: v for k, v in (m.headers() or [])}
            task_event = kafka.from_binary_event(kafka.KafkaMessage(headers=headers, key=m.key(), value=m.value()))
            if task_event.get_type() != "sm4c.task.scheduled":
                consumer.commit(message=m, asynchronous=False)
                continue
            task = task_event.get_data()
            task = task if isinstance(task, dict) else json.loads(task)
            token = task["token"]
            answer(producer, events, "heartbeat", token, {"stage": "counting"})
            try:
                result = count_words(task["arguments"])
            except ValueError as e:
                answer(producer, events, "failed", token, {"error": "EmptyDocument", "message": str(e)})
            else:
                answer(producer, events, "completed", token, result)
            producer.flush(10)
            consumer.commit(message=m, asynchronous=False)
            done += 1
            print(json.dumps({"instanceId": task["instanceId"], "operation": task["operation"]}), flush=True)
    finally:
        consumer.close()


if __name__ == "__main__":
    main()
