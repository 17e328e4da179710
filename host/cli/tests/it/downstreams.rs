//! The slow and failing downstreams campaign (issue 16, "Crash and fault campaigns"): `sm4c serve`
//! calls two REST services, a healthy one and a bad one that hangs, then resets connections, then
//! answers 500, under bursts of instances. The test proves:
//!
//! - instances that call the healthy service all complete (within a generous bound) while the bad
//!   one hangs: a hung service does not stall the others (liveness, not speed);
//! - the timeout configured for the bad document is honoured: its calls fail with a
//!   `functionError` whose `details.kind` is `"timeout"`, reset connections and 500s fail as the
//!   docs say (`details.kind` `"request"` or `"connection"`, `details.status` 500);
//! - the bad service never has more connections open at once than the configured `concurrency`
//!   (it counts them itself, at the socket);
//! - the server's memory stays bounded: VmRSS after two bursts of hung calls is within a generous
//!   bound of what it was before.
//!
//! `cargo test` runs bursts of 500 hung calls; `SM4C_DOWNSTREAMS_FULL=1` runs bursts of 5,000 (the
//! figures of both are in docs/src/testing.md).

use crate::support::proc;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::server;
use server::{Serve, Server};
/// The bad document's configured bound and timeout.
const CONCURRENCY: usize = 4;
const TIMEOUT: &str = "1s";
/// Generous bounds: these are liveness checks, not speed checks.
const GOOD_WITHIN: Duration = Duration::from_secs(60);
const BAD_WITHIN: Duration = Duration::from_secs(120);
/// How much the server's RSS may grow over the bursts.
const RSS_GROWTH_MB: u64 = 100;

const HANG: u8 = 0;
const RESET: u8 = 1;
const FAIL: u8 = 2;

/// The bad service: what it does with each request, and how many connections it has open.
#[derive(Default)]
struct Bad {
    mode: AtomicU8,
    open: AtomicUsize,
    max_open: AtomicUsize,
    requests: AtomicUsize,
}

struct Open(Arc<Bad>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Reads one HTTP/1.1 request (head and a `content-length` body).
async fn read_request(sock: &mut tokio::net::TcpStream) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = sock.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            while buf.len() < end + 4 + len {
                let n = sock.read(&mut chunk).await?;
                if n == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return Ok(());
        }
    }
}

/// Serves the bad service on a raw socket, so that it counts connections, not requests.
async fn bad_service(listener: tokio::net::TcpListener, bad: Arc<Bad>) {
    loop {
        let Ok((mut sock, _)) = listener.accept().await else {
            continue;
        };
        let now = bad.open.fetch_add(1, Ordering::SeqCst) + 1;
        bad.max_open.fetch_max(now, Ordering::SeqCst);
        let open = Open(bad.clone());
        tokio::spawn(async move {
            let _open = open;
            let bad = _open.0.clone();
            if read_request(&mut sock).await.is_err() {
                return;
            }
            bad.requests.fetch_add(1, Ordering::SeqCst);
            match bad.mode.load(Ordering::SeqCst) {
                // Never answers; the connection stays open until the caller closes it.
                HANG => {
                    let mut b = [0u8; 1024];
                    while matches!(sock.read(&mut b).await, Ok(n) if n > 0) {}
                }
                RESET => {
                    // SO_LINGER 0: the close sends RST at once (it does not block).
                    #[allow(deprecated)]
                    let _ = sock.set_linger(Some(Duration::ZERO));
                    drop(sock);
                }
                _ => {
                    let body = br#"{"error":"boom"}"#;
                    let head = format!(
                        "HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = sock.write_all(head.as_bytes()).await;
                    let _ = sock.write_all(body).await;
                    let _ = sock.shutdown().await;
                }
            }
        });
    }
}

/// Starts both services on a runtime of their own: (healthy URL, bad URL).
fn services(bad: Arc<Bad>) -> (String, String) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        rt.block_on(async move {
            let good = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let bad_l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
            tx.send((good.local_addr().expect("addr"), bad_l.local_addr().expect("addr")))
                .expect("send addresses");
            tokio::spawn(bad_service(bad_l, bad));
            let app = Router::new().route(
                "/call",
                post(|Json(v): Json<Value>| async move { Json(json!({"echo": v})) }),
            );
            axum::serve(good, app).await.expect("healthy service");
        });
    });
    let (good, bad) = rx.recv().expect("addresses");
    (format!("http://{good}"), format!("http://{bad}"))
}

