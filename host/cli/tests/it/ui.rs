//! The web inspector as `sm4c serve` serves it: its assets built into the binary, the routes only
//! it uses, its server-sent events and how they sit with authentication. The real binary, on
//! loopback, one server and one fresh store per test. (The page itself is tested in a real browser
//! by host/api/ui/test/inspector.mjs, which scripts/test.sh runs.)

use reqwest::blocking::Client;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::support::server;
use server::{Serve, Server};
const DEADLINE: Duration = Duration::from_secs(20);
const READ: &str = "read-token-0123456789";
const OPERATE: &str = "operate-token-0123456789";

/// Waits for `paid` (correlated on `.orderId`) for an hour, then ships.
fn order() -> Value {
    serde_json::from_str(include_str!("../../../api/ui/test/order.json")).expect("order.json")
}

/// `sm4c serve` on a fresh store; with `config` as its configuration file when given.
fn serve(config: Option<&str>) -> Server {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut serve = Serve::new()
        .db(dir.path().join("sm4c.db"))
        .log(dir.path().join("server.log"));
    if let Some(text) = config {
        std::fs::write(dir.path().join("sm4c.toml"), text).expect("config");
        serve = serve.arg("--config").arg(dir.path().join("sm4c.toml"));
    }
    serve.keep(dir).start()
}

/// What these tests ask of a server.
trait Api {
    fn send(&self, req: reqwest::blocking::RequestBuilder, token: Option<&str>) -> (u16, Value);
    fn get(&self, path: &str, token: Option<&str>) -> (u16, Value);
    fn post(&self, path: &str, body: &Value, token: Option<&str>) -> (u16, Value);
    fn events(&self, token: Option<&str>) -> mpsc::Receiver<(String, String)>;
}

impl Api for Server {
    fn send(&self, req: reqwest::blocking::RequestBuilder, token: Option<&str>) -> (u16, Value) {
        let req = match token {
            Some(t) => req.bearer_auth(t),
            None => req,
        };
        let resp = req.send().expect("answered");
        let status = resp.status().as_u16();
        (
            status,
            serde_json::from_str(&resp.text().expect("body")).unwrap_or(Value::Null),
        )
    }

    fn get(&self, path: &str, token: Option<&str>) -> (u16, Value) {
        self.send(self.client().get(format!("{}{path}", self.url())), token)
    }

    fn post(&self, path: &str, body: &Value, token: Option<&str>) -> (u16, Value) {
        self.send(self.client().post(format!("{}{path}", self.url())).json(body), token)
    }

    /// Reads `/ui/events` on a thread: each SSE event as (name, data), in order.
    fn events(&self, token: Option<&str>) -> mpsc::Receiver<(String, String)> {
        let mut req = Client::builder()
            .build()
            .expect("client")
            .get(format!("{}/ui/events", self.url()));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().expect("the event stream opens");
        assert_eq!(resp.status(), 200);
        assert_eq!(
            resp.headers()["content-type"].to_str().unwrap_or(""),
            "text/event-stream"
        );
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let (mut name, mut data) = (String::new(), String::new());
            for line in BufReader::new(resp).lines() {
                let Ok(line) = line else { return };
                if let Some(n) = line.strip_prefix("event:") {
                    name = n.trim().to_string();
                } else if let Some(d) = line.strip_prefix("data:") {
                    data += d.trim_start();
                } else if line.is_empty()
                    && !name.is_empty()
                    && tx.send((std::mem::take(&mut name), std::mem::take(&mut data))).is_err()
                {
                    return;
                }
            }
        });
        rx
    }
}

/// The next SSE event named `name` whose data satisfies `want`, within the deadline.
fn next_event(rx: &mpsc::Receiver<(String, String)>, name: &str, want: impl Fn(&Value) -> bool) -> Value {
    let started = Instant::now();
    loop {
        let left = DEADLINE.saturating_sub(started.elapsed());
        let (n, data) = rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("no {name:?} event within {DEADLINE:?}"));
        let v: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
        if n == name && want(&v) {
            return v;
        }
    }
}

