//! The upgrade report: what a new version of a definition would mean for the instances of that
//! definition that have not ended, before it is registered or takes traffic.
//!
//! For each such instance it asks two things. Could it move to the new version as it is
//! ([`Instance::migration_plan`] without a state map), does it need a map (its state has no
//! counterpart), or why can it not (it is in the middle of an action, paused, ...)? And would the
//! new version have decided what the instance's history recorded ([`history::compare`])? The
//! answers are counted per version and state the instances are in.

use crate::service::{Backend, HostError};
use serde_json::{json, Map, Value};
use sm4c_runtime::engine::history::{self, History};
use sm4c_runtime::{Instance, Machine, Options};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Statuses of instances that have not ended.
const UNENDED: [&str; 4] = ["created", "running", "waiting", "paused"];
/// Instances named as examples per group.
const EXAMPLES: usize = 3;
/// Instances listed per page.
const PAGE: usize = 1000;

#[derive(Default)]
struct Group {
    instances: u64,
    can_move: u64,
    need_mapping: u64,
    cannot: BTreeMap<String, u64>,
    same_decisions: u64,
    diverged: u64,
    examples: Vec<Value>,
}

/// The report on `new` (a version of a definition already registered, or not) over the instances
/// `b` holds: `{"definition", "version", "instances", "canMove", "needMapping", "cannot",
/// "sameDecisions", "diverged", "groups": [{"version", "state", "instances", "canMove",
/// "needMapping", "cannot": {reason: count}, "sameDecisions", "diverged", "examples": [...]}]}`.
pub async fn report<B: Backend + ?Sized>(b: &B, new: Arc<Machine>, now: i64) -> Result<Value, HostError> {
    let machines: HashMap<String, Arc<Machine>> = b
        .machines()
        .into_iter()
        .filter(|m| m.id == new.id)
        .map(|m| (m.version.clone(), m))
        .collect();
    let mut groups: BTreeMap<(String, String), Group> = BTreeMap::new();
    let none = BTreeMap::new();
    for status in UNENDED {
        let mut after = 0;
        loop {
            let page = b.list(Some(status), Some(&new.id), after, PAGE).await?;
            let Some(last) = page.last() else { break };
            after = last.seq;
            for row in &page {
                let Some(stored) = b.instance(&row.id)? else { continue };
                let snapshot = stored.snapshot;
                let key = (
                    snapshot.version.clone(),
                    snapshot.state_name.clone().unwrap_or_default(),
                );
                let g = groups.entry(key).or_default();
                g.instances += 1;
                let Some(m) = machines.get(&snapshot.version) else {
                    *g.cannot.entry("unknownVersion".into()).or_default() += 1;
                    continue;
                };
                let inst = Instance::from_snapshot(m.clone(), snapshot, Options::default());
                let example = |why: &str| json!({"id": row.id, "why": why});
                match inst.migration_plan(&new, &none, now) {
                    Ok(_) => g.can_move += 1,
                    Err(e) if e.reason == "noCounterpart" => {
                        g.need_mapping += 1;
                        if g.examples.len() < EXAMPLES {
                            g.examples.push(example(&e.message));
                        }
                    }
                    Err(e) => {
                        *g.cannot.entry(e.reason.to_string()).or_default() += 1;
                        if g.examples.len() < EXAMPLES {
                            g.examples.push(example(&e.message));
                        }
                    }
                }
                let entries = b.history(&row.id, 0, usize::MAX).await?;
                let h = History {
                    id: Some(row.id.clone()),
                    entries,
                };
                match history::compare(new.clone(), &row.id, &h).divergence {
                    None => g.same_decisions += 1,
                    Some(d) => {
                        g.diverged += 1;
                        if g.examples.len() < EXAMPLES {
                            g.examples
                                .push(example(&format!("its history diverges at {}", d.summary())));
                        }
                    }
                }
            }
            if page.len() < PAGE {
                break;
            }
        }
    }
    let groups: Vec<Value> = groups
        .into_iter()
        .map(|((version, state), g)| {
            json!({
                "version": version,
                "state": state,
                "instances": g.instances,
                "canMove": g.can_move,
                "needMapping": g.need_mapping,
                "cannot": g.cannot,
                "sameDecisions": g.same_decisions,
                "diverged": g.diverged,
                "examples": g.examples,
            })
        })
        .collect();
    Ok(totals(&new.id, &new.version, groups))
}

