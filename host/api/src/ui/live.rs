//! Live updates for the inspector: `GET /ui/events`, a server-sent event stream of the instances
//! that changed.
//!
//! The change notification is the step the driver reports to the process's
//! [`Observer`](sm4c_host::metrics::Observer) (`sm4c serve` forwards it to [`changed`]), in both
//! modes. A step is reported before its host has stored it, so changes are gathered for
//! [`BATCH`] and then sent as one `changes` event: a page that reads the instance on hearing of it
//! reads what the step stored. A Kafka worker reports only the steps of the partitions it owns; the
//! page also re-reads what it shows every few seconds, so it catches up with the other workers.

use axum::response::sse::{Event, KeepAlive, Sse};
use serde::Serialize;
use sm4c_host::metrics::StepSpan;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::OnceLock;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};

/// How long changes are gathered before they are sent.
pub const BATCH: Duration = Duration::from_millis(250);

/// Changes a slow page may fall behind by before it is told to read everything again.
const BACKLOG: usize = 4096;

/// An instance that took a step.
#[derive(Debug, Clone, Serialize)]
pub struct Change {
    /// Instance id.
    pub id: String,
    /// Definition id.
    pub definition: String,
    /// Its state after the step.
    pub state: Option<String>,
    /// Its status after the step.
    pub status: &'static str,
}

fn sender() -> &'static broadcast::Sender<Change> {
    static CHANGES: OnceLock<broadcast::Sender<Change>> = OnceLock::new();
    CHANGES.get_or_init(|| broadcast::channel(BACKLOG).0)
}

/// Tells the open inspector pages that an instance took `step`. Costs a clone of a few strings
/// when a page listens, and nothing more than a check when none does.
pub fn changed(step: &StepSpan<'_>) {
    let tx = sender();
    if tx.receiver_count() == 0 {
        return;
    }
    let _ = tx.send(Change {
        id: step.instance.to_string(),
        definition: step.definition.to_string(),
        state: step.state.map(str::to_string),
        status: step.status.as_str(),
    });
}

/// `GET /ui/events`: a `hello` event at once (a page that reconnects after a restart re-reads
/// everything on it), then `changes` events (a JSON array of [`Change`], one per instance, the
/// latest), and `resync` when this page fell more than the backlog behind.
pub async fn events() -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
    let mut rx = sender().subscribe();
    let (tx, out) = mpsc::channel::<Event>(16);
    tokio::spawn(async move {
        let hello = Event::default()
            .event("hello")
            .data(format!("{{\"pid\":{}}}", std::process::id()));
        if tx.send(hello).await.is_err() {
            return;
        }
        loop {
            let first = tokio::select! {
                r = rx.recv() => r,
                () = tx.closed() => return,
            };
            let mut batch = BTreeMap::new();
            let mut lagged = false;
            match first {
                Ok(c) => {
                    batch.insert(c.id.clone(), c);
                }
                Err(broadcast::error::RecvError::Lagged(_)) => lagged = true,
                Err(broadcast::error::RecvError::Closed) => return,
            }
            let until = tokio::time::Instant::now() + BATCH;
            loop {
                match tokio::time::timeout_at(until, rx.recv()).await {
                    Ok(Ok(c)) => {
                        batch.insert(c.id.clone(), c);
                    }
                    Ok(Err(broadcast::error::RecvError::Lagged(_))) => lagged = true,
                    Ok(Err(broadcast::error::RecvError::Closed)) | Err(_) => break,
                }
            }
            let event = if lagged {
                Event::default().event("resync").data("{}")
            } else {
                let list: Vec<&Change> = batch.values().collect();
                Event::default()
                    .event("changes")
                    .data(serde_json::to_string(&list).unwrap_or_else(|_| "[]".into()))
            };
            if tx.send(event).await.is_err() {
                return;
            }
        }
    });
    let stream = futures_util::stream::unfold(out, |mut out| async move { out.recv().await.map(|e| (Ok(e), out)) });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}
