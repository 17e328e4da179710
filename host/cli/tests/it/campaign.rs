//! The kill campaign (issue 16, "Crash and fault campaigns"): `sm4c serve` runs many instances of a
//! workload that mixes delays, correlated events, REST calls to a real local service, retries,
//! subflows and task-list work (tests/data/campaign), while it is killed with SIGKILL at seeded
//! random moments under load and started again on the same SQLite file each time.
//!
//! The driver starts instances over HTTP, follows the outbox of sent events and answers each
//! request event with a correlated CloudEvent, and runs task-list workers over the task API; every
//! request it makes is retried through the kills until the server answers it, and every answer it
//! got is recorded. The REST service logs the `Idempotency-Key` of every call and fails some calls
//! with 503 so that retry policies run. After each kill the driver reads the calls that were in
//! flight from the crashed store (its `calls` table). The checker then proves:
//!
//! - every instance (and every subflow) completed with the expected output;
//! - no completed action ran again: a key reached the service more than once only if that call was
//!   in flight at a kill, at most once more per such kill, always with its original key;
//! - every sent event is in the outbox once, with the id it had when first seen (unique ids, one
//!   request per instance), and the reply each instance got names that id;
//! - no acknowledged request was lost: every acknowledged start is an instance, every acknowledged
//!   reply is the one its instance consumed, every acknowledged task answer is the one its instance
//!   took.
//!
//! The short version (100 instances, 3 kills) runs with `cargo test`; the full one (1,000 instances,
//! 20 kills) with `SM4C_CAMPAIGN_FULL=1`. `SM4C_CAMPAIGN_SEED=N` picks another kill schedule (see
//! docs/src/testing.md).

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use reqwest::blocking::Client;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::server;
use server::{Serve, Server};
const TASK_LIST: &str = "campaign-pack";

// ---------------------------------------------------------------------------------------------
// Parameters and a seeded random source
// ---------------------------------------------------------------------------------------------

struct Params {
    instances: usize,
    kills: usize,
    seed: u64,
    workers: usize,
    /// How long the instances may take to finish after the last kill before the test calls it a hang.
    finish_within: Duration,
}

fn params() -> Params {
    let full = std::env::var("SM4C_CAMPAIGN_FULL").is_ok_and(|v| !v.is_empty() && v != "0");
    let seed = std::env::var("SM4C_CAMPAIGN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(16);
    if full {
        Params {
            instances: 1000,
            kills: 20,
            seed,
            workers: 4,
            finish_within: Duration::from_secs(600),
        }
    } else {
        Params {
            instances: 100,
            kills: 3,
            seed,
            workers: 2,
            finish_within: Duration::from_secs(90),
        }
    }
}

/// xorshift64*: the kill schedule and the service's delays come from the seed alone.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// A number in `lo..hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo).max(1)
    }
}

fn hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

// ---------------------------------------------------------------------------------------------
// The workload
// ---------------------------------------------------------------------------------------------

fn instance_id(i: usize) -> String {
    format!("c-{i:04}")
}

fn order_id(i: usize) -> String {
    format!("o-{i:04}")
}

fn input(i: usize) -> Value {
    json!({"orderId": order_id(i), "n": i, "amount": 100 + i})
}

/// The final data of instance `i`, given the id of the event it sent and the token of the task
/// whose answer it took (the two values that the run decides).
fn expected(i: usize, request_id: &Value, token: &Value) -> Value {
    let o = order_id(i);
    json!({
        "orderId": o, "n": i, "amount": 100 + i,
        "charge": {"charged": 100 + i, "orderId": o},
        "reservation": {"reserved": o, "n": i},
        "reply": {"orderId": o, "approved": true, "requestId": request_id},
        "pack": {"packed": o, "items": 2 * i, "token": token},
        "status": "done"
    })
}

/// The service fails the first `charge` of every third order and the first two `reserve` calls of
/// every fifth with 503, which the definitions retry.
fn fails(path: &str, n: u64, attempt: u64) -> bool {
    match path {
        "charge" => n % 3 == 0 && attempt == 1,
        _ => n % 5 == 0 && attempt <= 2,
    }
}

/// Workers drop the first task of every 25th order, as if they died with it.
fn drops(n: u64, attempt: u64) -> bool {
    n % 25 == 7 && attempt == 1
}

// ---------------------------------------------------------------------------------------------
// The REST service
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Default)]
struct ServiceLog(Arc<Mutex<Vec<String>>>);

