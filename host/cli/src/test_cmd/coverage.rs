//! Coverage of a definition by its tests: the states entered, the transitions taken and the
//! actions run, each as covered/total with what was missed.
//!
//! SM4C: every transition of every state (timeouts included) and every error handler of every
//! action are transitions; every action (children of `parallel`, `sequence` and `foreach` too) is
//! an action. ASL: every `Next`, every Choice rule and `Default` and every `Catch` are transitions
//! (in Parallel branches and Map processors too); Task states are the actions. Transitions and
//! actions are named by their JSON pointer in the definition, states by name.

use serde_json::{json, Value};
use sm4c_runtime::asl::model::Kind;
use sm4c_runtime::model::{Machine, Trigger};
use std::collections::BTreeSet;

/// One thing to cover.
#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    /// What names it: a state's name, or a JSON pointer in the definition.
    pub key: String,
    /// How the terminal shows it.
    pub label: String,
    /// For an ASL Task state: its name (it is covered when it is entered).
    pub task: Option<String>,
}

/// Everything a definition has to cover.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Items {
    /// States, by name.
    pub states: Vec<Item>,
    /// Transitions (SM4C error handlers, ASL Choice rules, `Default` and `Catch` included).
    pub transitions: Vec<Item>,
    /// Actions (ASL: Task states).
    pub actions: Vec<Item>,
}

fn item(key: impl Into<String>, label: impl Into<String>) -> Item {
    Item {
        key: key.into(),
        label: label.into(),
        task: None,
    }
}

/// What `m` has to cover.
pub fn items(m: &Machine) -> Items {
    let mut out = Items::default();
    if let Some(asl) = &m.asl {
        for g in &asl.graphs {
            for st in &g.states {
                let name = |n: usize| g.states.get(n).map_or("?", |s| s.name.as_str());
                out.states.push(item(&st.name, &st.name));
                if let Kind::Choice { choices, default } = &st.kind {
                    for (i, c) in choices.iter().enumerate() {
                        out.transitions.push(item(
                            format!("{}/Choices/{i}", st.pointer),
                            format!("{} rule {i} → {}", st.name, name(c.next)),
                        ));
                    }
                    if let Some(d) = default {
                        out.transitions.push(item(
                            format!("{}/Default", st.pointer),
                            format!("{} Default → {}", st.name, name(*d)),
                        ));
                    }
                } else if let Some(n) = st.next {
                    out.transitions.push(item(
                        format!("{}/Next", st.pointer),
                        format!("{} → {}", st.name, name(n)),
                    ));
                }
                for (i, c) in st.catch.iter().enumerate() {
                    out.transitions.push(item(
                        format!("{}/Catch/{i}", st.pointer),
                        format!("{} Catch {} → {}", st.name, c.errors.join(", "), name(c.next)),
                    ));
                }
                if matches!(st.kind, Kind::Task { .. }) {
                    out.actions.push(Item {
                        task: Some(st.name.clone()),
                        ..item(&st.pointer, format!("Task {}", st.name))
                    });
                }
            }
        }
        return out;
    }
    for s in &m.states {
        out.states.push(item(&s.name, &s.name));
        for (i, t) in s.transitions.iter().enumerate() {
            let to = t.next.map_or("(stays)", |n| m.states[n].name.as_str());
            let trigger = match t.trigger {
                Trigger::Implicit => "implicit",
                Trigger::Condition => "condition",
                Trigger::Events => "events",
                Trigger::Timeout => "timeout",
            };
            out.transitions.push(item(
                format!("{}/transitions/{i}", s.pointer),
                format!("{} → {to} (transition {i}, {trigger})", s.name),
            ));
        }
    }
    for a in &m.actions {
        for j in 0..a.handlers.len() {
            out.transitions.push(item(
                format!("{}/errorHandlers/{j}", a.pointer),
                format!("error handler {j} of {}", action_label(a)),
            ));
        }
        out.actions.push(item(&a.pointer, action_label(a)));
    }
    out
}

