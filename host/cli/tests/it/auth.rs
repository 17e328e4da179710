//! A server you can expose: bearer tokens and their roles, the refusal to listen beyond loopback
//! without authentication, HTTPS and mutual TLS, and the CLI client and the Python worker with a
//! token. Every test runs the real binary and talks real HTTP to it, on loopback only.
//!
//! TLS material: `tests/data/grpc/tls` (a CA, a server certificate for localhost and 127.0.0.1 and
//! a client certificate `CN=sm4c test client`, both signed by it) and `tests/data/auth/stranger.*`,
//! a self-signed certificate with the same names, which nothing trusts.

use crate::support::ansi;
use ansi::strip_ansi;
use reqwest::blocking::{Client, RequestBuilder};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use tempfile::TempDir;

use crate::support::server;
use server::{Serve, Server, BIN};
const DEADLINE: Duration = Duration::from_secs(20);

const ADMIN: &str = "admin-token-0123456789";
const OPERATE: &str = "operate-token-0123456789";
const READ: &str = "read-token-0123456789";

fn tls_data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/grpc/tls")
}

fn stranger() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/auth")
}

/// How a test starts the server.
#[derive(Default)]
struct Setup<'a> {
    /// The configuration file's text, written beside copies of the test TLS files.
    config: Option<&'a str>,
    env: Vec<(&'a str, &'a str)>,
    args: Vec<&'a str>,
    https: bool,
}

/// A tempdir with the configuration file and the TLS files it names relatively.
fn config_dir(config: Option<&str>) -> TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("certs")).unwrap();
    for f in ["ca.pem", "server.pem", "server.key"] {
        std::fs::copy(tls_data().join(f), dir.path().join("certs").join(f)).unwrap();
    }
    if let Some(text) = config {
        std::fs::write(dir.path().join("sm4c.toml"), text).unwrap();
    }
    dir
}

fn serve(setup: Setup) -> Server {
    let dir = config_dir(setup.config);
    let mut serve = Serve::new()
        .db(dir.path().join("sm4c.db"))
        .log(dir.path().join("server.log"))
        .args(&setup.args)
        .env_remove("SM4C_TOKEN_ADMIN")
        .env_remove("SM4C_TOKEN_OPERATE")
        .env_remove("SM4C_TOKEN_READ");
    for (k, v) in &setup.env {
        serve = serve.env(k, v);
    }
    if setup.config.is_some() {
        serve = serve.arg("--config").arg(dir.path().join("sm4c.toml"));
    }
    if setup.https {
        serve = serve.https(tls_data().join("ca.pem"));
    }
    serve.keep(dir).start()
}

/// Tokens of the three roles from the configuration file (one of them through `env:`).
const TOKENS: &str = r#"
[server]
tokens = [
  { role = "admin", token = "admin-token-0123456789" },
  { role = "operate", token = "env:SM4C_TEST_OPERATE" },
  { role = "read", token = "read-token-0123456789" },
]
"#;

fn with_tokens() -> Server {
    serve(Setup {
        config: Some(TOKENS),
        env: vec![("SM4C_TEST_OPERATE", OPERATE)],
        ..Setup::default()
    })
}

/// What these tests ask of a server.
trait Api {
    fn stderr(&self) -> String;
    fn request(&self, method: &str, path: &str, token: Option<&str>) -> RequestBuilder;
}

impl Api for Server {
    fn stderr(&self) -> String {
        self.log()
    }

    fn request(&self, method: &str, path: &str, token: Option<&str>) -> RequestBuilder {
        let url = format!("{}{path}", self.url());
        let r = match method {
            "GET" => self.client().get(url),
            _ => self.client().post(url),
        };
        match token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }
}

fn answer(req: RequestBuilder) -> (u16, Value, reqwest::header::HeaderMap) {
    let resp = req.send().expect("request answered");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let text = resp.text().expect("body");
    (status, serde_json::from_str(&text).unwrap_or(Value::Null), headers)
}

fn waiter() -> Value {
    json!({
        "id": "waiter", "name": "Waiter", "version": "1",
        "events": [{"name": "go", "type": "com.example.go", "source": "test"}],
        "states": [
            {"name": "Wait", "start": true, "transitions": [{"nextState": "Done", "eventGroups": [{"events": ["go"]}]}]},
            {"name": "Done"}
        ]
    })
}

