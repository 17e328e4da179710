//! A schedule as `GET /schedules/{id}` shows it, the same in every host.

use crate::plan::State;
use crate::spec::{rfc3339, Spec};
use serde_json::{json, Value};

/// How many upcoming times `GET /schedules/{id}` shows.
pub const UPCOMING: usize = 10;

/// Schedule `id` at `now` (ms): its specification, its state (`active`, `paused`, `ended`), its
/// next `upcoming` times, its running and kept runs, its recent runs and its skipped counts.
pub fn view(id: &str, spec: &Spec, state: &State, now: i64, upcoming: usize) -> Value {
    let next: Vec<String> = state.upcoming(spec, upcoming).into_iter().map(rfc3339).collect();
    let recent: Vec<Value> = state
        .recent
        .iter()
        .rev()
        .map(|r| {
            json!({"nominalTime": rfc3339(r.nominal), "instance": r.instance, "lateMs": r.late,
                "status": r.outcome.as_deref().unwrap_or("running")})
        })
        .collect();
    let buffered: Vec<String> = state.buffered.iter().map(|t| rfc3339(*t)).collect();
    json!({
        "id": id,
        "spec": spec.to_json(),
        "state": if state.paused { "paused" } else if next.is_empty() { "ended" } else { "active" },
        "nextTimes": next,
        "running": state.running,
        "buffered": buffered,
        "backfillPending": state.backfill.len(),
        "recentRuns": recent,
        "runs": state.runs,
        "skipped": {"overlap": state.skipped.overlap, "catchup": state.skipped.catchup, "paused": state.skipped.paused},
        "nextWake": state.wake_at(spec, now).map(rfc3339),
    })
}