fn openapi(server: &str) -> Value {
    json!({
        "openapi": "3.0.1",
        "servers": [{"url": server}],
        "paths": {"/call": {"post": {"operationId": "call"}}}
    })
}

/// Calls `call` of `doc` with `.n` and keeps the answer.
fn definition(id: &str, doc: &str) -> Value {
    json!({
        "id": id, "name": id, "version": "1",
        "functions": [{"name": "call", "operation": format!("{doc}#call")}],
        "states": [{"name": "Call", "start": true,
            "enterAction": {"type": "invokeFunction", "functionName": "call", "waitForCompletion": true,
                            "arguments": {"n": "${ .n }"}},
            "enterResultHandler": "${ .answer = $value }"}]
    })
}

/// `sm4c serve` with the two documents, killed when dropped.
struct Serving {
    server: Server,
}

impl Serving {
    fn start(good: &str, bad: &str) -> Serving {
        let dir = tempfile::tempdir().expect("tempdir");
        let defs = dir.path().join("defs");
        std::fs::create_dir(&defs).expect("defs");
        // The documents get their own extension so that serve does not read them as definitions.
        std::fs::write(defs.join("good.openapi"), openapi(good).to_string()).expect("write");
        std::fs::write(defs.join("bad.openapi"), openapi(bad).to_string()).expect("write");
        std::fs::write(
            defs.join("good.json"),
            definition("good", "file://good.openapi").to_string(),
        )
        .expect("write");
        std::fs::write(
            defs.join("bad.json"),
            definition("bad", "file://bad.openapi").to_string(),
        )
        .expect("write");
        let config = dir.path().join("sm4c.toml");
        std::fs::write(
            &config,
            format!("[rest.\"file://bad.openapi\"]\ntimeout = \"{TIMEOUT}\"\nconcurrency = {CONCURRENCY}\n"),
        )
        .expect("write");
        let server = Serve::new()
            .db(dir.path().join("sm4c.db"))
            .log(dir.path().join("server.log"))
            .arg("--definitions")
            .arg(&defs)
            .arg("--config")
            .arg(&config)
            .keep(dir)
            .start();
        Serving { server }
    }

    fn log(&self) -> String {
        self.server.log()
    }

    fn start_instance(&self, definition: &str, id: &str, n: usize) {
        let r = self
            .server
            .client()
            .post(format!("{}/instances", self.server.url()))
            .json(&json!({"definition": definition, "id": id, "input": {"n": n}}))
            .send()
            .expect("start answered");
        let status = r.status();
        assert_eq!(status, 201, "start {id}: {}", r.text().unwrap_or_default());
    }

    fn instance(&self, id: &str) -> Value {
        self.server
            .client()
            .get(format!("{}/instances/{id}", self.server.url()))
            .send()
            .and_then(|r| r.json())
            .expect("instance")
    }

