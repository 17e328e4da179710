//! `scripts/demo.sh`, run as a newcomer runs it: a real child process that starts a tansu broker, two
//! `sm4c serve --kafka` workers (this test's binary, through `SM4C_BIN`) and the Python services of
//! `scripts/demo/services.py`, then starts trips of the demo's saga. The test waits until trips have
//! completed on both workers' partitions, checks the inspector URLs the script printed, sends the
//! script SIGTERM and checks that every process it started is gone and its temporary directory too.
//!
//! It needs the tansu broker (`SM4C_TANSU`) and the Python of `.tools/venv` with confluent-kafka and
//! the CloudEvents SDK (`SM4C_PYTHON`), which `scripts/test.sh` sets up; without them it fails,
//! saying so. The ports are the test's own, free ones, so it runs beside other tests.

use reqwest::blocking::Client;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_sm4c");

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// What the demo needs besides sm4c, from the environment `scripts/test.sh` (through
/// `scripts/setup.sh`) gives the tests.
fn tool(var: &str) -> String {
    match std::env::var(var) {
        Ok(path) if Path::new(&path).exists() => path,
        _ => panic!(
            "the demo test needs {var}: the tansu broker (SM4C_TANSU) and the Python with confluent-kafka and \
             the CloudEvents SDK (SM4C_PYTHON) that scripts/setup.sh installs into .tools/; run ./scripts/test.sh, \
             or `source scripts/setup.sh` before `cargo test`"
        ),
    }
}

/// `n` distinct ports free at the time of asking. The one place the tests pick ports themselves:
/// scripts/demo.sh takes the broker's and the workers' ports as its input (as a user runs it), and
/// the tansu broker cannot report a port it picked. The script refuses ports already in use, so a
/// port taken meanwhile fails the test with that message rather than talking to another server.
fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("an ephemeral port"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("address").port())
        .collect()
}

/// Whether a process is still there (a zombie, which has ended and only waits to be reaped, is not).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

/// A process's start time (field 22 of `/proc/PID/stat`), which tells it from a later one with its pid.
fn start_time(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    rest.split_whitespace().nth(19).map(str::to_string)
}

/// Sends a signal by name through Python, as tests/kafka.rs does (the workspace forbids `unsafe`).
fn signal(pid: u32, sig: &str) {
    let _ = Command::new(tool("SM4C_PYTHON"))
        .args([
            "-c",
            "import os, signal, sys; os.kill(int(sys.argv[1]), getattr(signal, sys.argv[2]))",
        ])
        .args([&pid.to_string(), sig])
        .stderr(Stdio::null())
        .status();
}

/// The temporary directory the script names (`demo: logs and pids in DIR (...)`), which holds the
/// file `pids`, one `NAME PID` a line.
fn temp_dir(out: &str) -> Option<PathBuf> {
    out.lines()
        .find_map(|l| l.strip_prefix("demo: logs and pids in "))
        .and_then(|l| l.split(" (").next())
        .map(PathBuf::from)
}

/// The running script, its output so far and the processes it said it started. Dropped while they
/// run (a failed assertion), it stops them, so a failure leaves nothing behind.
struct Demo {
    child: Child,
    output: Arc<Mutex<String>>,
    started: Vec<(String, u32)>,
}