fn action_label(a: &sm4c_runtime::model::Action) -> String {
    match &a.name {
        Some(n) => format!("{n} ({})", a.kind.type_name()),
        None => a.kind.type_name().to_string(),
    }
}

/// What the tests of one definition reached, gathered over its tests.
#[derive(Clone, Debug, Default)]
pub struct Reached {
    /// States entered, by name.
    pub states: BTreeSet<String>,
    /// Pointers of the transitions, handlers and actions taken.
    pub pointers: BTreeSet<String>,
}

/// One kind's count.
pub struct Count<'a> {
    /// Covered items.
    pub covered: usize,
    /// All items.
    pub total: usize,
    /// The items not covered.
    pub missed: Vec<&'a Item>,
}

impl Count<'_> {
    /// Covered over total, in percent (100 when there is nothing to cover).
    pub fn percent(&self) -> f64 {
        if self.total == 0 {
            100.0
        } else {
            self.covered as f64 * 100.0 / self.total as f64
        }
    }

    /// As `--json` writes it.
    pub fn to_json(&self) -> Value {
        json!({
            "covered": self.covered,
            "total": self.total,
            "missed": self.missed.iter().map(|i| i.key.clone()).collect::<Vec<_>>(),
        })
    }
}

fn count<'a>(items: &'a [Item], reached: &BTreeSet<String>) -> Count<'a> {
    let missed: Vec<&Item> = items.iter().filter(|i| !reached.contains(&i.key)).collect();
    Count {
        covered: items.len() - missed.len(),
        total: items.len(),
        missed,
    }
}

/// The three counts of a definition: states, transitions, actions.
pub fn counts<'a>(items: &'a Items, reached: &Reached) -> [(&'static str, Count<'a>); 3] {
    let mut taken = reached.pointers.clone();
    // ASL Task states are covered when they are entered.
    taken.extend(
        items
            .actions
            .iter()
            .filter(|a| a.task.as_ref().is_some_and(|n| reached.states.contains(n)))
            .map(|a| a.key.clone()),
    );
    [
        ("states", count(&items.states, &reached.states)),
        ("transitions", count(&items.transitions, &taken)),
        ("actions", count(&items.actions, &taken)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use sm4c_runtime::{load, no_files, LoadOptions};

    #[test]
    fn sm4c_transitions_include_timeouts_and_error_handlers() {
        let m = load(
            &json!({"id": "c", "name": "c", "version": "1",
            "states": [
                {"name": "A", "start": true,
                 "enterAction": {"type": "injectData", "expression": "${ 1 }",
                                 "errorHandlers": [{"resultHandler": "${ . }"}]},
                 "transitions": [{"nextState": "B", "condition": "${ .x }"}, {"nextState": "B", "timeout": "PT1M"}]},
                {"name": "B"}
            ]}),
            &mut no_files,
            LoadOptions::default(),
        )
        .unwrap();
        let items = items(&m);
        let keys = |l: &[Item]| l.iter().map(|i| i.key.clone()).collect::<Vec<_>>();
        assert_eq!(keys(&items.states), ["A", "B"]);
        assert_eq!(
            keys(&items.transitions),
            [
                "/states/0/transitions/0",
                "/states/0/transitions/1",
                "/states/0/enterAction/errorHandlers/0"
            ]
        );
        assert_eq!(items.transitions[1].label, "A → B (transition 1, timeout)");
        assert_eq!(keys(&items.actions), ["/states/0/enterAction"]);
        let reached = Reached {
            states: ["A".to_string()].into(),
            pointers: ["/states/0/transitions/1".to_string()].into(),
        };
        let [(_, s), (_, t), (_, a)] = counts(&items, &reached);
        assert_eq!((s.covered, s.total, t.covered, t.total, a.covered), (1, 2, 1, 3, 0));
        assert_eq!(t.percent(), 100.0 / 3.0);
        assert_eq!(
            t.to_json()["missed"],
            json!(["/states/0/transitions/0", "/states/0/enterAction/errorHandlers/0"])
        );
    }
}
