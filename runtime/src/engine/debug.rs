//! The step debugger's part of the engine: breakpoints, pauses and resumes, decided from journaled
//! inputs only ([`Input::Debug`](super::Input::Debug) and [`Input::Resume`](super::Input::Resume)),
//! so a journal with pauses replays to the same instance.
//!
//! An instance pauses at a *breakpoint-able point*: before it enters a state, before it starts an
//! action of a state (its enter action, its exit action, or the action of transition `N`, named
//! `enter`, `exit` and `tN` as in operation ids), and before a transition of a state fires. It
//! pauses there when one of its breakpoints matches the point, or at the very next point after a
//! `step`. While it is paused every other input waits (in order) until it is resumed; a cancel or
//! an abort ends it at once.

use super::{Status, Timed};
use crate::model::{Machine, StateId};
use serde::{Deserialize, Serialize};

/// A breakpoint of a definition, or the point a paused instance stopped at.
///
/// As JSON: `{"on": "enter", "state": "Pay"}`, `{"on": "action", "state": "Pay", "action": "exit"}`,
/// `{"on": "transition", "state": "Pay", "transition": 1}` (without `transition`: any of the
/// state's transitions).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "on", rename_all = "camelCase", deny_unknown_fields)]
pub enum Breakpoint {
    /// Before the instance enters the state (before its enter action runs).
    Enter {
        /// State name.
        state: String,
    },
    /// Before the state starts one of its actions: `enter`, `exit`, or `tN` (the action of
    /// transition `N`, counted from 0).
    Action {
        /// State name.
        state: String,
        /// Which action: `enter`, `exit` or `tN`.
        action: String,
    },
    /// Before a transition of the state fires.
    Transition {
        /// State name.
        state: String,
        /// The transition's index in the state (from 0); none: any of them.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        transition: Option<usize>,
    },
}

impl Breakpoint {
    /// The state it names.
    pub fn state(&self) -> &str {
        match self {
            Breakpoint::Enter { state } | Breakpoint::Action { state, .. } | Breakpoint::Transition { state, .. } => {
                state
            }
        }
    }

    /// Whether this breakpoint stops an instance at point `at`.
    pub fn matches(&self, at: &Breakpoint) -> bool {
        match (self, at) {
            (Breakpoint::Enter { state: a }, Breakpoint::Enter { state: b }) => a == b,
            (Breakpoint::Action { state: a, action: x }, Breakpoint::Action { state: b, action: y }) => {
                a == b && x == y
            }
            (
                Breakpoint::Transition {
                    state: a,
                    transition: x,
                },
                Breakpoint::Transition {
                    state: b,
                    transition: y,
                },
            ) => a == b && (x.is_none() || x == y),
            _ => false,
        }
    }

    /// Checks the breakpoint against a definition: the state exists, and so does the action or the
    /// transition it names. The error says what is wrong.
    pub fn check(&self, m: &Machine) -> Result<(), String> {
        if m.asl.is_some() {
            return Err(format!(
                "definition {:?} is in the Amazon States Language; breakpoints are for SM4C definitions",
                m.id
            ));
        }
        let name = self.state();
        let Some(st) = m.states.iter().find(|s| s.name == name) else {
            let names: Vec<&str> = m.states.iter().map(|s| s.name.as_str()).collect();
            return Err(format!(
                "definition {:?} has no state {name:?} (its states: {})",
                m.id,
                names.join(", ")
            ));
        };
        match self {
            Breakpoint::Enter { .. } => Ok(()),
            Breakpoint::Transition { transition: None, .. } if st.transitions.is_empty() => {
                Err(format!("state {name:?} has no transitions"))
            }
            Breakpoint::Transition { transition: None, .. } => Ok(()),
            Breakpoint::Transition {
                transition: Some(i), ..
            } => {
                if *i < st.transitions.len() {
                    Ok(())
                } else {
                    Err(format!(
                        "state {name:?} has no transition {i} (it has {}, counted from 0)",
                        st.transitions.len()
                    ))
                }
            }
            Breakpoint::Action { action, .. } => {
                let has = match action.as_str() {
                    "enter" => st.enter.is_some(),
                    "exit" => st.exit.is_some(),
                    t => match t.strip_prefix('t').and_then(|n| n.parse::<usize>().ok()) {
                        Some(i) => st.transitions.get(i).is_some_and(|t| t.action.is_some()),
                        None => {
                            return Err(format!(
                                "action {action:?} is not an action name: use enter, exit or tN (the action of transition N)"
                            ))
                        }
                    },
                };
                if has {
                    Ok(())
                } else {
                    Err(format!("state {name:?} has no {action} action"))
                }
            }
        }
    }
}

/// Where a paused instance goes on when resumed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "then", rename_all = "camelCase")]
pub enum Resume {
    /// Enter the state.
    Enter {
        /// The state.
        state: StateId,
    },
    /// Start the current state's enter action.
    EnterAction,
    /// Fire a transition of the current state.
    Fire {
        /// Its index.
        transition: usize,
        /// What fired it.
        trigger: String,
    },
    /// Start the action of a transition of the current state.
    TransitionAction {
        /// Its index.
        transition: usize,
    },
    /// Start the current state's exit action, then enter `next`.
    ExitAction {
        /// The state to enter afterwards.
        next: StateId,
    },
}

/// A pause: where, how to go on, and the status to go back to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pause {
    /// The point it stopped at.
    pub at: Breakpoint,
    /// How it goes on.
    pub resume: Resume,
    /// Its status before it paused.
    pub status: Status,
}

/// The debugger's part of an instance, absent while no breakpoint was ever recorded for it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Debug {
    /// The breakpoints last recorded for the instance.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub breakpoints: Vec<Breakpoint>,
    /// Set by a `step`: pause at the next breakpoint-able point.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stepping: bool,
    /// The pause, while paused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<Pause>,
    /// Inputs that arrived while paused, oldest first, handled once resumed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<Timed>,
}

impl Debug {
    /// Whether there is nothing to keep (the instance is as if never debugged).
    pub fn idle(&self) -> bool {
        self.breakpoints.is_empty() && !self.stepping && self.paused.is_none() && self.held.is_empty()
    }
}

/// The trigger names the engine uses, as `'static` strings.
pub(crate) fn trigger(name: &str) -> &'static str {
    match name {
        "implicit" => "implicit",
        "events" => "events",
        "timeout" => "timeout",
        _ => "condition",
    }
}
