//! A bare transactional consume-transform-produce loop over rdkafka: the reference that
//! `bench/kafka/bench.py` measures an sm4c worker beside (issue 13: event → transition → sent event
//! within 1.5x of it).
//!
//! It reads ping CloudEvents (structured mode, `data.n`) from the input topic with
//! `read_committed`, and for each writes a pong CloudEvent (binary mode, `{"n": …}`, keyed as the
//! ping) to the output topic, in one transaction per batch with the batch's input offsets, as an
//! sm4c worker commits its batches: the same client settings (`fetch.wait.max.ms=10`, `linger.ms=1`,
//! the short retry back-off), the same batching (whatever one poll brings, up to 500 records) and
//! the same wait for acknowledgements before the commit.
//! No state, no journal, no engine: what is left is Kafka's own cost.
//!
//! ```sh
//! cargo run --release -p sm4c-kafka --example bare_loop -- BOOTSTRAP INPUT_TOPIC OUTPUT_TOPIC
//! ```

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Message, Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(30);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, bootstrap, input, output] = args.as_slice() else {
        return Err("usage: bare_loop BOOTSTRAP INPUT_TOPIC OUTPUT_TOPIC".into());
    };
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "bare-loop")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("fetch.wait.max.ms", "10")
        .create()?;
    consumer.subscribe(&[input])?;
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("transactional.id", "bare-loop")
        .set("linger.ms", "1")
        .set("retry.backoff.ms", "5")
        .set("retry.backoff.max.ms", "50")
        .create()?;
    producer.init_transactions(TIMEOUT)?;
    eprintln!("bare_loop: {input} -> {output}");
    loop {
        let mut batch = Vec::new();
        let mut wait = Duration::from_millis(100);
        while batch.len() < 500 {
            match consumer.poll(wait) {
                Some(Ok(m)) => batch.push(m.detach()),
                Some(Err(e)) => eprintln!("bare_loop: {e}"),
                None => break,
            }
            wait = Duration::ZERO;
        }
        if batch.is_empty() {
            continue;
        }
        producer.begin_transaction()?;
        let mut next: BTreeMap<(String, i32), i64> = BTreeMap::new();
        for m in &batch {
            let ping: serde_json::Value = serde_json::from_slice(m.payload().unwrap_or_default()).unwrap_or_default();
            let body = serde_json::json!({"n": ping["data"]["n"]}).to_string();
            let id = format!("pong-{}-{}", m.partition(), m.offset());
            let headers = [
                ("ce_specversion", "1.0"),
                ("ce_id", id.as_str()),
                ("ce_source", "bare/loop"),
                ("ce_type", "bench.pong"),
                ("content-type", "application/json"),
            ]
            .into_iter()
            .fold(OwnedHeaders::new(), |h, (key, value)| {
                h.insert(Header {
                    key,
                    value: Some(value),
                })
            });
            let key = m.key().unwrap_or_default();
            let mut record = BaseRecord::to(output).key(key).payload(&body).headers(headers);
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((e, r)) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::QueueFull) => {
                        producer.poll(Duration::from_millis(10));
                        record = r;
                    }
                    Err((e, _)) => return Err(e.into()),
                }
            }
            next.insert((m.topic().to_string(), m.partition()), m.offset() + 1);
        }
        let mut offsets = TopicPartitionList::new();
        for ((topic, p), o) in &next {
            offsets.add_partition_offset(topic, *p, Offset::Offset(*o))?;
        }
        let group = consumer.group_metadata().ok_or("no group metadata")?;
        producer.send_offsets_to_transaction(&offsets, &group, TIMEOUT)?;
        // As the worker does: wait for the acknowledgements before committing, which is much faster
        // than leaving it to commit_transaction's own flush (about 100 ms per transaction here).
        while producer.in_flight_count() > 0 {
            producer.poll(Duration::from_micros(200));
        }
        producer.commit_transaction(TIMEOUT)?;
    }
}