/// Answers `POST /charge` and `POST /reserve` after 5 to 40 ms, logging each call's Idempotency-Key.
fn service(log: ServiceLog) -> String {
    async fn handle(path: &'static str, log: ServiceLog, h: HeaderMap, body: Value) -> (StatusCode, Json<Value>) {
        let key = h
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        log.0.lock().unwrap().push(key.clone());
        let attempt = key.rsplit_once('#').and_then(|(_, a)| a.parse().ok()).unwrap_or(1u64);
        tokio::time::sleep(Duration::from_millis(5 + hash(&key) % 36)).await;
        let n = body["n"].as_u64().unwrap_or(0);
        if key.is_empty() {
            return (StatusCode::BAD_REQUEST, Json(json!({"reason": "no Idempotency-Key"})));
        }
        if fails(path, n, attempt) {
            return (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"retry": true})));
        }
        let answer = match path {
            "charge" => json!({"charged": body["amount"], "orderId": body["orderId"]}),
            _ => json!({"reserved": body["orderId"], "n": body["n"]}),
        };
        (StatusCode::OK, Json(answer))
    }
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let app = Router::new()
                .route(
                    "/charge",
                    post(|State(l): State<ServiceLog>, h: HeaderMap, Json(b): Json<Value>| handle("charge", l, h, b)),
                )
                .route(
                    "/reserve",
                    post(|State(l): State<ServiceLog>, h: HeaderMap, Json(b): Json<Value>| handle("reserve", l, h, b)),
                )
                .with_state(log);
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    format!("http://{}", rx.recv().expect("the service starts"))
}

// ---------------------------------------------------------------------------------------------
// sm4c serve, killed and started again
// ---------------------------------------------------------------------------------------------

/// `sm4c serve` on the campaign's store, with the workload's definitions and the service.
fn serve(db: &Path, defs: &Path, log: &Path, service: &str) -> Server {
    Serve::new()
        .db(db)
        .log(log)
        .arg("--definitions")
        .arg(defs)
        .arg("--rest-server")
        .arg(format!("file://service.openapi={service}"))
        .start()
}

/// The calls in flight in the crashed store `db`, as the Idempotency-Keys they are made with.
fn calls_in_flight(db: &Path, scratch: &Path) -> BTreeSet<String> {
    let copy = scratch.join("inspect.db");
    for suffix in ["", "-wal", "-shm"] {
        let from = PathBuf::from(format!("{}{suffix}", db.display()));
        let to = PathBuf::from(format!("{}{suffix}", copy.display()));
        let _ = std::fs::remove_file(&to);
        if from.exists() {
            std::fs::copy(&from, &to).expect("copy the store");
        }
    }
    let conn = rusqlite::Connection::open(&copy).expect("open the crashed store");
    let mut stmt = conn.prepare("SELECT instance, op FROM calls").expect("query calls");
    let keys = stmt
        .query_map([], |r| {
            Ok(format!("{}/{}", r.get::<_, String>(0)?, r.get::<_, String>(1)?))
        })
        .expect("read calls")
        .collect::<Result<BTreeSet<_>, _>>()
        .expect("read calls");
    keys
}

// ---------------------------------------------------------------------------------------------
// The driver
// ---------------------------------------------------------------------------------------------

/// What the driver was told, shared by its threads.
#[derive(Default)]
struct Driver {
    /// The server's URL: a restart listens on a new port (the harness's, never one picked here).
    base: std::sync::RwLock<String>,
    stop: AtomicBool,
    /// Instances whose start was answered 201 or 200.
    started: Mutex<BTreeSet<String>>,
    /// Every outbox entry seen while the run went on, by event id.
    sent: Mutex<BTreeMap<String, Value>>,
    /// Replies answered 202, by instance: the reply's data.
    replies: Mutex<BTreeMap<String, Vec<Value>>>,
    /// Task answers answered 200, by instance: the task tokens.
    answered: Mutex<BTreeMap<String, Vec<String>>>,
    /// Task answers sent again after a kill cut the response, then answered 409 `taskClosed`.
    maybe_answered: Mutex<BTreeMap<String, Vec<String>>>,
    tasks_taken: AtomicUsize,
    tasks_dropped: AtomicUsize,
    answers_closed: AtomicUsize,
    /// Requests that failed (connection refused or cut) and were sent again.
    resent: AtomicUsize,
    /// Answers the driver did not expect.
    problems: Mutex<Vec<String>>,
}

