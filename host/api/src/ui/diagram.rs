//! A definition's state diagram as SVG, drawn here so the inspector needs no layout library and no
//! CDN: states in columns by their distance from the start state, transitions as curves between
//! them, and the marks of an instance (current state, visited states, fired transitions).
//!
//! SM4C definitions are drawn from their compiled states (labels as `sm4c graph` writes them);
//! ASL definitions from their top-level `StartAt`/`States` block (Parallel branches and Map
//! processors are drawn as the one state that holds them).

use serde_json::Value;
use sm4c_host::graph::label;
use sm4c_runtime::Machine;
use std::collections::{BTreeSet, HashSet, VecDeque};
use std::fmt::Write;

/// A diagram before layout: named states and labelled edges.
#[derive(Debug, Default)]
pub struct Graph {
    /// State names; a `true` is a state that ends the instance.
    pub nodes: Vec<(String, bool)>,
    /// The start state.
    pub start: usize,
    /// (from, to, label); `to == None` ends the instance.
    pub edges: Vec<(usize, Option<usize>, String)>,
}

/// What an instance has done, to mark on its diagram.
#[derive(Debug, Default)]
pub struct Marks {
    /// The state it is in.
    pub current: Option<String>,
    /// States it entered.
    pub visited: HashSet<String>,
    /// Transitions it took, as (from, to) state names.
    pub fired: HashSet<(String, String)>,
}

/// The graph of a definition.
pub fn graph(m: &Machine) -> Graph {
    if m.asl.is_some() {
        return asl(&m.source);
    }
    let mut g = Graph {
        nodes: m
            .states
            .iter()
            .map(|s| (s.name.clone(), s.transitions.is_empty()))
            .collect(),
        start: m.start,
        edges: Vec::new(),
    };
    for (i, s) in m.states.iter().enumerate() {
        for t in &s.transitions {
            g.edges.push((i, Some(t.next.unwrap_or(i)), label(m, t)));
        }
    }
    g
}

/// The top-level block of an ASL document, from the document as written.
fn asl(source: &Value) -> Graph {
    let Some(states) = source.get("States").and_then(Value::as_object) else {
        return Graph::default();
    };
    let names: Vec<&String> = states.keys().collect();
    let index = |n: &Value| n.as_str().and_then(|n| names.iter().position(|k| *k == n));
    let mut g = Graph {
        start: source.get("StartAt").and_then(&index).unwrap_or(0),
        ..Graph::default()
    };
    for (i, (name, st)) in states.iter().enumerate() {
        let ty = st.get("Type").and_then(Value::as_str).unwrap_or("");
        let ends = st.get("End") == Some(&Value::Bool(true)) || matches!(ty, "Succeed" | "Fail");
        g.nodes.push((name.clone(), ends));
        if let Some(n) = st.get("Next").and_then(&index) {
            g.edges.push((i, Some(n), String::new()));
        }
        for rule in st.get("Choices").and_then(Value::as_array).into_iter().flatten() {
            if let Some(n) = rule.get("Next").and_then(&index) {
                g.edges.push((i, Some(n), sm4c_host::asl_graph::rule_text(rule)));
            }
        }
        if let Some(n) = st.get("Default").and_then(&index) {
            g.edges.push((i, Some(n), "default".into()));
        }
        for c in st.get("Catch").and_then(Value::as_array).into_iter().flatten() {
            if let Some(n) = c.get("Next").and_then(&index) {
                let errors = c.get("ErrorEquals").map(|e| e.to_string()).unwrap_or_default();
                g.edges.push((i, Some(n), format!("catch {errors}")));
            }
        }
    }
    g
}

const NODE_H: i64 = 34;
const ROW: i64 = 64;
const GAP: i64 = 150;
const MARGIN: i64 = 24;
const MAX_LABEL: usize = 34;

