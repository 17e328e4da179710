//! State diagrams of definitions in the Amazon States Language: every `StartAt`/`States` block
//! with its `Next`, Choice rules and `Default`, `Catch` and end states; Parallel branches and Map
//! processors are drawn inside their state (Mermaid composite states, dot clusters).
//!
//! Labels come from the definition as written (`Machine::source`), so they read as the author
//! wrote them.

use crate::graph::{marked, Untested, DOT_UNTESTED};
use serde_json::Value;
use sm4c_runtime::asl::model::{AslMachine, Kind};
use sm4c_runtime::model::Machine;

/// Where an edge goes.
pub enum To {
    /// A state of the same block.
    State(usize),
    /// Out of the block: it ends (its run, or the execution).
    End,
}

/// One edge of a block: from state, to, label, and whether it is an error path (`Catch`).
pub struct Edge {
    /// The state it leaves.
    pub from: usize,
    /// Where it goes.
    pub to: To,
    /// Its label, from the definition as written (empty: none).
    pub label: String,
    /// True for a `Catch`.
    pub catch: bool,
    /// The JSON pointer that names it in coverage (`.../Next`, `.../Choices/0`, `.../Default`,
    /// `.../Catch/0`); none for the way out of a Succeed or Fail state.
    pub pointer: Option<String>,
}

/// The node id of state `s` of graph `g`.
fn node(g: usize, s: usize) -> String {
    format!("g{g}s{s}")
}

/// The child blocks a state runs, and draws inside itself: (graph index, caption), a Parallel's
/// branches (`branch 1`, ...) or a Map's `item processor`.
pub fn children(kind: &Kind) -> Vec<(usize, String)> {
    match kind {
        Kind::Parallel { branches } => branches
            .iter()
            .enumerate()
            .map(|(i, g)| (*g, format!("branch {}", i + 1)))
            .collect(),
        Kind::Map(spec) => vec![(spec.processor, "item processor".into())],
        _ => Vec::new(),
    }
}

fn type_name(kind: &Kind) -> &'static str {
    match kind {
        Kind::Pass { .. } => "Pass",
        Kind::Task { .. } => "Task",
        Kind::Choice { .. } => "Choice",
        Kind::Wait { .. } => "Wait",
        Kind::Succeed => "Succeed",
        Kind::Fail { .. } => "Fail",
        Kind::Parallel { .. } => "Parallel",
        Kind::Map(_) => "Map",
    }
}

/// A JSON value as a label shows it: strings bare, the rest as JSON.
fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A Choice rule as written, in one line: `$.x NumericEquals 1`, `(a) and (b)`, `not (a)`, or
/// a JSONata `Condition`.
pub fn rule_text(rule: &Value) -> String {
    let Some(o) = rule.as_object() else {
        return text(rule);
    };
    if let Some(c) = o.get("Condition") {
        return text(c);
    }
    let many = |key: &str, joiner: &str| {
        o.get(key).and_then(Value::as_array).map(|rs| {
            rs.iter()
                .map(|r| format!("({})", rule_text(r)))
                .collect::<Vec<_>>()
                .join(joiner)
        })
    };
    if let Some(t) = many("And", " and ") {
        return t;
    }
    if let Some(t) = many("Or", " or ") {
        return t;
    }
    if let Some(r) = o.get("Not") {
        return format!("not ({})", rule_text(r));
    }
    let variable = o.get("Variable").map(text).unwrap_or_default();
    let test = o
        .iter()
        .find(|(k, _)| !matches!(k.as_str(), "Variable" | "Next" | "Assign" | "Output" | "Comment"));
    match test {
        Some((op, v)) => format!("{variable} {op} {}", text(v)),
        None => variable,
    }
}