impl Driver {
    /// The server's URL now.
    fn base(&self) -> String {
        self.base.read().unwrap().clone()
    }

    /// Sends a request until the server answers it (it may be down between a kill and a restart).
    fn until_answered(&self, what: &str, req: impl Fn() -> reqwest::blocking::RequestBuilder) -> (u16, Value) {
        self.until_answered_again(what, req).0
    }

    /// [`Self::until_answered`], also saying whether the request was sent more than once.
    fn until_answered_again(
        &self,
        what: &str,
        req: impl Fn() -> reqwest::blocking::RequestBuilder,
    ) -> ((u16, Value), bool) {
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut again = false;
        loop {
            if let Ok(r) = req().send() {
                let status = r.status().as_u16();
                if let Ok(text) = r.text() {
                    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
                    return ((status, body), again);
                }
            }
            self.resent.fetch_add(1, Ordering::Relaxed);
            again = true;
            assert!(Instant::now() < deadline, "{what}: the server did not answer for 120 s");
            std::thread::sleep(Duration::from_millis(30));
        }
    }

    fn problem(&self, p: String) {
        self.problems.lock().unwrap().push(p);
    }

    fn starter(&self, n: usize, pace: Duration) {
        let client = Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
        for i in 0..n {
            if self.stop.load(Ordering::Relaxed) {
                return;
            }
            let id = instance_id(i);
            let body = json!({"definition": "campaign", "id": id, "input": input(i)});
            let (st, answer) = self.until_answered("POST /instances", || {
                client.post(format!("{}/instances", self.base())).json(&body)
            });
            if (st == 201 || st == 200) && answer["id"] == id.as_str() {
                self.started.lock().unwrap().insert(id);
            } else {
                self.problem(format!("POST /instances {id}: {st} {answer}"));
            }
            std::thread::sleep(pace);
        }
    }

