//! `sm4c serve` as a child process, for the tests that talk to it: [`Serve`] says how to start it,
//! [`Server`] is the running server. It listens on a port the system picks (`--listen 127.0.0.1:0`)
//! and the harness reads the address from the line the server prints once it is bound
//! (`sm4c: listening on URL`), so no test picks a port that another process could take first. The
//! server is ready once `/healthz` answers 200; it is killed (SIGKILL) when the guard is dropped.
//!
//! The server's stdout and stderr go to one log file (appended to across restarts), which the
//! panics of the harness quote.

// Each test module uses a different part of it.
#![allow(dead_code)]

use reqwest::blocking::Client;
use std::ffi::{OsStr, OsString};
use std::fs::OpenOptions;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use tempfile::TempDir;

/// The `sm4c` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_sm4c");

/// The line `sm4c serve` prints once it listens, before the URL it listens on.
pub const LISTENING: &str = "sm4c: listening on ";

/// How long a server may take to say where it listens and to answer `/healthz` (a bound, not a
/// speed check: the machine may be busy building).
const START_DEADLINE: Duration = Duration::from_secs(60);

/// How long a server may take to stop after SIGTERM.
const STOP_DEADLINE: Duration = Duration::from_secs(30);

/// How to start `sm4c serve`: its arguments (besides `--listen` and, unless given, `--db`), its
/// environment, where its store and log are, and whether it speaks HTTPS.
#[derive(Default)]
pub struct Serve {
    args: Vec<OsString>,
    /// Variables to set (`Some`) or remove (`None`) in the child's environment.
    env: Vec<(OsString, Option<OsString>)>,
    db: Option<PathBuf>,
    log: Option<PathBuf>,
    cwd: Option<PathBuf>,
    /// The CA that signs the server's certificate: the server speaks HTTPS and the client trusts it.
    ca: Option<PathBuf>,
    /// Whether `--db` is left to the arguments (e.g. `--kafka` mode, or a test that passes it).
    no_db: bool,
    /// The timeout of the client's requests.
    timeout: Option<Duration>,
    /// Whether the client opens a connection per request (keeps none idle).
    fresh_connections: bool,
    /// Folders the server uses (definitions, configuration), removed with it.
    keep: Vec<TempDir>,
}

impl Serve {
    /// `sm4c serve` with no other arguments, on a store in a fresh temporary folder.
    pub fn new() -> Serve {
        Serve::default()
    }

    /// Adds an argument.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Serve {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    /// Adds arguments.
    pub fn args<I, S>(mut self, args: I) -> Serve
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args.extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Sets a variable in the server's environment.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Serve {
        self.env
            .push((key.as_ref().to_owned(), Some(value.as_ref().to_owned())));
        self
    }

    /// Removes a variable from the server's environment.
    pub fn env_remove(mut self, key: impl AsRef<OsStr>) -> Serve {
        self.env.push((key.as_ref().to_owned(), None));
        self
    }

    /// The SQLite store (`--db`); by default `sm4c.db` in the server's temporary folder.
    pub fn db(mut self, db: impl Into<PathBuf>) -> Serve {
        self.db = Some(db.into());
        self
    }

    /// No `--db` argument from the harness (Kafka mode, or arguments that carry their own).
    pub fn without_db(mut self) -> Serve {
        self.no_db = true;
        self
    }

    /// The log file (stdout and stderr, appended to); by default `server.log` in the server's
    /// temporary folder.
    pub fn log(mut self, log: impl Into<PathBuf>) -> Serve {
        self.log = Some(log.into());
        self
    }

    /// The server's working directory.
    pub fn current_dir(mut self, dir: impl Into<PathBuf>) -> Serve {
        self.cwd = Some(dir.into());
        self
    }

    /// The server speaks HTTPS with a certificate signed by the CA in `ca` (PEM), which the
    /// client trusts.
    pub fn https(mut self, ca: impl Into<PathBuf>) -> Serve {
        self.ca = Some(ca.into());
        self
    }

    /// The timeout of each request of [`Server::client`] (default 30 s).
    pub fn client_timeout(mut self, timeout: Duration) -> Serve {
        self.timeout = Some(timeout);
        self
    }

    /// The client keeps no idle connection: each request opens its own (so that none holds a slot
    /// of a connection cap).
    pub fn fresh_connections(mut self) -> Serve {
        self.fresh_connections = true;
        self
    }

    /// Keeps `dir` (e.g. the definitions or configuration the arguments name) until the server is
    /// dropped.
    pub fn keep(mut self, dir: TempDir) -> Serve {
        self.keep.push(dir);
        self
    }

    /// Starts the server and waits until it answers `/healthz` with 200; panics, quoting the log,
    /// if it exits first or does not within a bounded time.
    pub fn start(self) -> Server {
        let dir = tempfile::tempdir().expect("a temporary folder for sm4c serve");
        let db = self.db.clone().unwrap_or_else(|| dir.path().join("sm4c.db"));
        let log = self.log.clone().unwrap_or_else(|| dir.path().join("server.log"));
        let client = client(
            self.ca.as_deref(),
            self.timeout.unwrap_or(Duration::from_secs(30)),
            self.fresh_connections,
        );
        let mut server = Server {
            child: None,
            url: String::new(),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            client,
            db,
            log,
            serve: self,
            dir,
        };
        server.spawn();
        server
    }
}

