//! The disk-full campaign (issue 16, "Crash and fault campaigns"): `sm4c serve` keeps its store on a
//! small file system made for the test (tmpfs), a filler file takes nearly all of it, and starts go
//! on until the disk is full. The test proves:
//!
//! - writes are refused with 503 and the error code `storageFull` in the usual error body, never a
//!   500, and the process does not stop; reads go on being served;
//! - nothing acknowledged is lost: every instance whose start got 201 is there, and completes (its
//!   timer, which may come due while the disk is full, fires once space returns);
//! - the server carries on by itself once the filler is deleted: new starts succeed without a restart;
//! - the SQLite file is not corrupted (`PRAGMA integrity_check` after the server stops).
//!
//! `cargo test` runs one fill-and-free cycle; `SM4C_DISK_FULL_CYCLES=N` runs N on the same server.
//!
//! It needs to mount a tmpfs, which root may do (CI and the development machines run tests as root).
//! Where mounting is not permitted the test fails and says so: it never skips silently.

use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::server;
use server::{Serve, Server, BIN};
/// Longest the server may take to recover once space returns, or an instance to complete.
const DEADLINE: Duration = Duration::from_secs(60);

/// A tmpfs mounted on a temporary folder, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output();
        match out {
            Ok(o) if o.status.success() => Tmpfs { dir },
            Ok(o) => panic!(
                "the disk-full campaign needs a small file system for the store, and `mount -t tmpfs` failed \
                 ({}): {}. Run it as root (CI does) or with CAP_SYS_ADMIN; it does not skip",
                o.status,
                String::from_utf8_lossy(&o.stderr).trim()
            ),
            Err(e) => {
                panic!("the disk-full campaign needs a small file system for the store, and `mount` could not run: {e}")
            }
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

/// `sm4c serve` on the tmpfs; killed when dropped, before the tmpfs is unmounted.
struct Campaign {
    server: Server,
    db: PathBuf,
    // Dropped last: the server goes first.
    fs: Tmpfs,
}

impl Campaign {
    fn start(size: &str) -> Campaign {
        let fs = Tmpfs::mount(size);
        let db = fs.path().join("sm4c.db");
        // The log stays in the server's own folder, off the small file system: it must not be
        // what fills it.
        let server = Serve::new().db(&db).start();
        Campaign { server, db, fs }
    }

    /// Stops the server with SIGTERM (it closes the store cleanly) and waits for it.
    fn stop(&mut self) {
        let status = self.server.terminate();
        assert!(
            status.success(),
            "sm4c serve stopped with {status}; log:\n{}",
            self.log()
        );
    }

    /// Starts the server again on the same store (on a new port).
    fn restart(&mut self) {
        self.server.restart();
    }

    /// The files on the small file system and their sizes.
    fn files(&self) -> String {
        let mut out = Vec::new();
        for e in std::fs::read_dir(self.fs.path()).into_iter().flatten().flatten() {
            let len = e.metadata().map(|m| m.len()).unwrap_or(0);
            out.push(format!("{} ({len} bytes)", e.file_name().to_string_lossy()));
        }
        out.join(", ")
    }

    fn log(&self) -> String {
        self.server.log()
    }

    fn assert_alive(&self) {
        let mut child = std::process::Command::new("kill");
        let alive = child
            .args(["-0", &self.server.pid().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(alive, "sm4c serve is gone; log:\n{}", self.log());
    }

    fn request(&self, req: reqwest::blocking::RequestBuilder) -> (u16, Value) {
        let resp = req
            .send()
            .unwrap_or_else(|e| panic!("no answer ({e}); log:\n{}", self.log()));
        let status = resp.status().as_u16();
        let text = resp.text().unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.request(
            self.server
                .client()
                .post(format!("{}{path}", self.server.url()))
                .json(body),
        )
    }

    fn get(&self, path: &str) -> (u16, Value) {
        self.request(self.server.client().get(format!("{}{path}", self.server.url())))
    }

    fn start_instance(&self, id: &str, n: usize) -> (u16, Value) {
        // Each start writes some kilobytes, so that a few dozen fill what the filler leaves.
        let input = json!({"n": n, "pad": "x".repeat(6000)});
        self.post(
            "/instances",
            &json!({"definition": "delayed", "id": id, "input": input}),
        )
    }
}

/// Waits a second, then completes: its timer may come due while the disk is full.
fn delayed() -> Value {
    json!({
        "id": "delayed", "name": "Delayed", "version": "1",
        "states": [
            {"name": "Pause", "start": true, "enterAction": {"type": "delay", "timeout": "1s"},
             "transitions": [{"nextState": "Done"}]},
            {"name": "Done"}
        ]
    })
}

/// Fills the file system with `path` until a write fails, then gives `leave` bytes back.
fn fill(path: &Path, leave: u64) {
    let mut f = std::fs::File::create(path).expect("create the filler");
    let chunk = vec![0x5au8; 64 * 1024];
    let mut written = 0u64;
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(e) if e.raw_os_error() == Some(28) => break, // ENOSPC
            Err(e) => panic!("writing the filler: {e}"),
        }
    }
    let _ = f.flush();
    f.set_len(written.saturating_sub(leave)).expect("shrink the filler");
}

fn assert_storage_full(code: u16, body: &Value, what: &str) {
    assert_eq!(code, 503, "{what} on a full disk: {body}");
    assert_eq!(body["error"], "storageFull", "{what}: {body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(message.contains("disk is full"), "{what}: the message says why: {body}");
}

/// Fill-and-free cycles: one under `cargo test`, `SM4C_DISK_FULL_CYCLES=N` for more.
fn cycles() -> usize {
    std::env::var("SM4C_DISK_FULL_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

#[test]
fn a_full_disk_refuses_writes_loses_nothing_and_passes_when_space_returns() {
    // Each cycle leaves about a megabyte of instances (and their write-ahead log) behind.
    let mut c = Campaign::start(&format!("{}m", 16 + 4 * cycles()));
    let (code, body) = c.post("/definitions", &delayed());
    assert_eq!(code, 201, "define: {body}");
    for i in 0..5 {
        let (code, body) = c.start_instance(&format!("before-{i}"), i);
        assert_eq!(code, 201, "start before the filler: {body}");
    }

    let mut acknowledged: Vec<String> = (0..5).map(|i| format!("before-{i}")).collect();
    for cycle in 0..cycles() {
        // The filler takes all but 512 KB; then starts go on until the disk is full.
        let filler = c.fs.path().join("filler");
        fill(&filler, 512 * 1024);
        let mut refused = 0;
        let mut n = 0;
        while refused < 20 {
            n += 1;
            assert!(n < 5000, "5000 starts and the disk never filled; log:\n{}", c.log());
            let id = format!("fill-{cycle}-{n:04}");
            match c.start_instance(&id, n) {
                (201, body) => {
                    assert_eq!(body["id"], json!(id));
                    acknowledged.push(id);
                }
                (code, body) => {
                    assert_storage_full(code, &body, "a start");
                    refused += 1;
                }
            }
        }
        eprintln!(
            "cycle {cycle}: disk full after {} acknowledged starts in all; {refused} refused",
            acknowledged.len()
        );

        // While full: other writes are refused the same way, reads are served, the process lives.
        // (Larger than what a refused write may leave allocated in the write-ahead log.)
        let mut other = delayed();
        other["id"] = json!("other");
        other["description"] = json!("x".repeat(200_000));
        let (code, body) = c.post("/definitions", &other);
        assert_storage_full(code, &body, "registering a definition");
        let event = json!({"specversion": "1.0", "id": "e-1", "source": "test", "type": "com.example.nobody",
                       "data": {"pad": "x".repeat(200_000)}});
        let (code, body) = c.request(
            c.server
                .client()
                .post(format!("{}/events", c.server.url()))
                .header("content-type", "application/cloudevents+json")
                .body(event.to_string()),
        );
        assert_storage_full(code, &body, "an event");
        let (code, body) = c.get(&format!("/instances/{}", acknowledged[0]));
        assert_eq!(code, 200, "reads go on while the disk is full: {body}");
        // Timers come due meanwhile (their steps cannot be written either).
        std::thread::sleep(Duration::from_millis(1500));
        c.assert_alive();

        // Space returns: the server takes writes again by itself, without a restart.
        std::fs::remove_file(&filler).expect("delete the filler");
        let back = Instant::now();
        let mut after = 0;
        loop {
            let (code, body) = c.start_instance(&format!("after-{cycle}-{after}"), after);
            match code {
                201 => break,
                503 => assert_storage_full(code, &body, "a start while space returns"),
                _ => panic!("a start once space returns: {code} {body}"),
            }
            after += 1;
            assert!(
                back.elapsed() < DEADLINE,
                "starts still refused {DEADLINE:?} after space returned; the file system holds {}",
                c.files()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!(
            "cycle {cycle}: writes accepted again {:?} after the filler was deleted",
            back.elapsed()
        );
        acknowledged.push(format!("after-{cycle}-{after}"));
        for i in 0..20 {
            let (code, body) = c.start_instance(&format!("later-{cycle}-{i}"), i);
            assert_eq!(code, 201, "starts once space returned: {body}");
            acknowledged.push(format!("later-{cycle}-{i}"));
        }
    }

    // Nothing acknowledged is lost, and every instance completes.
    let started = Instant::now();
    for id in &acknowledged {
        loop {
            let (code, body) = c.get(&format!("/instances/{id}"));
            assert_eq!(code, 200, "acknowledged instance {id} is there: {body}");
            if body["status"] == "completed" {
                break;
            }
            assert!(
                started.elapsed() < DEADLINE,
                "acknowledged instance {id} did not complete: {body}; log:\n{}",
                c.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    assert!(
        c.log().contains("disk is full"),
        "the server logs the full disk:\n{}",
        c.log()
    );

    // The file is sound, and holds every acknowledged instance.
    let db = c.db.clone();
    c.server.kill();
    let conn = rusqlite::Connection::open(&db).expect("open the store");
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .expect("integrity_check");
    assert_eq!(check, "ok");
    for id in &acknowledged {
        let status: String = conn
            .query_row("SELECT status FROM instances WHERE id = ?1", [id], |r| r.get(0))
            .unwrap_or_else(|e| panic!("instance {id} is in the store: {e}"));
        assert_eq!(status, "completed", "{id}");
    }
}

/// Starting on a disk that is already full: `sm4c serve` cannot open the store (SQLite cannot even
/// read it in WAL mode), says the disk is full rather than calling the file foreign or damaged, and
/// leaves it as it was: once space is freed it starts on it with nothing lost.
#[test]
fn a_store_on_a_full_disk_is_not_opened_and_the_message_says_why() {
    let mut c = Campaign::start("4m");
    let (code, body) = c.post("/definitions", &delayed());
    assert_eq!(code, 201, "define: {body}");
    let (code, body) = c.start_instance("kept", 1);
    assert_eq!(code, 201, "start: {body}");
    c.stop();

    let filler = c.fs.path().join("filler");
    fill(&filler, 0);
    let out = Command::new(BIN)
        .arg("serve")
        .arg("--db")
        .arg(&c.db)
        .args(["--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .output()
        .expect("sm4c serve runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("disk is full") && stderr.contains("free space"),
        "the message says the disk is full: {stderr}"
    );
    assert!(
        !stderr.contains("not an sm4c store") && !stderr.contains("damaged"),
        "{stderr}"
    );

    std::fs::remove_file(&filler).expect("delete the filler");
    c.restart();
    let started = Instant::now();
    loop {
        let (code, body) = c.get("/instances/kept");
        assert_eq!(code, 200, "the instance is there: {body}");
        if body["status"] == "completed" {
            break;
        }
        assert!(started.elapsed() < DEADLINE, "kept did not complete: {body}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