/// The label of a Wait state's way out: how long it waits.
fn wait_label(src: &Value) -> String {
    if let Some(s) = src.get("Seconds") {
        format!("after {} s", text(s))
    } else if let Some(p) = src.get("SecondsPath") {
        format!("after {} s", text(p))
    } else if let Some(t) = src.get("Timestamp") {
        format!("at {}", text(t))
    } else if let Some(p) = src.get("TimestampPath") {
        format!("at {}", text(p))
    } else {
        String::new()
    }
}

/// The edges of block `g` of `asl` (`0`: the machine's own), with labels from `m.source`: Choice
/// rules as written, `Default`, `Catch ERRORS`, a Wait's delay, and the ways out of the block.
pub fn edges(m: &Machine, asl: &AslMachine, g: usize) -> Vec<Edge> {
    let mut out = Vec::new();
    for (i, st) in asl.graphs[g].states.iter().enumerate() {
        let src = m.source.pointer(&st.pointer).cloned().unwrap_or(Value::Null);
        match &st.kind {
            Kind::Choice { choices, default } => {
                let rules = src.get("Choices").and_then(Value::as_array);
                for (n, c) in choices.iter().enumerate() {
                    let label = rules.and_then(|r| r.get(n)).map(rule_text).unwrap_or_default();
                    out.push(Edge {
                        from: i,
                        to: To::State(c.next),
                        label,
                        catch: false,
                        pointer: Some(format!("{}/Choices/{n}", st.pointer)),
                    });
                }
                if let Some(d) = default {
                    out.push(Edge {
                        from: i,
                        to: To::State(*d),
                        label: "Default".into(),
                        catch: false,
                        pointer: Some(format!("{}/Default", st.pointer)),
                    });
                }
            }
            Kind::Succeed | Kind::Fail { .. } => out.push(Edge {
                from: i,
                to: To::End,
                label: if matches!(st.kind, Kind::Fail { .. }) {
                    src.get("Error")
                        .map(|e| format!("fails {}", text(e)))
                        .unwrap_or_else(|| "fails".into())
                } else {
                    String::new()
                },
                catch: false,
                pointer: None,
            }),
            kind => {
                let label = if matches!(kind, Kind::Wait { .. }) {
                    wait_label(&src)
                } else {
                    String::new()
                };
                out.push(Edge {
                    from: i,
                    to: st.next.map_or(To::End, To::State),
                    label,
                    catch: false,
                    pointer: st.next.map(|_| format!("{}/Next", st.pointer)),
                });
            }
        }
        for (n, c) in st.catch.iter().enumerate() {
            out.push(Edge {
                from: i,
                to: To::State(c.next),
                label: format!("Catch {}", c.errors.join(", ")),
                catch: true,
                pointer: Some(format!("{}/Catch/{n}", st.pointer)),
            });
        }
    }
    out
}

fn mermaid_text(s: &str) -> String {
    s.replace(';', ",").replace('\n', " ").replace(':', "꞉")
}

fn mermaid_block(m: &Machine, asl: &AslMachine, g: usize, indent: &str, untested: Option<&Untested>, out: &mut String) {
    let graph = &asl.graphs[g];
    for (i, st) in graph.states.iter().enumerate() {
        out.push_str(&format!("{indent}{} : {}\n", node(g, i), mermaid_text(&st.name)));
    }
    out.push_str(&format!("{indent}[*] --> {}\n", node(g, graph.start)));
    for e in edges(m, asl, g) {
        let to = match e.to {
            To::State(s) => node(g, s),
            To::End => "[*]".into(),
        };
        let from = node(g, e.from);
        let (label, _) = marked(e.label, e.pointer.as_deref(), untested);
        if label.is_empty() {
            out.push_str(&format!("{indent}{from} --> {to}\n"));
        } else {
            out.push_str(&format!("{indent}{from} --> {to} : {}\n", mermaid_text(&label)));
        }
    }
    for (i, st) in graph.states.iter().enumerate() {
        let kids = children(&st.kind);
        if kids.is_empty() {
            continue;
        }
        out.push_str(&format!("{indent}state {} {{\n", node(g, i)));
        let inner = format!("{indent}    ");
        for (n, (child, _)) in kids.iter().enumerate() {
            if n > 0 {
                // Parallel branches are concurrent regions.
                out.push_str(&format!("{inner}--\n"));
            }
            mermaid_block(m, asl, *child, &inner, untested, out);
        }
        out.push_str(&format!("{indent}}}\n"));
    }
}