/// The blocking HTTP client of the tests, trusting `ca` when given, keeping no idle connection when
/// `fresh`.
fn client(ca: Option<&Path>, timeout: Duration, fresh: bool) -> Client {
    let mut builder = Client::builder().timeout(timeout);
    if fresh {
        builder = builder.pool_max_idle_per_host(0);
    }
    if let Some(ca) = ca {
        let pem = std::fs::read(ca).unwrap_or_else(|e| panic!("{}: {e}", ca.display()));
        builder = builder.add_root_certificate(reqwest::Certificate::from_pem(&pem).expect("a PEM certificate"));
    }
    builder.build().expect("an HTTP client")
}

/// A running `sm4c serve`, killed (SIGKILL) when dropped.
pub struct Server {
    child: Option<Child>,
    url: String,
    addr: SocketAddr,
    client: Client,
    db: PathBuf,
    log: PathBuf,
    serve: Serve,
    dir: TempDir,
}

impl Server {
    /// The base URL, `http://127.0.0.1:PORT` (or `https://`), as the server reported it.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The address the server is bound to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port the server is bound to.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// A blocking HTTP client for the server (trusting its CA when it speaks HTTPS).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The store file.
    pub fn db(&self) -> &Path {
        &self.db
    }

    /// The server's temporary folder (its store and log unless given).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Everything the server wrote so far (across restarts).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// What matters of the log when something went wrong: the first lines of the first panic,
    /// then the last 4,000 bytes.
    pub fn log_tail(&self) -> String {
        let text = self.log();
        let panic = text
            .find("panicked at")
            .map(|i| {
                let from = text[..i].rfind('\n').map_or(0, |n| n + 1);
                let lines: Vec<&str> = text[from..].lines().take(4).collect();
                format!("[first panic]\n{}\n[...]\n", lines.join("\n"))
            })
            .unwrap_or_default();
        let start = text.len().saturating_sub(4000);
        let start = (start..text.len()).find(|i| text.is_char_boundary(*i)).unwrap_or(0);
        format!("{panic}{}", &text[start..])
    }

