//! State diagrams of a definition, as Mermaid or Graphviz dot (ASL definitions: [`crate::asl_graph`]).

use sm4c_runtime::expr::strip;
use sm4c_runtime::model::{Machine, Transition, Trigger};
use sm4c_runtime::timespan;
use std::collections::BTreeSet;

/// The JSON pointers of the transitions to mark as untested (what `sm4c test --json` lists as
/// missed: `/states/1/transitions/0`; ASL: `/States/X/Next`, `/States/X/Choices/0`,
/// `/States/X/Default`, `/States/X/Catch/0`).
pub type Untested = BTreeSet<String>;

/// What an untested transition's label says.
pub const UNTESTED: &str = "untested";

/// The label of a transition, marked when it is in `untested`.
pub(crate) fn marked(label: String, pointer: Option<&str>, untested: Option<&Untested>) -> (String, bool) {
    let miss = matches!((pointer, untested), (Some(p), Some(u)) if u.contains(p));
    match (miss, label.is_empty()) {
        (false, _) => (label, false),
        (true, true) => (format!("✗ {UNTESTED}"), true),
        (true, false) => (format!("{label} ✗ {UNTESTED}"), true),
    }
}

/// A transition's label: its condition, events or timeout.
pub fn label(m: &Machine, t: &Transition) -> String {
    let mut parts = Vec::new();
    match t.trigger {
        Trigger::Implicit => {}
        Trigger::Condition => {}
        Trigger::Events => {
            let groups: Vec<String> = t
                .groups
                .iter()
                .map(|g| {
                    g.events
                        .iter()
                        .map(|e| m.events[*e].name.clone())
                        .collect::<Vec<_>>()
                        .join(" | ")
                })
                .collect();
            parts.push(format!("on {}", groups.join(" + ")));
        }
        Trigger::Timeout => parts.push(format!("after {}", timespan::format(t.timeout_ms.unwrap_or(0)))),
    }
    if let Some(c) = &t.condition {
        parts.push(format!("[{}]", strip(c.source())));
    }
    parts.join(" ")
}

fn mermaid_text(s: &str) -> String {
    s.replace(';', ",").replace('\n', " ").replace(':', "꞉")
}

/// The diagram in Mermaid `stateDiagram-v2` syntax.
pub fn mermaid(m: &Machine) -> String {
    mermaid_marked(m, None)
}

/// The diagram in Mermaid `stateDiagram-v2` syntax, with the transitions in `untested` labelled
/// `✗ untested`.
pub fn mermaid_marked(m: &Machine, untested: Option<&Untested>) -> String {
    if let Some(asl) = &m.asl {
        return crate::asl_graph::mermaid(m, asl, untested);
    }
    let mut out = String::from("stateDiagram-v2\n");
    for (i, s) in m.states.iter().enumerate() {
        out += &format!("    s{i} : {}\n", mermaid_text(&s.name));
    }
    out += &format!("    [*] --> s{}\n", m.start);
    for (i, s) in m.states.iter().enumerate() {
        if s.transitions.is_empty() {
            out += &format!("    s{i} --> [*]\n");
        }
        for (n, t) in s.transitions.iter().enumerate() {
            let to = t.next.unwrap_or(i);
            let pointer = format!("{}/transitions/{n}", s.pointer);
            let (l, _) = marked(label(m, t), Some(&pointer), untested);
            if l.is_empty() {
                out += &format!("    s{i} --> s{to}\n");
            } else {
                out += &format!("    s{i} --> s{to} : {}\n", mermaid_text(&l));
            }
        }
    }
    out
}

fn dot_text(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// The diagram in Graphviz dot syntax.
pub fn dot(m: &Machine) -> String {
    dot_marked(m, None)
}

/// Style of an untested transition in dot.
pub(crate) const DOT_UNTESTED: &str = ", color=orange, fontcolor=orange, penwidth=2";

/// The diagram in Graphviz dot syntax, with the transitions in `untested` drawn orange and
/// labelled `✗ untested`.
pub fn dot_marked(m: &Machine, untested: Option<&Untested>) -> String {
    if let Some(asl) = &m.asl {
        return crate::asl_graph::dot(m, asl, untested);
    }
    let mut out = format!(
        "digraph \"{}\" {{\n    rankdir=LR;\n    node [shape=box, style=rounded];\n    __start [shape=point];\n",
        dot_text(&m.id)
    );
    for (i, s) in m.states.iter().enumerate() {
        let extra = if s.transitions.is_empty() {
            ", peripheries=2"
        } else {
            ""
        };
        out += &format!("    s{i} [label=\"{}\"{extra}];\n", dot_text(&s.name));
    }
    out += &format!("    __start -> s{};\n", m.start);
    for (i, s) in m.states.iter().enumerate() {
        for (n, t) in s.transitions.iter().enumerate() {
            let to = t.next.unwrap_or(i);
            let pointer = format!("{}/transitions/{n}", s.pointer);
            let (l, miss) = marked(label(m, t), Some(&pointer), untested);
            let style = if miss { DOT_UNTESTED } else { "" };
            out += &format!("    s{i} -> s{to} [label=\"{}\"{style}];\n", dot_text(&l));
        }
    }
    out += "}\n";
    out
}
