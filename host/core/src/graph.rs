//! State diagrams of a definition, as Mermaid or Graphviz dot (ASL definitions: [`crate::asl_graph`]).

use sm4c_runtime::expr::strip;
use sm4c_runtime::model::{Machine, Transition, Trigger};
use sm4c_runtime::timespan;

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
    if let Some(asl) = &m.asl {
        return crate::asl_graph::mermaid(m, asl);
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
        for t in &s.transitions {
            let to = t.next.unwrap_or(i);
            let l = label(m, t);
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
    if let Some(asl) = &m.asl {
        return crate::asl_graph::dot(m, asl);
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
        for t in &s.transitions {
            let to = t.next.unwrap_or(i);
            out += &format!("    s{i} -> s{to} [label=\"{}\"];\n", dot_text(&label(m, t)));
        }
    }
    out += "}\n";
    out
}