    /// The process id of the running server.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the server is running").id()
    }

    /// Whether the server process is still running (it is reaped if it ended).
    pub fn running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => c.try_wait().expect("wait for sm4c serve").is_none(),
            None => false,
        }
    }

    /// The exit status if the server has ended, without waiting.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().expect("wait for sm4c serve"))
    }

    /// kill -9, and reap the process (a crash: nothing is closed cleanly).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends SIGTERM and waits (bounded) for the server to end: its exit status. Panics, quoting
    /// the log, if it does not end.
    pub fn terminate(&mut self) -> ExitStatus {
        let pid = self.pid();
        let ok = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(ok.success(), "kill -TERM {pid}: {ok}");
        self.wait(STOP_DEADLINE)
    }

    /// Waits up to `deadline` for the server to end on its own (or after a signal): its exit
    /// status. Panics, quoting the log, if it does not.
    pub fn wait(&mut self, deadline: Duration) -> ExitStatus {
        let started = Instant::now();
        loop {
            if let Some(status) = self.try_wait() {
                self.child = None;
                return status;
            }
            assert!(
                started.elapsed() < deadline,
                "sm4c serve did not end within {deadline:?}; log:\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts the server again, with the same arguments, on the same store and log (killing it
    /// first if it still runs). It listens on a new port: [`Server::url`] changes.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Starts `sm4c serve`, reads where it listens from the log, waits for `/healthz`.
    fn spawn(&mut self) {
        let from = std::fs::metadata(&self.log).map(|m| m.len()).unwrap_or(0);
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap_or_else(|e| panic!("{}: {e}", self.log.display()));
        let mut cmd = Command::new(BIN);
        cmd.arg("serve").args(["--listen", "127.0.0.1:0"]);
        if !self.serve.no_db {
            cmd.arg("--db").arg(&self.db);
        }
        cmd.args(&self.serve.args);
        for (key, value) in &self.serve.env {
            match value {
                Some(v) => cmd.env(key, v),
                None => cmd.env_remove(key),
            };
        }
        if let Some(dir) = &self.serve.cwd {
            cmd.current_dir(dir);
        }
        cmd.stdin(Stdio::null())
            .stdout(out.try_clone().expect("the log file again"))
            .stderr(out);
        self.child = Some(cmd.spawn().expect("sm4c serve starts"));
        self.url = self.reported_url(from);
        let authority = self
            .url
            .split_once("://")
            .map(|(_, a)| a)
            .unwrap_or_else(|| panic!("sm4c serve reported {:?}, not a URL", self.url));
        self.addr = authority
            .parse()
            .unwrap_or_else(|e| panic!("sm4c serve reported {:?}: {e}", self.url));
        self.wait_healthy();
    }

    /// The URL of the `sm4c: listening on URL` line written after byte `from` of the log.
    fn reported_url(&mut self, from: u64) -> String {
        let started = Instant::now();
        loop {
            let text = std::fs::read(&self.log).unwrap_or_default();
            let new = String::from_utf8_lossy(text.get(from as usize..).unwrap_or_default());
            if let Some(url) = new.lines().find_map(|l| l.strip_prefix(LISTENING)) {
                return url.trim().to_string();
            }
            if let Some(status) = self.try_wait() {
                panic!(
                    "sm4c serve exited with {status} before saying where it listens; log:\n{}",
                    self.log_tail()
                );
            }
            assert!(
                started.elapsed() < START_DEADLINE,
                "sm4c serve did not say where it listens ({LISTENING}URL) within {START_DEADLINE:?}; log:\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_healthy(&mut self) {
        let started = Instant::now();
        let url = format!("{}/healthz", self.url);
        loop {
            let status = self
                .client
                .get(&url)
                .timeout(Duration::from_secs(2))
                .send()
                .map(|r| r.status().as_u16());
            if status.as_ref().is_ok_and(|s| *s == 200) {
                return;
            }
            if let Some(exit) = self.try_wait() {
                panic!(
                    "sm4c serve exited with {exit} before answering /healthz; log:\n{}",
                    self.log_tail()
                );
            }
            assert!(
                started.elapsed() < START_DEADLINE,
                "sm4c serve did not answer /healthz with 200 within {START_DEADLINE:?} (last: {status:?}); log:\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}