impl Demo {
    fn start(ports: &[u16]) -> Demo {
        let mut child = Command::new("bash")
            .arg(root().join("scripts/demo.sh"))
            .current_dir(root())
            .env("SM4C_BIN", BIN)
            .env("SM4C_TANSU", tool("SM4C_TANSU"))
            .env("SM4C_PYTHON", tool("SM4C_PYTHON"))
            .env("SM4C_DEMO_BROKER_PORT", ports[0].to_string())
            .env("SM4C_DEMO_PORT_A", ports[1].to_string())
            .env("SM4C_DEMO_PORT_B", ports[2].to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("bash scripts/demo.sh");
        let output = Arc::new(Mutex::new(String::new()));
        let streams: [Box<dyn Read + Send>; 2] = [
            Box::new(child.stdout.take().expect("stdout")),
            Box::new(child.stderr.take().expect("stderr")),
        ];
        for stream in streams {
            let output = output.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    let mut o = output.lock().unwrap_or_else(|e| e.into_inner());
                    o.push_str(&line);
                    o.push('\n');
                }
            });
        }
        Demo {
            child,
            output,
            started: Vec::new(),
        }
    }

    fn output(&self) -> String {
        self.output.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Waits until the output has `text`; fails, with the output, if the script ends first or the
    /// deadline passes.
    fn wait_for(&mut self, text: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let out = self.output();
            if out.contains(text) {
                return out;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                std::thread::sleep(Duration::from_millis(200));
                panic!(
                    "scripts/demo.sh ended ({status}) before printing {text:?}:\n{}",
                    self.output()
                );
            }
            assert!(
                Instant::now() < deadline,
                "scripts/demo.sh did not print {text:?} within {within:?}:\n{out}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        // What the demo started, as far as it has said, each with its start time, so that a pid the
        // system gave to another process meanwhile is left alone.
        let mut pids: Vec<u32> = self.started.iter().map(|(_, pid)| *pid).collect();
        if let Some(dir) = temp_dir(&self.output()) {
            let listed = std::fs::read_to_string(dir.join("pids")).unwrap_or_default();
            pids.extend(
                listed
                    .lines()
                    .filter_map(|l| l.split_once(' ')?.1.trim().parse::<u32>().ok()),
            );
        }
        let left: Vec<(u32, Option<String>)> = pids.into_iter().map(|pid| (pid, start_time(pid))).collect();
        // The test failed with the demo running: SIGTERM for it to stop what it started, SIGKILL
        // after 30 s; then SIGKILL for whatever is left.
        if self.child.try_wait().ok().flatten().is_none() {
            signal(self.child.id(), "SIGTERM");
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline && self.child.try_wait().ok().flatten().is_none() {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        for (pid, started) in left {
            if started.is_some() && alive(pid) && start_time(pid) == started {
                signal(pid, "SIGKILL");
            }
        }
    }
}

fn http() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client")
}

/// The completed trips a worker lists (every worker reads every instance): id to final state.
fn completed(client: &Client, port: u16) -> BTreeMap<String, Value> {
    let url = format!("http://127.0.0.1:{port}/instances?definition=trip-booking&status=completed&limit=1000");
    let Ok(answer) = client.get(url).send().and_then(|r| r.json::<Value>()) else {
        return BTreeMap::new();
    };
    answer["instances"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| (i["id"].as_str().unwrap_or_default().to_string(), i["state"].clone()))
        .collect()
}

/// The trips that ended on the partitions a worker owns: its `sm4c_instances_ended_total`.
fn ended_on(client: &Client, port: u16) -> u64 {
    let text = client
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .and_then(|r| r.text())
        .unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("sm4c_instances_ended_total{") && l.contains("definition=\"trip-booking\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[test]
fn the_demo_runs_sagas_on_two_workers_and_stops_everything_it_started() {
    let began = Instant::now();
    let ports = free_ports(3);
    let (port_a, port_b) = (ports[1], ports[2]);
    let mut demo = Demo::start(&ports);

    // Everything is up once the script prints where the inspector is (a debug build, a fresh broker).
    let out = demo.wait_for("Open the inspector:", Duration::from_secs(180));
    let up = began.elapsed();
    let dir = temp_dir(&out).unwrap_or_else(|| panic!("the script names its temporary directory:\n{out}"));
    let pids = std::fs::read_to_string(dir.join("pids")).expect("the script's pids file");
    demo.started = pids
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(name, pid)| (name.to_string(), pid.trim().parse().expect("a pid")))
        .collect();
    let names: Vec<&str> = demo.started.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["broker", "worker-a", "worker-b", "services"], "{pids}");
    for (name, pid) in &demo.started {
        assert!(alive(*pid), "{name} (pid {pid}) runs:\n{out}");
    }

    // The inspector URLs it printed answer with the page.
    let client = http();
    for port in [port_a, port_b] {
        let url = format!("http://127.0.0.1:{port}/ui");
        assert!(out.contains(&url), "the script prints {url}:\n{out}");
        let page = client.get(&url).send().expect("GET /ui");
        assert_eq!(page.status().as_u16(), 200, "{url}");
        assert!(
            page.text().expect("the page").contains("<html"),
            "{url} is the inspector"
        );
    }

    // Trips complete: started through both workers (odd numbers on a, even on b), decided by both
    // (each owns partitions, as its metrics say), answered by the services, listed alike by both.
    let deadline = Instant::now() + Duration::from_secs(120);
    let trips = loop {
        let on_a = completed(&client, port_a);
        let on_b = completed(&client, port_b);
        let number = |id: &String| id.trim_start_matches("trip-").parse::<u32>().unwrap_or(0);
        let from_a = on_a.keys().filter(|id| number(id) % 2 == 1).count();
        let from_b = on_a.keys().filter(|id| number(id) % 2 == 0).count();
        let booked = on_a.values().filter(|s| *s == "Booked").count();
        let decided = [ended_on(&client, port_a), ended_on(&client, port_b)];
        if from_a >= 3 && from_b >= 3 && booked >= 2 && on_b.len() >= 6 && decided.iter().all(|n| *n > 0) {
            break on_a;
        }
        assert!(
            Instant::now() < deadline,
            "trips did not complete within 120 s: worker a lists {on_a:?}, worker b {on_b:?}; ended on \
             their partitions {decided:?}\n{}",
            demo.output()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let running = began.elapsed();
    let (id, _) = trips.iter().find(|(_, s)| *s == "Booked").expect("a booked trip");
    let trip: Value = client
        .get(format!("http://127.0.0.1:{port_b}/instances/{id}"))
        .send()
        .and_then(|r| r.json())
        .expect("GET /instances/{id}");
    assert_eq!(trip["data"]["outcome"], "booked", "{trip}");
    assert!(
        trip["data"]["flight"]["number"].is_string(),
        "the airline's answer: {trip}"
    );
    assert!(trip["data"]["hotel"]["room"].is_number(), "the hotel's answer: {trip}");
    assert!(
        demo.child.try_wait().expect("try_wait").is_none(),
        "the demo runs until it is stopped:\n{}",
        demo.output()
    );

    // SIGTERM stops the script, and it stops everything it started.
    let stopping = Instant::now();
    signal(demo.child.id(), "SIGTERM");
    let status = loop {
        if let Some(status) = demo.child.try_wait().expect("try_wait") {
            break status;
        }
        assert!(
            stopping.elapsed() < Duration::from_secs(40),
            "scripts/demo.sh did not end within 40 s of SIGTERM:\n{}",
            demo.output()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let stopped = stopping.elapsed();
    assert_eq!(
        status.code(),
        Some(143),
        "exit status after SIGTERM:\n{}",
        demo.output()
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left: Vec<&(String, u32)> = demo.started.iter().filter(|(_, pid)| alive(*pid)).collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still running after the script ended: {left:?}\n{}",
            demo.output()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    for port in &ports {
        assert!(
            TcpStream::connect(("127.0.0.1", *port)).is_err(),
            "nothing listens on port {port} any more"
        );
    }
    assert!(!dir.exists(), "{} is removed", dir.display());
    let out = demo.output();
    assert!(out.contains("demo: stopped everything it started"), "{out}");
    eprintln!(
        "demo: up in {:.1} s, {} trips completed by {:.1} s, stopped in {:.1} s",
        up.as_secs_f64(),
        trips.len(),
        running.as_secs_f64(),
        stopped.as_secs_f64()
    );
}