/// The report with its totals, from its groups.
fn totals(definition: &str, version: &str, groups: Vec<Value>) -> Value {
    let sum = |k: &str| groups.iter().map(|g| g[k].as_u64().unwrap_or(0)).sum::<u64>();
    let mut cannot: BTreeMap<String, u64> = BTreeMap::new();
    for g in &groups {
        for (k, v) in g["cannot"].as_object().into_iter().flatten() {
            *cannot.entry(k.clone()).or_default() += v.as_u64().unwrap_or(0);
        }
    }
    json!({
        "definition": definition,
        "version": version,
        "instances": sum("instances"),
        "canMove": sum("canMove"),
        "needMapping": sum("needMapping"),
        "cannot": cannot,
        "sameDecisions": sum("sameDecisions"),
        "diverged": sum("diverged"),
        "groups": groups,
    })
}

/// Reports over different instances (each worker's share in Kafka mode) as one.
pub fn merge(reports: Vec<Value>) -> Value {
    let (definition, version) = match reports.first() {
        Some(r) => (
            r["definition"].as_str().unwrap_or_default().to_string(),
            r["version"].as_str().unwrap_or_default().to_string(),
        ),
        None => (String::new(), String::new()),
    };
    let mut groups: BTreeMap<(String, String), Map<String, Value>> = BTreeMap::new();
    for g in reports
        .iter()
        .flat_map(|r| r["groups"].as_array().cloned().unwrap_or_default())
    {
        let key = (
            g["version"].as_str().unwrap_or_default().to_string(),
            g["state"].as_str().unwrap_or_default().to_string(),
        );
        let Some(g) = g.as_object() else { continue };
        let into = groups.entry(key).or_insert_with(|| {
            let mut m = g.clone();
            for k in ["instances", "canMove", "needMapping", "sameDecisions", "diverged"] {
                m.insert(k.into(), json!(0));
            }
            m.insert("cannot".into(), json!({}));
            m.insert("examples".into(), json!([]));
            m
        });
        for k in ["instances", "canMove", "needMapping", "sameDecisions", "diverged"] {
            let n = into[k].as_u64().unwrap_or(0) + g.get(k).and_then(Value::as_u64).unwrap_or(0);
            into.insert(k.into(), json!(n));
        }
        let mut cannot = into["cannot"].as_object().cloned().unwrap_or_default();
        for (k, v) in g.get("cannot").and_then(Value::as_object).into_iter().flatten() {
            let n = cannot.get(k).and_then(Value::as_u64).unwrap_or(0) + v.as_u64().unwrap_or(0);
            cannot.insert(k.clone(), json!(n));
        }
        into.insert("cannot".into(), Value::Object(cannot));
        let mut examples = into["examples"].as_array().cloned().unwrap_or_default();
        for e in g.get("examples").and_then(Value::as_array).into_iter().flatten() {
            if examples.len() < EXAMPLES {
                examples.push(e.clone());
            }
        }
        into.insert("examples".into(), Value::Array(examples));
    }
    totals(&definition, &version, groups.into_values().map(Value::Object).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_reports_add_up_per_version_and_state() {
        let a = totals(
            "order",
            "2",
            vec![
                json!({"version": "1", "state": "Wait", "instances": 2, "canMove": 1, "needMapping": 0,
                        "cannot": {"inAction": 1}, "sameDecisions": 2, "diverged": 0, "examples": [{"id": "a"}]}),
            ],
        );
        let b = totals(
            "order",
            "2",
            vec![
                json!({"version": "1", "state": "Wait", "instances": 3, "canMove": 3, "needMapping": 0,
                        "cannot": {}, "sameDecisions": 1, "diverged": 2, "examples": [{"id": "b"}, {"id": "c"}, {"id": "d"}]}),
                json!({"version": "1", "state": "Pay", "instances": 1, "canMove": 0, "needMapping": 1,
                        "cannot": {}, "sameDecisions": 1, "diverged": 0, "examples": []}),
            ],
        );
        let m = merge(vec![a, b]);
        assert_eq!(
            (
                m["instances"].as_u64(),
                m["canMove"].as_u64(),
                m["needMapping"].as_u64()
            ),
            (Some(6), Some(4), Some(1))
        );
        assert_eq!(m["cannot"], json!({"inAction": 1}));
        assert_eq!(m["diverged"], 2);
        let wait = &m["groups"][1];
        assert_eq!(
            (wait["state"].as_str(), wait["instances"].as_u64()),
            (Some("Wait"), Some(5))
        );
        assert_eq!(wait["examples"].as_array().map(Vec::len), Some(EXAMPLES));
        assert_eq!(m["groups"][0]["state"], "Pay");
    }
}