    /// Waits until every instance has ended; returns them.
    fn ended(&self, ids: &[String], within: Duration, what: &str) -> Vec<Value> {
        let started = Instant::now();
        let mut out = Vec::new();
        for id in ids {
            loop {
                let v = self.instance(id);
                if v["status"] == "completed" || v["status"] == "failed" {
                    out.push(v);
                    break;
                }
                assert!(
                    started.elapsed() < within,
                    "{what}: instance {id} has not ended after {within:?}: {v}\n{}",
                    self.log()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        out
    }

    /// The server's resident set (kB), from /proc.
    fn rss_kb(&self) -> u64 {
        proc::rss_kb(self.server.pid())
    }
}

/// Starts `bad` instances of the bad definition and `good` of the healthy one, interleaved.
fn burst(s: &Serving, tag: &str, bad: usize, good: usize) -> (Vec<String>, Vec<String>) {
    let (mut b, mut g) = (Vec::new(), Vec::new());
    for i in 0..bad.max(good) {
        if i < bad {
            let id = format!("{tag}-bad-{i:04}");
            s.start_instance("bad", &id, i);
            b.push(id);
        }
        if i < good {
            let id = format!("{tag}-good-{i:04}");
            s.start_instance("good", &id, i);
            g.push(id);
        }
    }
    (b, g)
}

fn assert_good(s: &Serving, ids: &[String], what: &str) -> Duration {
    let started = Instant::now();
    for v in s.ended(ids, GOOD_WITHIN, what) {
        assert_eq!(v["status"], "completed", "{what}: {v}");
        assert_eq!(v["data"]["answer"]["echo"]["n"], v["data"]["n"], "{what}: {v}");
    }
    started.elapsed()
}

/// Every instance failed with a `functionError`; `check` holds for each error, except calls that
/// timed out waiting for a turn (a burst larger than the bound, faster than the service fails),
/// and for at least one.
fn assert_bad(s: &Serving, ids: &[String], what: &str, check: impl Fn(&Value) -> bool) {
    let mut checked = 0;
    for v in s.ended(ids, BAD_WITHIN, what) {
        assert_eq!(v["status"], "failed", "{what}: {v}");
        let e = &v["error"];
        assert_eq!(e["type"], "functionError", "{what}: {v}");
        let waited = e["details"]["kind"] == "timeout" && e["message"].as_str().is_some_and(|m| m.contains("no turn"));
        if check(e) {
            checked += 1;
        } else {
            assert!(waited, "{what}: {e}");
        }
    }
    assert!(checked > 0, "{what}: no call failed the way the service failed it");
}

#[test]
fn a_hung_reset_or_failing_service_does_not_stall_others_and_stays_bounded() {
    let full = std::env::var("SM4C_DOWNSTREAMS_FULL").is_ok_and(|v| !v.is_empty() && v != "0");
    let hung = if full { 5000 } else { 500 };
    let bad = Arc::new(Bad::default());
    let (good_url, bad_url) = services(bad.clone());
    let s = Serving::start(&good_url, &bad_url);
    // Warm up both paths, so that the first RSS reading is not of an idle process.
    let (b, g) = burst(&s, "warm", 2, 20);
    bad.mode.store(FAIL, Ordering::SeqCst);
    assert_good(&s, &g, "warm-up");
    s.ended(&b, BAD_WITHIN, "warm-up");
    let rss_before = s.rss_kb();

    // The bad service hangs: the healthy instances complete all the same, the hung calls time out.
    bad.mode.store(HANG, Ordering::SeqCst);
    bad.max_open.store(bad.open.load(Ordering::SeqCst), Ordering::SeqCst);
    let mut took = Vec::new();
    for round in 0..2 {
        let tag = format!("hang{round}");
        let (b, g) = burst(&s, &tag, hung, 200);
        took.push(assert_good(
            &s,
            &g,
            &format!("healthy instances while the other service hangs ({tag})"),
        ));
        assert_bad(&s, &b, &tag, |e| {
            e["details"]["kind"] == "timeout" && e["message"].as_str().is_some_and(|m| m.contains("timeout"))
        });
    }
    let rss_after = s.rss_kb();
    let max_hang = bad.max_open.load(Ordering::SeqCst);
    let hung_requests = bad.requests.load(Ordering::SeqCst);

    // Reset connections, then 500s.
    bad.mode.store(RESET, Ordering::SeqCst);
    bad.max_open.store(bad.open.load(Ordering::SeqCst), Ordering::SeqCst);
    let (b, g) = burst(&s, "reset", 100, 100);
    assert_good(&s, &g, "healthy instances while the other service resets connections");
    assert_bad(&s, &b, "reset", |e| {
        matches!(e["details"]["kind"].as_str(), Some("request" | "connection"))
    });
    let max_reset = bad.max_open.load(Ordering::SeqCst);

    bad.mode.store(FAIL, Ordering::SeqCst);
    bad.max_open.store(bad.open.load(Ordering::SeqCst), Ordering::SeqCst);
    let (b, g) = burst(&s, "fail", 100, 100);
    assert_good(&s, &g, "healthy instances while the other service answers 500");
    assert_bad(&s, &b, "500", |e| e["details"]["status"] == 500);
    let max_fail = bad.max_open.load(Ordering::SeqCst);

    eprintln!(
        "healthy bursts completed in {took:?} while the other service hung; {hung_requests} hung requests reached it; \
         most connections open at once: {max_hang} (hang), {max_reset} (reset), {max_fail} (500), bound {CONCURRENCY}; \
         VmRSS {rss_before} kB before, {rss_after} kB after {} hung calls",
        2 * hung
    );
    for (what, max) in [("hang", max_hang), ("reset", max_reset), ("500", max_fail)] {
        assert!(
            max <= CONCURRENCY,
            "{what}: the bad service saw {max} connections at once; the bound is {CONCURRENCY}"
        );
        assert!(max >= 1, "{what}: the bad service saw no call");
    }
    assert!(
        rss_after <= rss_before + RSS_GROWTH_MB * 1024,
        "VmRSS grew from {rss_before} kB to {rss_after} kB over the bursts"
    );
}