    /// Follows the outbox; answers each request event with a correlated reply.
    fn replier(&self) {
        let client = Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
        let mut after = String::new();
        while !self.stop.load(Ordering::Relaxed) {
            let (st, page) = self.until_answered("GET /events/sent", || {
                client.get(format!("{}/events/sent?limit=500&after={after}", self.base()))
            });
            if st != 200 {
                self.problem(format!("GET /events/sent: {st} {page}"));
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
            let entries = page["events"].as_array().cloned().unwrap_or_default();
            for entry in &entries {
                let id = entry["event"]["id"].as_str().unwrap_or_default().to_string();
                let first = {
                    let mut sent = self.sent.lock().unwrap();
                    match sent.get(&id) {
                        Some(seen) => {
                            if seen != entry {
                                self.problem(format!("sent event {id} changed: {seen} then {entry}"));
                            }
                            false
                        }
                        None => {
                            sent.insert(id.clone(), entry.clone());
                            true
                        }
                    }
                };
                if first && entry["event"]["type"] == "campaign.request" {
                    self.reply(&client, entry);
                }
            }
            match page["next"].as_str() {
                Some(next) if !entries.is_empty() => after = next.to_string(),
                _ => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    fn reply(&self, client: &Client, entry: &Value) {
        let event = &entry["event"];
        let instance = entry["instance"].as_str().unwrap_or_default().to_string();
        let data = json!({"orderId": event["data"]["orderId"], "approved": true, "requestId": event["id"]});
        let reply = json!({
            "specversion": "1.0", "id": format!("reply-{instance}"), "source": "campaign-driver",
            "type": "campaign.reply", "orderid": event["orderid"], "datacontenttype": "application/json",
            "data": data
        });
        let (st, answer) = self.until_answered("POST /events", || {
            client
                .post(format!("{}/events", self.base()))
                .header("content-type", "application/cloudevents+json")
                .body(reply.to_string())
        });
        if st == 202 {
            self.replies.lock().unwrap().entry(instance).or_default().push(data);
        } else {
            self.problem(format!("POST /events reply-{instance}: {st} {answer}"));
        }
    }

    /// Takes tasks from the task list and completes them; answers are sent until the server takes them.
    fn worker(&self, name: &str) {
        let client = Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
        while !self.stop.load(Ordering::Relaxed) {
            let poll = client
                .post(format!(
                    "{}/tasklists/{TASK_LIST}/poll?wait=1s&worker={name}",
                    self.base()
                ))
                .header("x-sm4c-request", "1")
                .send();
            let task: Value = match poll {
                Ok(r) if r.status().as_u16() == 200 => match r.json() {
                    Ok(t) => t,
                    Err(_) => continue, // cut by a kill: that task's start-to-close timeout retries it
                },
                Ok(r) if r.status().as_u16() == 204 => continue,
                Ok(r) => {
                    self.problem(format!("poll: {}", r.status()));
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(30));
                    continue;
                }
            };
            self.tasks_taken.fetch_add(1, Ordering::Relaxed);
            let token = task["token"].as_str().unwrap_or_default().to_string();
            let instance = task["instanceId"].as_str().unwrap_or_default().to_string();
            let args = &task["arguments"];
            if drops(args["n"].as_u64().unwrap_or(0), task["attempt"].as_u64().unwrap_or(0)) {
                // A worker that dies with its task: the start-to-close timeout (3 s) fails the
                // call, and the retry policy puts a new task on the list.
                self.tasks_dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let result = json!({
                "packed": args["orderId"],
                "items": args["n"].as_u64().unwrap_or(0) * 2,
                "token": token
            });
            let ((st, answer), again) = self.until_answered_again("POST /tasks/{token}/complete", || {
                client
                    .post(format!("{}/tasks/{token}/complete", self.base()))
                    .json(&result)
            });
            match st {
                200 => self.answered.lock().unwrap().entry(instance).or_default().push(token),
                409 => {
                    self.answers_closed.fetch_add(1, Ordering::Relaxed);
                    if again {
                        // The first answer's response was lost in a kill; it may have won (409 means
                        // done, as docs/src/worker-task-lists.md says), or the task timed out.
                        self.maybe_answered
                            .lock()
                            .unwrap()
                            .entry(instance)
                            .or_default()
                            .push(token);
                    }
                }
                _ => self.problem(format!("complete {instance}: {st} {answer}")),
            }
        }
    }
}

struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

fn get(client: &Client, url: &str) -> Value {
    let r = client.get(url).send().unwrap_or_else(|e| panic!("GET {url}: {e}"));
    assert_eq!(r.status().as_u16(), 200, "GET {url}");
    r.json().unwrap_or_else(|e| panic!("GET {url}: {e}"))
}

/// Every instance of a definition, following the cursor.
fn list(client: &Client, base: &str, definition: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut after = String::new();
    loop {
        let page = get(
            client,
            &format!("{base}/instances?definition={definition}&limit=1000&after={after}"),
        );
        out.extend(page["instances"].as_array().cloned().unwrap_or_default());
        match page["next"].as_str() {
            Some(n) => after = n.to_string(),
            None => return out,
        }
    }
}

fn ended(v: &Value) -> bool {
    v["status"].as_str().is_some_and(|s| s != "running" && s != "waiting")
}

// ---------------------------------------------------------------------------------------------
// The campaign
// ---------------------------------------------------------------------------------------------

#[test]
fn kill_campaign_loses_and_repeats_nothing() {
    let p = params();
    let t0 = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let defs = dir.path().join("defs");
    std::fs::create_dir(&defs).unwrap();
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/campaign");
    for f in ["campaign.json", "campaign-sub.json", "service.openapi"] {
        std::fs::copy(data.join(f), defs.join(f)).expect("copy the workload");
    }
    let calls = ServiceLog::default();
    let db = dir.path().join("campaign.db");
    let log = dir.path().join("server.log");
    let mut serve = serve(&db, &defs, &log, &service(calls.clone()));
    let driver = Driver {
        base: std::sync::RwLock::new(serve.url().to_string()),
        ..Driver::default()
    };
    let mut rng = Rng::new(p.seed);
    // Kill k comes once a seeded share of the instances has been started, after a seeded pause;
    // instances are started at a pace that spreads them over about a second per kill.
    let mut thresholds: Vec<usize> = (0..p.kills)
        .map(|_| rng.range(p.instances as u64 / 20, p.instances as u64) as usize)
        .collect();
    thresholds.sort();
    let pace = Duration::from_millis((1000 * p.kills as u64 / p.instances as u64).max(1));
    let mut kills: Vec<BTreeSet<String>> = Vec::new();
    let mut downtime = Duration::ZERO;

    let client = Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
    std::thread::scope(|scope| {
        let d = &driver;
        // Stops the driver's threads when this closure ends, also by a failed assertion (the scope
        // would otherwise wait for them forever).
        let _stop = StopOnDrop(&d.stop);
        let starter = scope.spawn(move || d.starter(p.instances, pace));
        scope.spawn(move || d.replier());
        for w in 0..p.workers {
            scope.spawn(move || d.worker(&format!("w{w}")));
        }
        for &threshold in &thresholds {
            let deadline = Instant::now() + Duration::from_secs(120);
            while d.started.lock().unwrap().len() < threshold && !starter.is_finished() {
                assert!(
                    Instant::now() < deadline,
                    "starts stalled before kill {}",
                    kills.len() + 1
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            std::thread::sleep(Duration::from_millis(rng.range(0, 400)));
            serve.kill();
            let down = Instant::now();
            kills.push(calls_in_flight(&db, dir.path()));
            std::thread::sleep(Duration::from_millis(rng.range(0, 300)));
            serve.restart();
            *d.base.write().unwrap() = serve.url().to_string();
            downtime += down.elapsed();
        }
        starter.join().expect("the starter");
        // Let the instances finish.
        let deadline = Instant::now() + p.finish_within;
        loop {
            let parents = list(&client, &d.base(), "campaign");
            let done = parents.iter().filter(|v| ended(v)).count();
            if parents.len() == p.instances && done == p.instances {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{done} of {} instances ended within {:?} of the last kill; server log:\n{}",
                parents.len(),
                p.finish_within,
                serve.log_tail()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    let elapsed = t0.elapsed();

    // ---- The checker ----
    let base = &driver.base();
    let mut failures: Vec<String> = driver.problems.lock().unwrap().clone();
    let started = driver.started.lock().unwrap().clone();
    let replies = driver.replies.lock().unwrap().clone();
    let answered = driver.answered.lock().unwrap().clone();
    let maybe_answered = driver.maybe_answered.lock().unwrap().clone();
    let seen_sent = driver.sent.lock().unwrap().clone();

    // The outbox at the end: unique ids, everything seen during the run, unchanged.
    let mut outbox = Vec::new();
    let mut after = String::new();
    loop {
        let page = get(&client, &format!("{base}/events/sent?limit=1000&after={after}"));
        let events = page["events"].as_array().cloned().unwrap_or_default();
        if events.is_empty() {
            break;
        }
        outbox.extend(events);
        match page["next"].as_str() {
            Some(n) => after = n.to_string(),
            None => break,
        }
    }
    let mut by_id: BTreeMap<String, Value> = BTreeMap::new();
    let mut request_of: HashMap<String, Value> = HashMap::new();
    for e in &outbox {
        let id = e["event"]["id"].as_str().unwrap_or_default().to_string();
        if by_id.insert(id.clone(), e.clone()).is_some() {
            failures.push(format!("sent event id {id} is in the outbox twice"));
        }
        if e["event"]["type"] == "campaign.request" {
            let instance = e["instance"].as_str().unwrap_or_default().to_string();
            if !id.starts_with(&format!("{instance}/")) {
                failures.push(format!("sent event {id} of {instance}: not <instance>/<op>"));
            }
            if request_of.insert(instance.clone(), e["event"]["id"].clone()).is_some() {
                failures.push(format!("{instance} sent two requests"));
            }
        }
    }
    for (id, entry) in &seen_sent {
        match by_id.get(id) {
            None => failures.push(format!("sent event {id} was seen during the run and is gone")),
            Some(now) if now != entry => failures.push(format!("sent event {id} changed: {entry} then {now}")),
            _ => {}
        }
    }

    // Every instance: acknowledged, completed, the expected output; its reply and task answer the
    // acknowledged ones.
    for i in 0..p.instances {
        let id = instance_id(i);
        if !started.contains(&id) {
            failures.push(format!("{id}: its start was never acknowledged"));
        }
        let v = get(&client, &format!("{base}/instances/{id}"));
        let request_id = request_of.get(&id).cloned().unwrap_or(Value::Null);
        let token = v["data"]["pack"]["token"].clone();
        let want = expected(i, &request_id, &token);
        if v["status"] != "completed" || v["data"] != want {
            failures.push(format!("{id}: {} {}, expected {want}", v["status"], v["data"]));
        }
        // A reply whose acknowledgement a kill cut was posted again (same CloudEvent id): all
        // acknowledged copies are the one the instance took.
        let acked = replies.get(&id).cloned().unwrap_or_default();
        if acked.is_empty() || acked.iter().any(|r| *r != v["data"]["reply"]) {
            failures.push(format!(
                "{id}: acknowledged replies {acked:?}, took {}",
                v["data"]["reply"]
            ));
        }
        // The task answer the instance took is one the worker sent: acknowledged (200), or sent
        // again after a kill and then found closed; and no acknowledged answer was dropped.
        let acked = answered.get(&id).cloned().unwrap_or_default();
        let maybe = maybe_answered.get(&id).cloned().unwrap_or_default();
        let took = token.as_str().unwrap_or_default();
        if acked.iter().any(|t| t != took) || !(acked.iter().chain(&maybe).any(|t| t == took)) {
            failures.push(format!(
                "{id}: acknowledged task answers {acked:?} (sent again and found closed: {maybe:?}), took {token}"
            ));
        }
    }
    let cut_answers_won = (0..p.instances)
        .filter(|i| {
            let id = instance_id(*i);
            let took = get(&client, &format!("{base}/instances/{id}"))["data"]["pack"]["token"].clone();
            maybe_answered
                .get(&id)
                .is_some_and(|m| m.iter().any(|t| took == t.as_str()))
        })
        .count();
    let children = list(&client, base, "campaign-sub");
    if children.len() != p.instances {
        failures.push(format!("{} subflows for {} instances", children.len(), p.instances));
    }
    for c in &children {
        let id = c["id"].as_str().unwrap_or_default();
        let v = get(&client, &format!("{base}/instances/{id}"));
        let n = v["data"]["n"].as_u64().unwrap_or(u64::MAX) as usize;
        let want = json!({"orderId": order_id(n), "n": n, "reservation": {"reserved": order_id(n), "n": n}});
        if v["status"] != "completed" || v["data"] != want {
            failures.push(format!("subflow {id}: {} {}, expected {want}", v["status"], v["data"]));
        }
    }

    // The service's log: a key made again only if it was in flight at a kill, once per such kill.
    let log = calls.0.lock().unwrap().clone();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for k in &log {
        *counts.entry(k.as_str()).or_default() += 1;
    }
    let mut reruns = 0;
    for (key, n) in &counts {
        let in_flight = kills.iter().filter(|k| k.contains(*key)).count();
        reruns += n - 1;
        if n - 1 > in_flight {
            failures.push(format!(
                "key {key} reached the service {n} times, in flight at {in_flight} kills: a completed call ran again"
            ));
        }
        if key.is_empty() {
            failures.push("a call without an Idempotency-Key".into());
        }
    }
    // Each instance charged and reserved with the attempts the service's failures call for.
    let charges = (0..p.instances)
        .map(|i| 1 + fails("charge", i as u64, 1) as usize)
        .sum::<usize>();
    let reserves = (0..p.instances)
        .map(|i| 1 + fails("reserve", i as u64, 1) as usize + fails("reserve", i as u64, 2) as usize)
        .sum::<usize>();
    if counts.len() != charges + reserves {
        failures.push(format!(
            "{} distinct keys reached the service, expected {} charges and {} reservations",
            counts.len(),
            charges,
            reserves
        ));
    }

    let in_flight: usize = kills.iter().map(BTreeSet::len).sum();
    eprintln!(
        "kill campaign (seed {}): {} instances, {} kills in {:.1?} ({:.1?} down); {} service calls, {} keys, \
         {} re-runs of the {} calls in flight at the kills; {} sent events; {} tasks handed out ({} dropped by workers), {} answers \
         found the task closed ({} of them had won before a kill cut their response); {} requests sent again \
         after a kill; {} failures",
        p.seed,
        p.instances,
        kills.len(),
        elapsed,
        downtime,
        log.len(),
        counts.len(),
        reruns,
        in_flight,
        outbox.len(),
        driver.tasks_taken.load(Ordering::Relaxed),
        driver.tasks_dropped.load(Ordering::Relaxed),
        driver.answers_closed.load(Ordering::Relaxed),
        cut_answers_won,
        driver.resent.load(Ordering::Relaxed),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "kill campaign (seed {}): {} failures:\n{}\nserver log:\n{}",
        p.seed,
        failures.len(),
        failures.iter().take(50).cloned().collect::<Vec<_>>().join("\n"),
        serve.log_tail()
    );
}
