//! An OTLP/HTTP trace receiver of our own for the tests (an axum server that decodes
//! `ExportTraceServiceRequest` protobufs), and what to read from the spans it got.
#![allow(dead_code)]

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use std::sync::{Arc, Mutex};

/// Runs `app` on a free port in a background thread; returns its base URL.
pub fn spawn(app: Router) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    format!("http://{}", rx.recv().unwrap())
}

/// The spans an OTLP/HTTP receiver got, and how many export requests.
#[derive(Clone, Default)]
pub struct Received(Arc<Mutex<(Vec<Span>, usize)>>);

impl Received {
    /// The spans of the steps of instance `instance`.
    pub fn spans_of(&self, instance: &str) -> Vec<Span> {
        let r = self.0.lock().unwrap();
        r.0.iter()
            .filter(|s| attr(s, "sm4c.instance.id").as_deref() == Some(instance))
            .cloned()
            .collect()
    }

    /// How many export requests came.
    pub fn requests(&self) -> usize {
        self.0.lock().unwrap().1
    }
}

/// An OTLP/HTTP receiver: `POST /v1/traces` with a protobuf `ExportTraceServiceRequest`.
pub fn receiver() -> (String, Received) {
    let got = Received::default();
    let app = Router::new()
        .route(
            "/v1/traces",
            post(
                |State(got): State<Received>, headers: HeaderMap, body: Bytes| async move {
                    assert_eq!(
                        headers.get("content-type").and_then(|v| v.to_str().ok()),
                        Some("application/x-protobuf")
                    );
                    let req = ExportTraceServiceRequest::decode(body).expect("an ExportTraceServiceRequest");
                    let mut g = got.0.lock().unwrap();
                    g.1 += 1;
                    for rs in req.resource_spans {
                        let service = rs
                            .resource
                            .iter()
                            .flat_map(|r| &r.attributes)
                            .find(|a| a.key == "service.name")
                            .and_then(|a| a.value.as_ref())
                            .map(|v| format!("{:?}", v.value));
                        assert!(service.is_some_and(|s| s.contains("sm4c")), "service.name is sm4c");
                        for ss in rs.scope_spans {
                            g.0.extend(ss.spans);
                        }
                    }
                    (
                        [("content-type", "application/x-protobuf")],
                        ExportTraceServiceResponse::default().encode_to_vec(),
                    )
                },
            ),
        )
        .with_state(got.clone());
    (spawn(app), got)
}

/// A span attribute as text.
pub fn attr(s: &Span, key: &str) -> Option<String> {
    use opentelemetry_proto::tonic::common::v1::any_value::Value as V;
    s.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| match a.value.as_ref()?.value.as_ref()? {
            V::StringValue(v) => Some(v.clone()),
            V::IntValue(i) => Some(i.to_string()),
            other => Some(format!("{other:?}")),
        })
}

/// Bytes (a trace or span id) in lower-case hex.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}