#[test]
fn the_assets_are_built_in_and_name_each_other() {
    let s = serve(None);
    for (path, ty, has) in [
        ("/ui", "text/html", "/ui/app.js"),
        ("/ui/", "text/html", "/ui/app.css"),
        ("/ui/app.js", "text/javascript", "/ui/events"),
        ("/ui/app.css", "text/css", "svg.diagram"),
    ] {
        let r = s.client().get(format!("{}{path}", s.url())).send().expect("answered");
        assert_eq!(r.status(), 200, "{path}");
        assert!(
            r.headers()["content-type"].to_str().unwrap_or("").starts_with(ty),
            "{path}"
        );
        assert!(r.text().expect("body").contains(has), "{path} names {has}");
    }
    let (code, body) = s.get("/ui/nothing.js", None);
    assert_eq!(code, 404, "{body}");
}

#[test]
fn an_instance_page_has_its_diagram_what_it_waits_on_and_its_steps() {
    let s = serve(None);
    assert_eq!(s.post("/definitions", &order(), None).0, 201);
    let (code, _) = s.post(
        "/instances",
        &json!({"definition": "order", "id": "o-1", "input": {"orderId": "A1"}}),
        None,
    );
    assert_eq!(code, 201);
    let started = Instant::now();
    let v = loop {
        let (code, v) = s.get("/ui/api/instance?id=o-1", None);
        assert_eq!(code, 200, "{v}");
        if v["instance"]["status"] == "waiting" {
            break v;
        }
        assert!(started.elapsed() < DEADLINE, "{v}");
        std::thread::sleep(Duration::from_millis(25));
    };
    let svg = v["diagram"].as_str().expect("an SVG diagram");
    assert!(
        svg.contains(r#"class="state visited current" data-state="AwaitPayment""#),
        "{svg}"
    );
    assert!(svg.contains(r#"class="state visited" data-state="Received""#), "{svg}");
    assert!(svg.contains(r#"class="state" data-state="Ship""#), "{svg}");
    assert!(
        svg.contains(r#"class="edge fired" data-from="Received" data-to="AwaitPayment""#),
        "{svg}"
    );
    let w = &v["waiting"];
    assert_eq!(w["events"][0]["event"], "paid");
    assert_eq!(w["events"][0]["next"], "Ship");
    assert_eq!(
        w["events"][0]["correlation"],
        json!([{"attribute": "orderid", "value": "A1", "from": "data"}])
    );
    assert_eq!(w["timers"][0]["kind"], "state timeout");
    assert_eq!(w["timers"][0]["next"], "Expired");
    assert_eq!(v["steps"][0]["input"]["input"], "start");
    assert_eq!(v["steps"][0]["data"], json!({"orderId": "A1", "step": "received"}));

    let (code, d) = s.get("/ui/api/definition?id=order", None);
    assert_eq!(code, 200, "{d}");
    assert!(d["diagram"].as_str().unwrap_or("").contains(r#"data-state="Expired""#));
    assert_eq!(d["definition"]["id"], "order");
    assert_eq!(s.get("/ui/api/instance?id=nobody", None).0, 404);
    assert_eq!(s.get("/ui/api/definition?id=order&version=9", None).0, 400);
}

#[test]
fn the_event_stream_says_hello_then_names_what_changed() {
    let s = serve(None);
    assert_eq!(s.post("/definitions", &order(), None).0, 201);
    let rx = s.events(None);
    next_event(&rx, "hello", |_| true);
    s.post(
        "/instances",
        &json!({"definition": "order", "id": "o-2", "input": {"orderId": "B2"}}),
        None,
    );
    next_event(&rx, "changes", |v| {
        v.as_array()
            .is_some_and(|l| l.iter().any(|c| c["id"] == "o-2" && c["status"] == "waiting"))
    });
    let event = json!({"specversion": "1.0", "id": "e-1", "type": "com.example.paid", "source": "shop",
                       "orderid": "B2", "data": {"amount": 3}});
    let (code, body) = s.send(
        s.client()
            .post(format!("{}/events", s.url()))
            .header("content-type", "application/cloudevents+json")
            .body(event.to_string()),
        None,
    );
    assert_eq!(code, 202, "{body}");
    let change = next_event(&rx, "changes", |v| {
        v.as_array()
            .is_some_and(|l| l.iter().any(|c| c["id"] == "o-2" && c["status"] == "completed"))
    });
    assert_eq!(change[0]["definition"], "order");
    assert_eq!(change[0]["state"], "Done");
}

#[test]
fn with_tokens_the_page_is_open_and_its_data_is_not() {
    let s = serve(Some(&format!(
        "[server]\ntokens = [\n  {{ role = \"read\", token = \"{READ}\" }},\n  {{ role = \"operate\", token = \"{OPERATE}\" }},\n]\n"
    )));
    let page = s.client().get(format!("{}/ui", s.url())).send().expect("answered");
    assert_eq!(page.status(), 200);
    for path in ["/ui/api/instance?id=x", "/ui/api/definition?id=x", "/ui/events"] {
        let (code, body) = s.get(path, None);
        assert_eq!(code, 401, "{path}: {body}");
    }
    assert_eq!(s.get("/ui/api/definition?id=x", Some(READ)).0, 404);
    let rx = s.events(Some(READ));
    next_event(&rx, "hello", |_| true);
}

#[test]
fn the_search_filters_by_version_state_start_time_and_a_condition_on_the_data() {
    let s = serve(None);
    assert_eq!(s.post("/definitions", &order(), None).0, 201);
    for (id, order_id) in [("a", "A1"), ("b", "B2"), ("c", "C3")] {
        let input = json!({"orderId": order_id});
        let (code, body) = s.post(
            "/instances",
            &json!({"definition": "order", "id": id, "input": input}),
            None,
        );
        assert_eq!(code, 201, "{body}");
    }
    let ids = |q: &str| -> Vec<String> {
        let (code, v) = s.get(&format!("/ui/api/search?{q}"), None);
        assert_eq!(code, 200, "{q}: {v}");
        let mut ids: Vec<String> = v["instances"]
            .as_array()
            .expect("instances")
            .iter()
            .map(|r| r["id"].as_str().unwrap_or("").to_string())
            .collect();
        ids.sort();
        ids
    };
    assert_eq!(ids("condition=.orderId%20%3D%3D%20%22B2%22"), ["b"]);
    assert_eq!(ids("version=1&state=AwaitPayment"), ["a", "b", "c"]);
    assert!(ids("version=2").is_empty());
    assert_eq!(
        ids("startedAfter=2000-01-01T00:00:00Z&startedBefore=2999-01-01T00:00:00Z").len(),
        3
    );
    assert!(ids("startedBefore=2000-01-01T00:00:00Z").is_empty());
    let (code, v) = s.get("/ui/api/search?condition=.orderId%20%3D%3D", None);
    assert_eq!(code, 400, "{v}");
    assert!(v["message"].as_str().unwrap_or("").starts_with("condition: "), "{v}");
}

#[test]
fn the_list_goes_newest_first_in_pages() {
    let s = serve(None);
    assert_eq!(s.post("/definitions", &order(), None).0, 201);
    let ids: Vec<String> = (1..=7).map(|n| format!("i{n}")).collect();
    for id in &ids {
        let body = json!({"definition": "order", "id": id, "input": {"orderId": id}});
        assert_eq!(s.post("/instances", &body, None).0, 201);
    }
    s.post("/instances/i4/cancel", &json!({}), None);
    let page = |q: &str| -> (Vec<String>, Value) {
        let (code, v) = s.get(&format!("/ui/api/instances?{q}"), None);
        assert_eq!(code, 200, "{q}: {v}");
        let ids = v["instances"]
            .as_array()
            .expect("instances")
            .iter()
            .map(|r| r["id"].as_str().unwrap_or("").to_string())
            .collect();
        (ids, v["next"].clone())
    };
    let (first, next) = page("limit=3");
    assert_eq!(first, ["i7", "i6", "i5"]);
    let (second, next) = page(&format!("limit=3&before={}", next.as_str().expect("a next page")));
    assert_eq!(second, ["i4", "i3", "i2"]);
    let (third, next) = page(&format!("limit=3&before={}", next.as_str().expect("a next page")));
    assert_eq!(third, ["i1"]);
    assert_eq!(next, Value::Null);
    assert_eq!(page("limit=10&status=cancelled").0, ["i4"]);
    assert_eq!(page("limit=2&status=waiting").0, ["i7", "i6"]);
    assert_eq!(page("definition=nothing").0, Vec::<String>::new());
    assert_eq!(s.get("/ui/api/instances?status=sleeping", None).0, 400);
}
