//! `GET /ui/api/search`: the instance list's filters that `GET /instances` does not have (version,
//! state, started between, and a jq condition over each instance's data), by scanning the list
//! through [`Backend::list`] with the filters it has (status, definition), newest first.
//!
//! A scan reads at most [`MAX_SCAN`] instances per request and answers with a cursor to go on from;
//! the jq condition reads each candidate instance, so it costs one instance read per instance
//! scanned that passes the other filters.

use super::newest::{self, Filter};
use crate::errors::InvalidQuery;
use crate::ApiError;
use serde::Deserialize;
use serde_json::{json, Value};
use sm4c_host::service::Backend;
use sm4c_runtime::{Expr, Limits};
use std::sync::Arc;

/// Most instances one search request scans.
pub const MAX_SCAN: usize = 10_000;
/// Most matches one search request answers with.
const MAX_MATCHES: usize = 200;
const PAGE: usize = 500;

/// The query of `GET /ui/api/search`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Search {
    status: Option<String>,
    definition: Option<String>,
    version: Option<String>,
    state: Option<String>,
    /// RFC 3339: started at or after.
    started_after: Option<String>,
    /// RFC 3339: started before.
    started_before: Option<String>,
    /// A jq condition over the instance's data: it matches when it yields `true`.
    condition: Option<String>,
    /// Where a previous search stopped: the cursor it answered with as `next`.
    before: Option<String>,
}

fn nonempty(s: &Option<String>) -> Option<&str> {
    s.as_deref().filter(|s| !s.is_empty())
}

/// Runs a search, newest first: `{instances, scanned, next}`, `next` the cursor to scan on from
/// (older), when the scan stopped before the oldest instance.
pub async fn search(h: &Arc<dyn Backend>, q: Search) -> Result<Value, ApiError> {
    let condition = match nonempty(&q.condition) {
        Some(c) => Some(Expr::compile(c, &[], Limits::default()).map_err(|e| InvalidQuery(format!("condition: {e}")))?),
        None => None,
    };
    let f = Filter {
        status: nonempty(&q.status),
        definition: nonempty(&q.definition),
    };
    let mut before = match nonempty(&q.before) {
        Some(b) => b
            .parse()
            .map_err(|_| InvalidQuery(format!("before: {b:?} is not a cursor")))?,
        None => match newest::top(h, f).await? {
            Some(t) => t,
            None => return Ok(json!({"instances": [], "scanned": 0, "next": null})),
        },
    };
    let (mut scanned, mut found, mut next) = (0, Vec::new(), None);
    loop {
        let (rows, older) = newest::page(h, f, before, PAGE).await?;
        for r in rows {
            before = r.seq;
            scanned += 1;
            let keep = nonempty(&q.version).is_none_or(|v| r.version == v)
                && nonempty(&q.state).is_none_or(|s| r.state.as_deref() == Some(s))
                && nonempty(&q.started_after).is_none_or(|t| r.started_at.as_deref().is_some_and(|s| s >= t))
                && nonempty(&q.started_before).is_none_or(|t| r.started_at.as_deref().is_some_and(|s| s < t));
            let keep = keep
                && match &condition {
                    None => true,
                    Some(c) => match h.instance(&r.id)? {
                        Some(s) => c.eval_json(&super::view::data_of(&s.snapshot)).ok() == Some(Value::Bool(true)),
                        None => false,
                    },
                };
            if keep {
                found.push(r);
            }
            if found.len() >= MAX_MATCHES || scanned >= MAX_SCAN {
                next = Some(before.to_string());
                break;
            }
        }
        if next.is_some() || older.is_none() {
            break;
        }
        tokio::task::yield_now().await;
    }
    Ok(json!({"instances": found, "scanned": scanned, "next": next}))
}