/// The diagram of an ASL definition in Mermaid `stateDiagram-v2` syntax; the edges in `untested`
/// are labelled `✗ untested`.
pub fn mermaid(m: &Machine, asl: &AslMachine, untested: Option<&Untested>) -> String {
    let mut out = String::from("stateDiagram-v2\n");
    mermaid_block(m, asl, 0, "    ", untested, &mut out);
    out
}

fn dot_text(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

fn dot_block(m: &Machine, asl: &AslMachine, g: usize, indent: &str, untested: Option<&Untested>, out: &mut String) {
    let graph = &asl.graphs[g];
    let start = format!("g{g}__start");
    let end = format!("g{g}__end");
    out.push_str(&format!("{indent}{start} [shape=point];\n"));
    let edges = edges(m, asl, g);
    if edges.iter().any(|e| matches!(e.to, To::End)) {
        out.push_str(&format!(
            "{indent}{end} [shape=doublecircle, label=\"\", width=0.15];\n"
        ));
    }
    for (i, st) in graph.states.iter().enumerate() {
        let shape = match st.kind {
            Kind::Choice { .. } => ", shape=diamond, style=\"\"",
            Kind::Succeed | Kind::Fail { .. } => ", peripheries=2",
            _ => "",
        };
        out.push_str(&format!(
            "{indent}{} [label=\"{}\\n({})\"{shape}];\n",
            node(g, i),
            dot_text(&st.name),
            type_name(&st.kind)
        ));
    }
    out.push_str(&format!("{indent}{start} -> {};\n", node(g, graph.start)));
    for e in &edges {
        let to = match e.to {
            To::State(s) => node(g, s),
            To::End => end.clone(),
        };
        let (label, miss) = marked(e.label.clone(), e.pointer.as_deref(), untested);
        let style = match (e.catch, miss) {
            (true, true) => format!(", style=dashed{DOT_UNTESTED}"),
            (false, true) => DOT_UNTESTED.to_string(),
            (true, false) => ", style=dashed, color=red".to_string(),
            (false, false) => String::new(),
        };
        out.push_str(&format!(
            "{indent}{} -> {to} [label=\"{}\"{style}];\n",
            node(g, e.from),
            dot_text(&label)
        ));
    }
    for (i, st) in graph.states.iter().enumerate() {
        for (child, caption) in children(&st.kind) {
            out.push_str(&format!("{indent}subgraph cluster_g{child} {{\n"));
            let inner = format!("{indent}    ");
            out.push_str(&format!(
                "{inner}label=\"{} {caption}\";\n{inner}style=dashed;\n",
                dot_text(&st.name)
            ));
            dot_block(m, asl, child, &inner, untested, out);
            out.push_str(&format!("{indent}}}\n"));
            // The state runs the block: a dotted edge into its start.
            out.push_str(&format!(
                "{indent}{} -> g{child}__start [style=dotted, arrowhead=none, label=\"{caption}\"];\n",
                node(g, i)
            ));
        }
    }
}

/// The diagram of an ASL definition in Graphviz dot syntax; the edges in `untested` are drawn
/// orange and labelled `✗ untested`.
pub fn dot(m: &Machine, asl: &AslMachine, untested: Option<&Untested>) -> String {
    let mut out = format!(
        "digraph \"{}\" {{\n    rankdir=LR;\n    node [shape=box, style=rounded];\n",
        dot_text(&m.id)
    );
    dot_block(m, asl, 0, "    ", untested, &mut out);
    out += "}\n";
    out
}