fn width(name: &str) -> i64 {
    (name.chars().count() as i64 * 8 + 28).max(72)
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn short(s: &str) -> String {
    if s.chars().count() <= MAX_LABEL {
        return s.to_string();
    }
    let mut t: String = s.chars().take(MAX_LABEL - 1).collect();
    t.push('…');
    t
}

/// Columns: breadth-first distance from the start state; states it does not reach go after.
fn columns(g: &Graph) -> Vec<usize> {
    let n = g.nodes.len();
    let mut col = vec![usize::MAX; n];
    let mut queue = VecDeque::new();
    if n > 0 {
        col[g.start] = 0;
        queue.push_back(g.start);
    }
    while let Some(i) = queue.pop_front() {
        for (from, to, _) in &g.edges {
            if let (true, Some(t)) = (*from == i, *to) {
                if col[t] == usize::MAX {
                    col[t] = col[i] + 1;
                    queue.push_back(t);
                }
            }
        }
    }
    let last = col.iter().filter(|c| **c != usize::MAX).max().map_or(0, |c| c + 1);
    col.iter().map(|c| if *c == usize::MAX { last } else { *c }).collect()
}

/// The diagram as an SVG document, with `marks` as classes: `current`, `visited` on states
/// (`<g class="state" data-state="NAME">`) and `fired` on transitions.
pub fn svg(g: &Graph, marks: &Marks) -> String {
    let col = columns(g);
    let ncols = col.iter().max().map_or(0, |c| c + 1);
    let mut col_w = vec![0i64; ncols];
    let mut rows = vec![0i64; ncols];
    let mut pos = vec![(0i64, 0i64); g.nodes.len()];
    for (i, (name, _)) in g.nodes.iter().enumerate() {
        col_w[col[i]] = col_w[col[i]].max(width(name));
    }
    let mut xs = vec![MARGIN + 30; ncols];
    for c in 1..ncols {
        xs[c] = xs[c - 1] + col_w[c - 1] + GAP;
    }
    for (i, _) in g.nodes.iter().enumerate() {
        pos[i] = (xs[col[i]], MARGIN + 20 + rows[col[i]] * ROW);
        rows[col[i]] += 1;
    }
    let ends: BTreeSet<usize> = g.edges.iter().filter(|e| e.1.is_none()).map(|e| e.0).collect();
    let w = xs.last().copied().unwrap_or(MARGIN) + col_w.last().copied().unwrap_or(0) + MARGIN + 40;
    let h = MARGIN * 2 + rows.iter().max().copied().unwrap_or(1) * ROW + 20;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"diagram\" viewBox=\"0 0 {w} {h}\" width=\"{w}\" height=\"{h}\" role=\"img\">\
<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" markerUnits=\"userSpaceOnUse\" markerWidth=\"9\" markerHeight=\"9\" orient=\"auto-start-reverse\"><path d=\"M0,0 L10,5 L0,10 z\" class=\"arrowhead\"/></marker></defs>"
    );
    if let Some(&(sx, sy)) = pos.get(g.start) {
        let _ = write!(
            out,
            "<circle class=\"start\" cx=\"{}\" cy=\"{}\" r=\"6\"/><line class=\"edge\" x1=\"{}\" y1=\"{}\" x2=\"{sx}\" y2=\"{}\" marker-end=\"url(#arrow)\"/>",
            sx - 24,
            sy + NODE_H / 2,
            sx - 18,
            sy + NODE_H / 2,
            sy + NODE_H / 2
        );
    }
    for (k, (from, to, text)) in g.edges.iter().enumerate() {
        let Some(to) = *to else { continue };
        let (fname, tname) = (&g.nodes[*from].0, &g.nodes[to].0);
        let fired = marks.fired.contains(&(fname.clone(), tname.clone()));
        let class = if fired { "edge fired" } else { "edge" };
        let (fx, fy) = pos[*from];
        let (tx, ty) = pos[to];
        let fw = width(fname).max(col_w[col[*from]]);
        let (path, lx, ly) = if *from == to {
            let x = fx + fw / 2;
            (
                format!(
                    "M{},{fy} C{},{} {},{} {},{fy}",
                    x - 12,
                    x - 30,
                    fy - 34,
                    x + 30,
                    fy - 34,
                    x + 12
                ),
                x,
                fy - 30,
            )
        } else if col[to] > col[*from] {
            let (x1, y1, x2, y2) = (fx + fw, fy + NODE_H / 2, tx, ty + NODE_H / 2);
            let mx = (x1 + x2) / 2;
            (
                format!("M{x1},{y1} C{mx},{y1} {mx},{y2} {x2},{y2}"),
                mx,
                (y1 + y2) / 2 - 4,
            )
        } else {
            // Backwards or within a column: an arc under both states.
            let (x1, y1) = (fx + fw / 2, fy + NODE_H);
            let (x2, y2) = (tx + width(tname) / 2, ty + NODE_H);
            let dip = y1.max(y2) + 26 + (k as i64 % 3) * 8;
            (
                format!("M{x1},{y1} C{x1},{dip} {x2},{dip} {x2},{y2}"),
                (x1 + x2) / 2,
                dip - 2,
            )
        };
        let _ = write!(
            out,
            "<g class=\"{class}\" data-from=\"{}\" data-to=\"{}\"><title>{}</title><path d=\"{path}\" marker-end=\"url(#arrow)\"/>",
            esc(fname),
            esc(tname),
            esc(text)
        );
        if !text.is_empty() {
            let _ = write!(
                out,
                "<text class=\"label\" x=\"{lx}\" y=\"{ly}\" text-anchor=\"middle\">{}</text>",
                esc(&short(text))
            );
        }
        out += "</g>";
    }
    for (i, (name, end)) in g.nodes.iter().enumerate() {
        let (x, y) = pos[i];
        let nw = width(name).max(col_w[col[i]]);
        let mut class = String::from("state");
        if marks.visited.contains(name) {
            class += " visited";
        }
        if marks.current.as_deref() == Some(name.as_str()) {
            class += " current";
        }
        if *end || ends.contains(&i) {
            class += " final";
        }
        let _ = write!(
            out,
            "<g class=\"{class}\" data-state=\"{n}\"><title>{n}</title><rect x=\"{x}\" y=\"{y}\" width=\"{nw}\" height=\"{NODE_H}\" rx=\"10\"/>",
            n = esc(name)
        );
        if *end {
            let _ = write!(
                out,
                "<rect class=\"inner\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" rx=\"8\"/>",
                x + 3,
                y + 3,
                nw - 6,
                NODE_H - 6
            );
        }
        let _ = write!(
            out,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text></g>",
            x + nw / 2,
            y + NODE_H / 2 + 5,
            esc(name)
        );
    }
    out += "</svg>";
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_states() -> Graph {
        Graph {
            nodes: vec![("Wait".into(), false), ("Done <&>".into(), true)],
            start: 0,
            edges: vec![(0, Some(1), "on paid".into()), (0, Some(0), "after 1s".into())],
        }
    }

    #[test]
    fn states_carry_their_marks_and_names_are_escaped() {
        let marks = Marks {
            current: Some("Done <&>".into()),
            visited: ["Wait".to_string(), "Done <&>".to_string()].into(),
            fired: [("Wait".to_string(), "Done <&>".to_string())].into(),
        };
        let s = svg(&two_states(), &marks);
        assert!(s.contains("<g class=\"state visited\" data-state=\"Wait\">"), "{s}");
        assert!(
            s.contains("class=\"state visited current final\" data-state=\"Done &lt;&amp;&gt;\""),
            "{s}"
        );
        assert!(s.contains("<g class=\"edge fired\" data-from=\"Wait\""), "{s}");
        assert!(s.contains(">after 1s</text>"), "{s}");
    }

    #[test]
    fn unreached_states_get_a_column_after_the_others() {
        let mut g = two_states();
        g.nodes.push(("Orphan".into(), true));
        assert_eq!(columns(&g), vec![0, 1, 2]);
    }

    #[test]
    fn an_asl_document_is_drawn_from_its_top_level_block() {
        let doc = serde_json::json!({"StartAt": "A", "States": {
            "A": {"Type": "Choice", "Choices": [{"Variable": "$.x", "NumericEquals": 1, "Next": "B"}], "Default": "C"},
            "B": {"Type": "Pass", "End": true},
            "C": {"Type": "Fail"}
        }});
        let g = asl(&doc);
        assert_eq!(g.nodes.len(), 3);
        assert_eq!(g.edges.len(), 2);
        assert!(g.nodes[1].1 && g.nodes[2].1);
    }
}
