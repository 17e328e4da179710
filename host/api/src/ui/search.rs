//! `GET /ui/api/search`: the instance list's filters that `GET /instances` does not have (version,
//! state, started between, and a jq condition over each instance's data), by scanning the list
//! through [`Backend::list`] with the filters it has (status, definition), newest first.
//!
//! A scan reads at most [`MAX_SCAN`] instances per request and answers with a cursor to go on from;
//! the jq condition reads each candidate instance, so it costs one instance read per instance
//! scanned that passes the other filters.

use super::newest::{self, Filter};
use crate::errors::{Busy, InvalidQuery};
use crate::work::Work;
use crate::ApiError;
use serde::Deserialize;
use serde_json::{json, Value};
use sm4c_host::service::Backend;
use sm4c_host::service::Summary;
use sm4c_runtime::Expr;
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
/// (older), when the scan stopped before the oldest instance. The condition is evaluated in
/// `work` ([`crate::work`]), with its expression limits: a condition that a limit stops, or a scan
/// that outlasts the budget, answers an error.
pub async fn search(h: &Arc<dyn Backend>, q: Search, work: &Work) -> Result<Value, ApiError> {
    let condition = match nonempty(&q.condition) {
        Some(c) => Some(Expr::compile(c, &[], work.limits).map_err(|e| InvalidQuery(format!("condition: {e}")))?),
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
    let started = std::time::Instant::now();
    loop {
        let (rows, older) = newest::page(h, f, before, PAGE).await?;
        let mut candidates = Vec::new();
        for r in rows {
            before = r.seq;
            scanned += 1;
            let keep = nonempty(&q.version).is_none_or(|v| r.version == v)
                && nonempty(&q.state).is_none_or(|s| r.state.as_deref() == Some(s))
                && nonempty(&q.started_after).is_none_or(|t| r.started_at.as_deref().is_some_and(|s| s >= t))
                && nonempty(&q.started_before).is_none_or(|t| r.started_at.as_deref().is_some_and(|s| s < t));
            if keep {
                candidates.push(r);
            }
            if found.len() + candidates.len() >= MAX_MATCHES || scanned >= MAX_SCAN {
                next = Some(before.to_string());
                break;
            }
        }
        match &condition {
            None => found.extend(candidates),
            Some(c) => {
                let (h, c) = (h.clone(), c.clone());
                let end = started + work.budget;
                let kept = work
                    .run("the search's condition", move |deadline| {
                        matching(&h, &c, candidates, deadline.min(end))
                    })
                    .await??;
                found.extend(kept);
            }
        }
        if next.is_some() || older.is_none() {
            break;
        }
        tokio::task::yield_now().await;
    }
    Ok(json!({"instances": found, "scanned": scanned, "next": next}))
}

/// The candidates whose data the condition yields `true` for. A condition that fails on one
/// instance's data (a type error) does not match it; one that a limit stops (fuel, sizes), or a
/// scan past `deadline`, is an error.
fn matching(
    h: &Arc<dyn Backend>,
    c: &Expr,
    candidates: Vec<Summary>,
    deadline: std::time::Instant,
) -> Result<Vec<Summary>, ApiError> {
    let mut kept = Vec::new();
    for r in candidates {
        if std::time::Instant::now() > deadline {
            return Err(Busy(format!(
                "the search's condition took longer than its budget before instance {:?}: narrow the search (definition, status, started between) or simplify the condition",
                r.id
            ))
            .into());
        }
        let Some(s) = h.instance(&r.id)? else {
            continue;
        };
        match c.eval_json(&super::view::data_of(&s.snapshot)) {
            Ok(Value::Bool(true)) => kept.push(r),
            Err(e) if e.out_of_fuel => {
                return Err(InvalidQuery(format!(
                    "condition: stopped by the server's expression limits on instance {:?}: {}",
                    r.id, e.message
                ))
                .into())
            }
            _ => {}
        }
    }
    Ok(kept)
}