fn event() -> Value {
    json!({"specversion": "1.0", "id": "e1", "type": "com.example.nothing", "source": "test", "data": {}})
}

fn assert_refused(status: u16, body: &Value, headers: &reqwest::header::HeaderMap, want: u16, what: &str) {
    assert_eq!(status, want, "{what}: {body}");
    let code = if want == 401 { "unauthorized" } else { "forbidden" };
    assert_eq!(body["error"], json!(code), "{what}: {body}");
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{what}: {body}"
    );
    if want == 401 {
        assert!(
            headers
                .get("www-authenticate")
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("Bearer")),
            "{what}: 401 without WWW-Authenticate: Bearer: {headers:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Tokens and roles
// ---------------------------------------------------------------------------------------------

#[test]
fn no_token_and_a_wrong_token_are_401_and_the_open_endpoints_stay_open() {
    let s = with_tokens();
    for (what, req) in [
        ("no token", s.request("GET", "/instances", None)),
        ("wrong token", s.request("GET", "/instances", Some("not-a-token"))),
        (
            "a token differing in case",
            s.request("GET", "/instances", Some(&ADMIN.to_uppercase())),
        ),
        (
            "empty bearer",
            s.request("GET", "/instances", None).header("authorization", "Bearer "),
        ),
        (
            "basic credentials",
            s.request("GET", "/instances", None)
                .header("authorization", format!("Basic {ADMIN}")),
        ),
        ("unknown route", s.request("GET", "/nothing-here", None)),
        (
            "POST without a token",
            s.request("POST", "/definitions", None).json(&waiter()),
        ),
    ] {
        let (status, body, headers) = answer(req);
        assert_refused(status, &body, &headers, 401, what);
        assert!(!body.to_string().contains(ADMIN), "a token is never quoted: {body}");
    }
    for path in ["/healthz", "/openapi.json"] {
        let (status, body, _) = answer(s.request("GET", path, None));
        assert_eq!(status, 200, "{path} is open: {body}");
        if path == "/openapi.json" {
            assert_eq!(body["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
            assert_eq!(body["paths"]["/healthz"]["get"]["security"], json!([{}]));
        }
    }
    let (status, body, _) = answer(s.request("GET", "/instances", Some(READ)));
    assert_eq!(status, 200, "{body}");
    let log = s.stderr();
    for t in [ADMIN, OPERATE, READ, "not-a-token"] {
        assert!(!log.contains(t), "the log never quotes a token:\n{log}");
    }
}

/// Every endpoint with no token and each role: the status expected (401 and 403 with the error
/// body, else what the endpoint answers when allowed).
#[test]
fn each_role_against_each_endpoint() {
    let s = with_tokens();
    let (status, body, _) = answer(s.request("POST", "/definitions", Some(ADMIN)).json(&waiter()));
    assert_eq!(status, 201, "{body}");
    for who in ["admin", "operate", "read", "none"] {
        let (status, body, _) = answer(
            s.request("POST", "/instances", Some(ADMIN))
                .json(&json!({"definition": "waiter", "id": format!("c-{who}")})),
        );
        assert_eq!(status, 201, "{body}");
    }
    // (method, path, body, expected status for none, read, operate, admin)
    type Row = (&'static str, String, Option<Value>, [u16; 4]);
    let per_role = |who: &str| -> Vec<Row> {
        vec![
            ("GET", "/healthz".into(), None, [200, 200, 200, 200]),
            ("GET", "/openapi.json".into(), None, [200, 200, 200, 200]),
            ("GET", "/definitions".into(), None, [401, 200, 200, 200]),
            ("GET", "/definitions/waiter".into(), None, [401, 200, 200, 200]),
            (
                "POST",
                "/definitions".into(),
                Some(
                    json!({"id": format!("d-{who}"), "name": "D", "version": "1", "states": [{"name": "S", "start": true}]}),
                ),
                [401, 403, 403, 201],
            ),
            ("GET", "/instances".into(), None, [401, 200, 200, 200]),
            (
                "POST",
                "/instances".into(),
                Some(json!({"definition": "waiter", "id": format!("s-{who}")})),
                [401, 403, 201, 201],
            ),
            ("GET", "/instances/c-admin".into(), None, [401, 200, 200, 200]),
            ("GET", "/instances/c-admin/history".into(), None, [401, 200, 200, 200]),
            (
                "POST",
                format!("/instances/c-{who}/cancel"),
                Some(json!({})),
                [401, 403, 200, 200],
            ),
            ("POST", "/events".into(), Some(event()), [401, 403, 202, 202]),
            ("POST", "/events/explain".into(), Some(event()), [401, 200, 200, 200]),
            ("GET", "/events/sent".into(), None, [401, 200, 200, 200]),
            ("GET", "/tasklists".into(), None, [401, 200, 200, 200]),
            (
                "POST",
                "/tasklists/images/poll?wait=0s".into(),
                None,
                [401, 403, 204, 204],
            ),
            (
                "POST",
                "/tasks/no-such-token/complete".into(),
                Some(json!({})),
                [401, 403, 404, 404],
            ),
            (
                "POST",
                "/tasks/no-such-token/fail".into(),
                Some(json!({})),
                [401, 403, 404, 404],
            ),
            (
                "POST",
                "/tasks/no-such-token/heartbeat".into(),
                Some(json!({})),
                [401, 403, 404, 404],
            ),
            ("GET", "/no-such-endpoint".into(), None, [401, 404, 404, 404]),
        ]
    };
    let mut checked = 0;
    for (i, (who, token)) in [
        ("none", None),
        ("read", Some(READ)),
        ("operate", Some(OPERATE)),
        ("admin", Some(ADMIN)),
    ]
    .into_iter()
    .enumerate()
    {
        for (method, path, body, want) in per_role(who) {
            let mut req = s.request(method, &path, token);
            if let Some(b) = &body {
                req = if path.starts_with("/events") {
                    req.header("content-type", "application/cloudevents+json")
                        .body(b.to_string())
                } else {
                    req.json(b)
                };
            }
            let (status, got, headers) = answer(req);
            let what = format!("{method} {path} as {who}");
            match want[i] {
                w @ (401 | 403) => assert_refused(status, &got, &headers, w, &what),
                w => assert_eq!(status, w, "{what}: {got}"),
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 19 * 4);
}

#[test]
fn tokens_from_the_environment_with_lists() {
    let s = serve(Setup {
        env: vec![
            ("SM4C_TOKEN_ADMIN", "env-admin"),
            ("SM4C_TOKEN_OPERATE", " worker-1 , worker-2,"),
        ],
        ..Setup::default()
    });
    let (status, body, _) = answer(s.request("POST", "/definitions", Some("env-admin")).json(&waiter()));
    assert_eq!(status, 201, "{body}");
    for t in ["worker-1", "worker-2"] {
        let (status, body, _) = answer(s.request("POST", "/tasklists/x/poll?wait=0s", Some(t)));
        assert_eq!(status, 204, "{t}: {body}");
        let (status, body, headers) = answer(s.request("POST", "/definitions", Some(t)).json(&waiter()));
        assert_refused(status, &body, &headers, 403, t);
    }
    let (status, body, headers) = answer(s.request("GET", "/instances", Some("")));
    assert_refused(status, &body, &headers, 401, "an empty list item is no token");
}

#[test]
fn server_section_errors_name_the_file_line_and_key() {
    let config = "[server]\ntokens = [\n  { role = \"root\", token = \"s3cret-value\" },\n  { role = \"read\", token = \"env:SM4C_TEST_UNSET_TOKEN\" },\n]\n\n[server.tls]\ncert = \"certs/server.pem\"\nclients = { \"ops\" = \"operate\" }\n";
    let dir = config_dir(Some(config));
    let toml = dir.path().join("sm4c.toml");
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--db"])
        .arg(dir.path().join("sm4c.db"))
        .arg("--config")
        .arg(&toml)
        .env_remove("SM4C_TEST_UNSET_TOKEN")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let file = toml.display().to_string();
    for want in [
        format!("{file}: line 3: server.tokens[0].role: \"root\" is not a role"),
        format!("{file}: line 4: server.tokens[1].token: environment variable SM4C_TEST_UNSET_TOKEN is not set"),
        format!("{file}: line 8: server.tls: TLS needs both cert and key"),
        format!("{file}: line 9: server.tls.clients.ops: a client is named by its certificate's subject common name"),
        "server.tls.clients: client certificates need client_ca".to_string(),
    ] {
        assert!(err.contains(&want), "missing {want:?} in:\n{err}");
    }
    assert!(!err.contains("s3cret-value"), "{err}");
    // Unknown keys are refused.
    std::fs::write(&toml, "[server]\ntoken = \"x\"\n").unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--db"])
        .arg(dir.path().join("sm4c.db"))
        .arg("--config")
        .arg(&toml)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("line 2: unknown field `token`"), "{err}");
    assert!(!dir.path().join("sm4c.db").exists(), "nothing was started");
}

// ---------------------------------------------------------------------------------------------
// Listening beyond loopback
// ---------------------------------------------------------------------------------------------

/// Runs `sm4c serve` on `listen` until its log says it serves (returning the port) or it exits.
fn try_listen(listen: &str, extra: &[&str], env: &[(&str, &str)]) -> Result<u16, (Option<i32>, String)> {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", listen, "--db"])
        .arg(dir.path().join("sm4c.db"))
        .args(extra)
        .env_remove("SM4C_TOKEN_ADMIN")
        .env_remove("SM4C_TOKEN_OPERATE")
        .env_remove("SM4C_TOKEN_READ")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let result = loop {
        let text = strip_ansi(&std::fs::read_to_string(&log).unwrap_or_default());
        if let Some(port) = text.lines().find(|l| l.contains("sm4c serving")).and_then(|line| {
            let at = line.find("listen=")? + "listen=".len();
            let addr: String = line[at..].chars().take_while(|c| !c.is_whitespace()).collect();
            let addr = addr.trim_end_matches(|c: char| !c.is_ascii_digit());
            addr.rsplit_once(':')?.1.parse::<u16>().ok()
        }) {
            break Ok(port);
        }
        if let Some(status) = child.try_wait().unwrap() {
            break Err((status.code(), std::fs::read_to_string(&log).unwrap_or_default()));
        }
        assert!(started.elapsed() < DEADLINE, "neither serving nor exited:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    };
    if let Ok(port) = result {
        // It answers on loopback (0.0.0.0 includes it); nothing is sent anywhere else.
        let host = match listen.rsplit_once(':').map(|(h, _)| h) {
            Some("0.0.0.0") | None => "127.0.0.1",
            Some(h) => h,
        };
        let r = reqwest::blocking::get(format!("http://{host}:{port}/healthz")).expect("healthz");
        assert_eq!(r.status(), 200);
    }
    let _ = child.kill();
    let _ = child.wait();
    result
}

#[test]
fn listening_beyond_loopback_needs_authentication_or_the_unsafe_flag() {
    let (code, err) = try_listen("0.0.0.0:0", &[], &[]).expect_err("refused");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("refusing to listen on 0.0.0.0:0 without authentication") && err.contains("--insecure-no-auth"),
        "{err}"
    );
    let (code, err) = try_listen("[::]:0", &[], &[]).expect_err("refused");
    assert_eq!(code, Some(2), "{err}");
    try_listen("0.0.0.0:0", &["--insecure-no-auth"], &[]).expect("the unsafe flag allows it");
    // A token over plain HTTP beyond loopback travels in clear text: refused unless asked for.
    let (code, err) = try_listen("0.0.0.0:0", &[], &[("SM4C_TOKEN_READ", "r")]).expect_err("refused");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("refusing to accept bearer tokens over plain HTTP on 0.0.0.0:0")
            && err.contains("--insecure-plain-http"),
        "{err}"
    );
    try_listen("0.0.0.0:0", &["--insecure-plain-http"], &[("SM4C_TOKEN_READ", "r")])
        .expect("a token and the flag allow it");
    try_listen("127.0.0.1:0", &[], &[("SM4C_TOKEN_READ", "r")]).expect("tokens over loopback stay on the machine");
    try_listen("localhost:0", &[], &[]).expect("localhost is loopback");
    try_listen("127.0.0.2:0", &[], &[]).expect("127.0.0.0/8 is loopback");
}

/// `sm4c serve --kafka` with tokens, refused before it connects to anything (the broker address
/// is a closed port): its workers need a peer token of their own to forward requests to each
/// other, and a bad one is named by where it came from, never quoted.
fn kafka_start(env: &[(&str, &str)], config: Option<&Path>) -> (Option<i32>, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--kafka", "127.0.0.1:1", "--listen", "127.0.0.1:0"])
        .env_remove("SM4C_TOKEN_ADMIN")
        .env_remove("SM4C_TOKEN_OPERATE")
        .env_remove("SM4C_TOKEN_READ")
        .env_remove("SM4C_PEER_TOKEN")
        .envs(env.iter().copied());
    if let Some(c) = config {
        cmd.arg("--config").arg(c);
    }
    let out = cmd.output().expect("runs");
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn kafka_mode_with_tokens_needs_a_peer_token_and_names_a_bad_one() {
    let (code, err) = kafka_start(&[("SM4C_TOKEN_READ", READ)], None);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("Kafka mode with authentication needs a peer token")
            && err.contains("SM4C_PEER_TOKEN")
            && err.contains("[server] peer_token"),
        "{err}"
    );
    let (code, err) = kafka_start(&[("SM4C_TOKEN_READ", READ), ("SM4C_PEER_TOKEN", "tiny-s3cret")], None);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("SM4C_PEER_TOKEN: the peer token has 11 characters: use at least 16"),
        "{err}"
    );
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sm4c.toml");
    std::fs::write(
        &config,
        format!("[server]\ntokens = [{{ role = \"read\", token = \"{READ}\" }}]\npeer_token = \"short s3cret\"\n"),
    )
    .unwrap();
    let (code, err) = kafka_start(&[], Some(&config));
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("sm4c.toml: server.peer_token: a peer token is printable ASCII without spaces"),
        "{err}"
    );
    assert!(!err.contains("s3cret"), "a peer token quoted: {err}");
}

// ---------------------------------------------------------------------------------------------
// TLS
// ---------------------------------------------------------------------------------------------

const TLS: &str = r#"
[server]
tokens = [{ role = "read", token = "read-token-0123456789" }]

[server.tls]
cert = "certs/server.pem"
key = "certs/server.key"
"#;

#[test]
fn https_with_a_trusted_and_an_untrusted_certificate() {
    let s = serve(Setup {
        config: Some(TLS),
        https: true,
        ..Setup::default()
    });
    let (status, body, _) = answer(s.request("GET", "/instances", Some(READ)));
    assert_eq!(status, 200, "trusted through the CA: {body}");
    // A client that does not trust the test CA refuses the server.
    let plain = Client::builder().build().unwrap();
    let e = plain
        .get(format!("{}/healthz", s.url()))
        .send()
        .expect_err("untrusted certificate");
    assert!(format!("{e:?}").contains("UnknownIssuer"), "{e:?}");
    // So does one that trusts another certificate only.
    let other = std::fs::read(stranger().join("stranger.pem")).unwrap();
    let c = Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&other).unwrap())
        .build()
        .unwrap();
    assert!(c.get(format!("{}/healthz", s.url())).send().is_err());
    // Plain HTTP to the HTTPS port gets no answer.
    let http = s.url().replace("https://", "http://");
    assert!(Client::new().get(format!("{http}/healthz")).send().is_err());
}

const MTLS: &str = r#"
[server]
tokens = [{ role = "read", token = "read-token-0123456789" }]

[server.tls]
cert = "certs/server.pem"
key = "certs/server.key"
client_ca = "certs/ca.pem"
clients = { "CN=sm4c test client" = "operate" }
"#;

fn identity(pem: &Path, key: &Path) -> reqwest::Identity {
    let mut both = std::fs::read(pem).unwrap();
    both.extend(std::fs::read(key).unwrap());
    reqwest::Identity::from_pem(&both).unwrap()
}

#[test]
fn mutual_tls_maps_a_client_certificate_to_its_role() {
    let s = serve(Setup {
        config: Some(MTLS),
        https: true,
        ..Setup::default()
    });
    let ca = std::fs::read(tls_data().join("ca.pem")).unwrap();
    let with_cert = |pem: &Path, key: &Path| {
        Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
            .identity(identity(pem, key))
            .build()
            .unwrap()
    };
    let client = with_cert(&tls_data().join("client.pem"), &tls_data().join("client.key"));
    // The certificate's role: operate.
    let (status, body, _) = answer(client.post(format!("{}/tasklists/x/poll?wait=0s", s.url())));
    assert_eq!(status, 204, "{body}");
    let (status, body, _) = answer(client.get(format!("{}/instances", s.url())));
    assert_eq!(status, 200, "{body}");
    let (status, body, headers) = answer(client.post(format!("{}/definitions", s.url())).json(&waiter()));
    assert_refused(status, &body, &headers, 403, "operate registering a definition");
    // A bearer token, when sent, decides instead of the certificate.
    let (status, body, headers) = answer(
        client
            .post(format!("{}/tasklists/x/poll?wait=0s", s.url()))
            .bearer_auth(READ),
    );
    assert_refused(
        status,
        &body,
        &headers,
        403,
        "the read token over the operate certificate",
    );
    // Without a client certificate: a token, or 401.
    let (status, body, headers) = answer(s.request("GET", "/instances", None));
    assert_refused(status, &body, &headers, 401, "no certificate, no token");
    let (status, body, _) = answer(s.request("GET", "/instances", Some(READ)));
    assert_eq!(status, 200, "{body}");
    // A certificate with the same name that the client CA did not sign: the handshake fails.
    let stranger = with_cert(&stranger().join("stranger.pem"), &stranger().join("stranger.key"));
    assert!(stranger.get(format!("{}/instances", s.url())).send().is_err());
    // The CLI client with --cert and --key.
    let (ca, cert, key) = (
        tls_data().join("ca.pem"),
        tls_data().join("client.pem"),
        tls_data().join("client.key"),
    );
    let (ca, cert, key) = (ca.to_str().unwrap(), cert.to_str().unwrap(), key.to_str().unwrap());
    let out = sm4c(
        &["tasks", "--server", s.url(), "--ca", ca, "--cert", cert, "--key", key],
        &[],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = sm4c(&["tasks", "--server", s.url(), "--ca", ca], &[]);
    assert_eq!(out.status.code(), Some(1), "no certificate, no token");
    let out = sm4c(&["tasks", "--server", s.url(), "--ca", ca, "--cert", cert], &[]);
    assert_eq!(out.status.code(), Some(2), "--cert needs --key");
    let out = sm4c(
        &["tasks", "--server", s.url(), "--ca", ca, "--cert", ca, "--key", ca],
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a PEM certificate and key"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_verified_client_certificate_without_a_role_is_401() {
    let config = MTLS.replace("CN=sm4c test client", "CN=someone else");
    let s = serve(Setup {
        config: Some(&config),
        https: true,
        ..Setup::default()
    });
    let ca = std::fs::read(tls_data().join("ca.pem")).unwrap();
    let client = Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .identity(identity(&tls_data().join("client.pem"), &tls_data().join("client.key")))
        .build()
        .unwrap();
    let (status, body, headers) = answer(client.get(format!("{}/instances", s.url())));
    assert_refused(status, &body, &headers, 401, "an unmapped certificate");
    assert!(
        body["message"].as_str().unwrap().contains("CN=sm4c test client"),
        "{body}"
    );
}

#[test]
fn bad_tls_files_are_refused_at_start() {
    let dir = config_dir(Some(
        "[server.tls]\ncert = \"certs/server.pem\"\nkey = \"certs/ca.pem\"\n[server]\ntokens = [{ role = \"read\", token = \"t\" }]\n",
    ));
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--db"])
        .arg(dir.path().join("sm4c.db"))
        .arg("--config")
        .arg(dir.path().join("sm4c.toml"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("sm4c.toml: server.tls: the key is not a PEM private key"),
        "{err}"
    );
    std::fs::write(
        dir.path().join("sm4c.toml"),
        "[server.tls]\ncert = \"certs/missing.pem\"\nkey = \"certs/server.key\"\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--db"])
        .arg(dir.path().join("sm4c.db"))
        .arg("--config")
        .arg(dir.path().join("sm4c.toml"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("line 2: server.tls.cert: cannot read server certificate"),
        "{err}"
    );
}

// ---------------------------------------------------------------------------------------------
// Clients: the CLI and the Python worker
// ---------------------------------------------------------------------------------------------

fn sm4c(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("SM4C_TOKEN")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("sm4c runs")
}

#[test]
fn the_cli_client_with_a_token_and_a_ca() {
    let tokens = TOKENS.replace("env:SM4C_TEST_OPERATE", OPERATE);
    let config = format!("{tokens}\n[server.tls]\ncert = \"certs/server.pem\"\nkey = \"certs/server.key\"\n");
    let s = serve(Setup {
        config: Some(&config),
        https: true,
        ..Setup::default()
    });
    let (status, body, _) = answer(s.request("POST", "/definitions", Some(ADMIN)).json(&waiter()));
    assert_eq!(status, 201, "{body}");
    let ca = tls_data().join("ca.pem");
    let ca = ca.to_str().unwrap();
    let token_file = s.dir().join("token");
    std::fs::write(&token_file, format!("{OPERATE}\n")).unwrap();
    let token_file = token_file.to_str().unwrap();

    let out = sm4c(
        &[
            "start",
            "waiter",
            "--id",
            "w1",
            "--server",
            s.url(),
            "--ca",
            ca,
            "--token",
            OPERATE,
        ],
        &[],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "started w1\n");
    let out = sm4c(
        &[
            "show",
            "w1",
            "--json",
            "--server",
            s.url(),
            "--ca",
            ca,
            "--token-file",
            token_file,
        ],
        &[],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"], "waiting", "{v}");
    let out = sm4c(
        &["cancel", "w1", "--server", s.url(), "--ca", ca],
        &[("SM4C_TOKEN", OPERATE)],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The read role lists but does not cancel.
    let out = sm4c(&["list", "--server", s.url(), "--ca", ca], &[("SM4C_TOKEN", READ)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("w1"));
    let out = sm4c(
        &["cancel", "w1", "--server", s.url(), "--ca", ca],
        &[("SM4C_TOKEN", READ)],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("forbidden (403): the read role does not allow this request; it needs operate"),
        "{err}"
    );
    // No token, a wrong one.
    let out = sm4c(&["list", "--server", s.url(), "--ca", ca], &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unauthorized (401)") && err.contains("--token-file"),
        "{err}"
    );
    let out = sm4c(&["list", "--server", s.url(), "--ca", ca, "--token", "wrong"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unauthorized (401): the bearer token is not valid"));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("wrong"));
    // Without --ca the server's certificate is not trusted.
    let out = sm4c(&["list", "--server", s.url(), "--token", READ], &[]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot reach") && err.contains("certificate"), "{err}");
    // A --ca that is not PEM, a missing --token-file.
    let out = sm4c(&["list", "--server", s.url(), "--ca", token_file], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a PEM file of certificates"));
    let out = sm4c(
        &[
            "list",
            "--server",
            s.url(),
            "--ca",
            ca,
            "--token-file",
            "/nonexistent/token",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--token-file /nonexistent/token: cannot read"));
}

#[test]
fn the_python_sample_worker_sends_its_token_over_https() {
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../samples/word-count-worker");
    let config = format!("{TOKENS}\n[server.tls]\ncert = \"certs/server.pem\"\nkey = \"certs/server.key\"\n");
    let s = serve(Setup {
        config: Some(&config),
        env: vec![("SM4C_TEST_OPERATE", OPERATE)],
        https: true,
        ..Setup::default()
    });
    let ca = tls_data().join("ca.pem");
    let definition: Value =
        serde_json::from_str(&std::fs::read_to_string(sample.join("definition.json")).unwrap()).unwrap();
    let (status, body, _) = answer(s.request("POST", "/definitions", Some(ADMIN)).json(&definition));
    assert_eq!(status, 201, "{body}");
    let input: Value = serde_json::from_str(&std::fs::read_to_string(sample.join("input.json")).unwrap()).unwrap();
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(sample.join("expected.json")).unwrap()).unwrap();
    let tasks = input["documents"].as_array().unwrap().len().to_string();
    let (status, body, _) = answer(
        s.request("POST", "/instances", Some(OPERATE))
            .json(&json!({"definition": "word-count", "id": "wc1", "input": input})),
    );
    assert_eq!(status, 201, "{body}");
    let worker = |token: Option<&str>| {
        let mut cmd = Command::new("python3");
        cmd.arg(sample.join("worker.py"))
            .args(["--server", s.url(), "--wait", "5", "--max-tasks", &tasks])
            .arg("--ca")
            .arg(&ca)
            .env_remove("SM4C_TOKEN");
        if let Some(t) = token {
            cmd.env("SM4C_TOKEN", t);
        }
        cmd.output().expect("python3 runs (it is needed for this test)")
    };
    let out = worker(Some(READ));
    assert_eq!(out.status.code(), Some(2), "a read token cannot poll");
    assert!(String::from_utf8_lossy(&out.stderr).contains("poll: 403"));
    let out = worker(Some(OPERATE));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let started = Instant::now();
    loop {
        let (status, inst, _) = answer(s.request("GET", "/instances/wc1", Some(READ)));
        assert_eq!(status, 200);
        if inst["status"] == "completed" {
            assert_eq!(inst["data"], expected);
            break;
        }
        assert!(started.elapsed() < DEADLINE, "{inst}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
