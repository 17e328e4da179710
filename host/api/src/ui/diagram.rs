//! A definition's state diagram as SVG, drawn here so the inspector needs no layout library and no
//! CDN: states in columns by their distance from the start state, transitions as curves between
//! them, and the marks of an instance (current state, visited states, fired transitions).
//!
//! SM4C definitions are drawn from their compiled states (labels as `sm4c graph` writes them);
//! ASL definitions from their validated blocks, walked as `sm4c graph` walks them
//! ([`sm4c_host::asl_graph`]): each Parallel branch and each Map item processor is drawn inside the
//! state that runs it, as a framed block with its own start, states and edges (`<g class="block">`),
//! the branches of a Parallel one under the other.

use sm4c_host::asl_graph::{self, To};
use sm4c_host::graph::label;
use sm4c_runtime::asl::model::AslMachine;
use sm4c_runtime::Machine;
use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::fmt::Write;

/// A diagram before layout: named states and labelled edges.
#[derive(Debug, Default)]
pub struct Graph {
    /// State names; a `true` is a state that ends the instance (or its block).
    pub nodes: Vec<(String, bool)>,
    /// The start state.
    pub start: usize,
    /// (from, to, label); `to == None` ends the instance.
    pub edges: Vec<(usize, Option<usize>, String)>,
    /// The blocks drawn inside states (an ASL Parallel's branches, a Map's item processor).
    pub blocks: Vec<Block>,
}

/// A block of states drawn inside a state of the graph that holds it.
#[derive(Debug)]
pub struct Block {
    /// The state that runs it, in the graph that holds it.
    pub state: usize,
    /// What it is: `branch 1`, `item processor`.
    pub caption: String,
    /// Its index among the ASL machine's blocks, which keys its marks ([`Marks::blocks`]).
    pub key: usize,
    /// Its states and edges.
    pub graph: Graph,
}

/// What an instance has done, to mark on its diagram.
#[derive(Debug, Default)]
pub struct Marks {
    /// The states it is in: one, or for an ASL execution the states its running branches and
    /// iterations are in as well (in [`Marks::blocks`]).
    pub current: HashSet<String>,
    /// States it entered.
    pub visited: HashSet<String>,
    /// Transitions it took, as (from, to) state names.
    pub fired: HashSet<(String, String)>,
    /// The marks of the nested blocks, by [`Block::key`] (the top-level marks' only).
    pub blocks: HashMap<usize, Marks>,
}

impl Marks {
    /// The marks of block `key` (`0`: the top-level block, these marks), made when missing.
    pub fn block(&mut self, key: usize) -> &mut Marks {
        if key == 0 {
            self
        } else {
            self.blocks.entry(key).or_default()
        }
    }
}

/// The graph of a definition.
pub fn graph(m: &Machine) -> Graph {
    if let Some(asl) = &m.asl {
        return asl_block(m, asl, 0);
    }
    let mut g = Graph {
        nodes: m
            .states
            .iter()
            .map(|s| (s.name.clone(), s.transitions.is_empty()))
            .collect(),
        start: m.start,
        ..Graph::default()
    };
    for (i, s) in m.states.iter().enumerate() {
        for t in &s.transitions {
            g.edges.push((i, Some(t.next.unwrap_or(i)), label(m, t)));
        }
    }
    g
}

/// Block `b` of an ASL machine (`0`: the top level), with the blocks nested in its states.
fn asl_block(m: &Machine, asl: &AslMachine, b: usize) -> Graph {
    let block = &asl.graphs[b];
    let mut g = Graph {
        nodes: block.states.iter().map(|s| (s.name.clone(), false)).collect(),
        start: block.start,
        ..Graph::default()
    };
    for e in asl_graph::edges(m, asl, b) {
        match e.to {
            To::State(t) => g.edges.push((e.from, Some(t), e.label)),
            To::End => g.nodes[e.from].1 = true,
        }
    }
    for (i, st) in block.states.iter().enumerate() {
        for (key, caption) in asl_graph::children(&st.kind) {
            g.blocks.push(Block {
                state: i,
                caption,
                key,
                graph: asl_block(m, asl, key),
            });
        }
    }
    g
}

const NODE_H: i64 = 34;
const ROW: i64 = 64;
const GAP: i64 = 150;
const MARGIN: i64 = 24;
const MAX_LABEL: usize = 34;
/// Space between a state holding blocks and its blocks' frames, and under the last one.
const PAD: i64 = 10;
/// Space between two blocks of one state.
const BLOCK_GAP: i64 = 8;
/// Least space between the columns of a nested block, and of a diagram holding blocks.
const NESTED_GAP: i64 = 56;
const TOP_GAP: i64 = 80;
/// Where a nested block's first column and first row start (room for its start dot and caption).
const NESTED_LEFT: i64 = 36;
const NESTED_TOP: i64 = 28;

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

/// Where a graph's states go, in the graph's own coordinates.
struct Layout {
    col: Vec<usize>,
    col_w: Vec<i64>,
    /// Top left corner of each state.
    pos: Vec<(i64, i64)>,
    /// Height of each state (taller when it holds blocks).
    height: Vec<i64>,
    /// Per block of `Graph::blocks`: its frame's top left corner and width, and its layout.
    blocks: Vec<(i64, i64, i64, Layout)>,
    w: i64,
    h: i64,
}

/// Lays `g` out: the top level with the margins it always had, a nested block tighter.
fn layout(g: &Graph, top: bool) -> Layout {
    let inner: Vec<Layout> = g.blocks.iter().map(|b| layout(&b.graph, false)).collect();
    let n = g.nodes.len();
    let mut min_w: Vec<i64> = g.nodes.iter().map(|(name, _)| width(name)).collect();
    let mut height = vec![NODE_H; n];
    let mut holds = vec![0usize; n];
    for (b, l) in g.blocks.iter().zip(&inner) {
        min_w[b.state] = min_w[b.state].max(l.w + 2 * PAD);
        height[b.state] += l.h + if holds[b.state] == 0 { PAD } else { BLOCK_GAP };
        holds[b.state] += 1;
    }
    let col = columns(g);
    let ncols = col.iter().max().map_or(0, |c| c + 1);
    let mut col_w = vec![0i64; ncols];
    for i in 0..n {
        col_w[col[i]] = col_w[col[i]].max(min_w[i]);
    }
    // Room between columns for the longest label: always the full gap at the top level of a
    // diagram without blocks (as SM4C diagrams always were), less in and around nested blocks.
    let longest = g
        .edges
        .iter()
        .map(|e| short(&e.2).chars().count() as i64)
        .max()
        .unwrap_or(0);
    let gap = if top && g.blocks.is_empty() {
        GAP
    } else {
        (longest * 6 + 32).clamp(if top { TOP_GAP } else { NESTED_GAP }, GAP)
    };
    let (left, first_row) = if top {
        (MARGIN + 30, MARGIN + 20)
    } else {
        (NESTED_LEFT, NESTED_TOP)
    };
    let mut xs = vec![left; ncols];
    for c in 1..ncols {
        xs[c] = xs[c - 1] + col_w[c - 1] + gap;
    }
    let mut stack = vec![0i64; ncols];
    let mut pos = vec![(0i64, 0i64); n];
    for i in 0..n {
        pos[i] = (xs[col[i]], first_row + stack[col[i]]);
        stack[col[i]] += height[i] + ROW - NODE_H;
    }
    let mut blocks = Vec::new();
    let mut below = vec![NODE_H + PAD; n];
    for (b, l) in g.blocks.iter().zip(inner) {
        let (x, y) = pos[b.state];
        let frame_w = width(&g.nodes[b.state].0).max(col_w[col[b.state]]) - 2 * PAD;
        blocks.push((x + PAD, y + below[b.state] - PAD, frame_w, l));
        below[b.state] += blocks.last().map_or(0, |b| b.3.h) + BLOCK_GAP;
    }
    let right = xs.last().copied().unwrap_or(MARGIN) + col_w.last().copied().unwrap_or(0);
    let (w, h) = if top {
        (
            right + MARGIN + 40,
            MARGIN * 2 + stack.iter().max().copied().unwrap_or(ROW) + 20,
        )
    } else {
        // Room under the states for the arcs of edges going back.
        let arcs = g
            .edges
            .iter()
            .any(|(f, t, _)| t.is_some_and(|t| t != *f && col[t] <= col[*f]));
        (
            right + 14,
            first_row + stack.iter().max().copied().unwrap_or(ROW) - (ROW - NODE_H) + if arcs { 48 } else { 12 },
        )
    };
    Layout {
        col,
        col_w,
        pos,
        height,
        blocks,
        w,
        h,
    }
}

/// The diagram as an SVG document, with `marks` as classes: `current`, `visited` on states
/// (`<g class="state" data-state="NAME">`) and `fired` on transitions. A nested block is a
/// `<g class="block" data-block="KEY" data-parent="STATE">` drawn over the state that runs it, its
/// states and edges marked from `marks.blocks[KEY]`.
pub fn svg(g: &Graph, marks: &Marks) -> String {
    let l = layout(g, true);
    let (w, h) = (l.w, l.h);
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"diagram\" viewBox=\"0 0 {w} {h}\" width=\"{w}\" height=\"{h}\" role=\"img\">\
<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" markerUnits=\"userSpaceOnUse\" markerWidth=\"9\" markerHeight=\"9\" orient=\"auto-start-reverse\"><path d=\"M0,0 L10,5 L0,10 z\" class=\"arrowhead\"/></marker></defs>"
    );
    draw(g, &l, marks, marks, &mut out);
    out += "</svg>";
    out
}

/// Draws `g` laid out as `l` with its marks `own`; `all` holds the marks of the nested blocks.
fn draw(g: &Graph, l: &Layout, own: &Marks, all: &Marks, out: &mut String) {
    let (col, col_w, pos) = (&l.col, &l.col_w, &l.pos);
    let ends: BTreeSet<usize> = g.edges.iter().filter(|e| e.1.is_none()).map(|e| e.0).collect();
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
        let fired = own.fired.contains(&(fname.clone(), tname.clone()));
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
            let (x1, y1) = (fx + fw / 2, fy + l.height[*from]);
            let (x2, y2) = (tx + width(tname) / 2, ty + l.height[to]);
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
        *out += "</g>";
    }
    for (i, (name, end)) in g.nodes.iter().enumerate() {
        let (x, y) = pos[i];
        let (nw, nh) = (width(name).max(col_w[col[i]]), l.height[i]);
        let mut class = String::from("state");
        if own.visited.contains(name) {
            class += " visited";
        }
        if own.current.contains(name) {
            class += " current";
        }
        if *end || ends.contains(&i) {
            class += " final";
        }
        let _ = write!(
            out,
            "<g class=\"{class}\" data-state=\"{n}\"><title>{n}</title><rect x=\"{x}\" y=\"{y}\" width=\"{nw}\" height=\"{nh}\" rx=\"10\"/>",
            n = esc(name)
        );
        if *end {
            let _ = write!(
                out,
                "<rect class=\"inner\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" rx=\"8\"/>",
                x + 3,
                y + 3,
                nw - 6,
                nh - 6
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
    let none = Marks::default();
    for (b, (x, y, frame_w, inner)) in g.blocks.iter().zip(&l.blocks) {
        let parent = esc(&g.nodes[b.state].0);
        let caption = esc(&b.caption);
        let _ = write!(
            out,
            "<g class=\"block\" data-block=\"{}\" data-parent=\"{parent}\" transform=\"translate({x},{y})\"><title>{parent}: {caption}</title><rect class=\"frame\" x=\"0\" y=\"0\" width=\"{frame_w}\" height=\"{}\" rx=\"6\"/><text class=\"caption\" x=\"8\" y=\"15\">{caption}</text>",
            b.key, inner.h
        );
        draw(&b.graph, inner, all.blocks.get(&b.key).unwrap_or(&none), all, out);
        *out += "</g>";
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_states() -> Graph {
        Graph {
            nodes: vec![("Wait".into(), false), ("Done <&>".into(), true)],
            start: 0,
            edges: vec![(0, Some(1), "on paid".into()), (0, Some(0), "after 1s".into())],
            blocks: Vec::new(),
        }
    }

    #[test]
    fn states_carry_their_marks_and_names_are_escaped() {
        let marks = Marks {
            current: ["Done <&>".to_string()].into(),
            visited: ["Wait".to_string(), "Done <&>".to_string()].into(),
            fired: [("Wait".to_string(), "Done <&>".to_string())].into(),
            ..Marks::default()
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

    /// An ASL document loaded as the server loads it.
    pub(crate) fn machine(doc: serde_json::Value) -> Machine {
        sm4c_runtime::load(&doc, &mut sm4c_runtime::no_files, sm4c_runtime::LoadOptions::default())
            .expect("a valid definition")
    }

    #[test]
    fn an_asl_document_is_drawn_from_its_top_level_block() {
        let m = machine(serde_json::json!({"sm4c:id": "choice", "StartAt": "A", "States": {
            "A": {"Type": "Choice", "Choices": [{"Variable": "$.x", "NumericEquals": 1, "Next": "B"}], "Default": "C"},
            "B": {"Type": "Pass", "End": true},
            "C": {"Type": "Fail"}
        }}));
        let g = graph(&m);
        assert_eq!(g.nodes.len(), 3);
        assert_eq!(g.edges.len(), 2);
        assert!(g.nodes[1].1 && g.nodes[2].1);
        assert!(g.blocks.is_empty());
        assert!(g.edges.iter().any(|e| e.2 == "$.x NumericEquals 1"), "{:?}", g.edges);
    }

    /// A Parallel with two branches (2 and 3 states), then a Map with a 2-state processor.
    pub(crate) fn nested() -> Machine {
        machine(
            serde_json::json!({"sm4c:id": "nested", "StartAt": "Prepare", "States": {
                "Prepare": {"Type": "Pass", "Next": "Both"},
                "Both": {"Type": "Parallel", "Next": "Each", "Branches": [
                    {"StartAt": "Left", "States": {
                        "Left": {"Type": "Pass", "Next": "LeftDone"},
                        "LeftDone": {"Type": "Pass", "End": true}}},
                    {"StartAt": "Right", "States": {
                        "Right": {"Type": "Wait", "Seconds": 60, "Next": "RightCheck"},
                        "RightCheck": {"Type": "Choice", "Choices": [
                            {"Variable": "$.ok", "BooleanEquals": true, "Next": "RightDone"}], "Default": "Right"},
                        "RightDone": {"Type": "Succeed"}}}
                ]},
                "Each": {"Type": "Map", "ItemsPath": "$.items", "End": true, "ItemProcessor": {
                    "StartAt": "Item", "States": {
                        "Item": {"Type": "Pass", "Next": "ItemDone"},
                        "ItemDone": {"Type": "Pass", "End": true}}}}
            }}),
        )
    }

    /// The `<g class="block" ...>` of `key` in `s`, up to its end.
    fn block(s: &str, key: usize) -> &str {
        let at = s
            .find(&format!("<g class=\"block\" data-block=\"{key}\""))
            .expect("the block");
        let mut depth = 0;
        let mut i = at;
        loop {
            let open = s[i + 1..].find("<g ").map(|o| o + i + 1);
            let close = s[i + 1..].find("</g>").map(|c| c + i + 1).expect("closed");
            match open {
                Some(o) if o < close => {
                    depth += 1;
                    i = o;
                }
                _ if depth == 0 => return &s[at..close + 4],
                _ => {
                    depth -= 1;
                    i = close;
                }
            }
        }
    }

    #[test]
    fn parallel_branches_and_map_processors_are_drawn_inside_their_state() {
        let m = nested();
        let g = graph(&m);
        assert_eq!(g.blocks.len(), 3, "{:?}", g.blocks);
        let s = svg(&g, &Marks::default());
        for name in [
            "Prepare",
            "Both",
            "Each",
            "Left",
            "LeftDone",
            "Right",
            "RightCheck",
            "RightDone",
            "Item",
            "ItemDone",
        ] {
            assert!(s.contains(&format!("data-state=\"{name}\"")), "{name}: {s}");
        }
        let left = block(&s, 1);
        assert!(left.contains("data-parent=\"Both\""), "{left}");
        assert!(left.contains("<title>Both: branch 1</title>"), "{left}");
        assert!(
            left.contains("<g class=\"edge\" data-from=\"Left\" data-to=\"LeftDone\">"),
            "{left}"
        );
        assert!(left.contains("class=\"state final\" data-state=\"LeftDone\""), "{left}");
        assert!(!left.contains("data-state=\"Right\""), "{left}");
        let right = block(&s, 2);
        assert!(right.contains("<title>Both: branch 2</title>"), "{right}");
        assert!(right.contains("data-from=\"Right\" data-to=\"RightCheck\""), "{right}");
        assert!(
            right.contains("data-from=\"RightCheck\" data-to=\"RightDone\""),
            "{right}"
        );
        assert!(right.contains("data-from=\"RightCheck\" data-to=\"Right\""), "{right}");
        assert!(right.contains(">after 60 s</text>"), "{right}");
        let items = block(&s, 3);
        assert!(items.contains("data-parent=\"Each\""), "{items}");
        assert!(items.contains(">item processor</text>"), "{items}");
        assert!(items.contains("data-from=\"Item\" data-to=\"ItemDone\""), "{items}");
        // The top-level edges stay outside the blocks.
        assert!(
            s.contains("<g class=\"edge\" data-from=\"Both\" data-to=\"Each\">"),
            "{s}"
        );
        // Each block lies within its state's box, and the branches one under the other.
        let l = layout(&g, true);
        for (b, (x, y, w, inner)) in g.blocks.iter().zip(&l.blocks) {
            let (sx, sy) = l.pos[b.state];
            let sw = width(&g.nodes[b.state].0).max(l.col_w[l.col[b.state]]);
            assert!(*x > sx && *y >= sy + NODE_H && x + w < sx + sw, "{b:?}");
            assert!(y + inner.h < sy + l.height[b.state], "{b:?}");
            assert!(*w >= inner.w, "{b:?}");
        }
        assert!(l.blocks[1].1 > l.blocks[0].1 + l.blocks[0].3.h);
        assert!(
            s.starts_with("<svg ") && s.ends_with("</svg>") && !s.contains("href"),
            "self-contained"
        );
    }

    #[test]
    fn nested_states_carry_the_marks_of_their_block() {
        let m = nested();
        let mut marks = Marks::default();
        marks.visited.extend(["Prepare".to_string(), "Both".to_string()]);
        marks.current.insert("Both".to_string());
        marks.fired.insert(("Prepare".into(), "Both".into()));
        let left = marks.block(1);
        left.visited.extend(["Left".to_string(), "LeftDone".to_string()]);
        left.fired.insert(("Left".into(), "LeftDone".into()));
        let right = marks.block(2);
        right.visited.insert("Right".into());
        right.current.insert("Right".into());
        let s = svg(&graph(&m), &marks);
        assert!(s.contains("class=\"state visited current\" data-state=\"Both\""), "{s}");
        let left = block(&s, 1);
        assert!(left.contains("class=\"state visited\" data-state=\"Left\""), "{left}");
        assert!(
            left.contains("class=\"state visited final\" data-state=\"LeftDone\""),
            "{left}"
        );
        assert!(
            left.contains("<g class=\"edge fired\" data-from=\"Left\" data-to=\"LeftDone\">"),
            "{left}"
        );
        let right = block(&s, 2);
        assert!(
            right.contains("class=\"state visited current\" data-state=\"Right\""),
            "{right}"
        );
        assert!(right.contains("class=\"state\" data-state=\"RightCheck\""), "{right}");
        let items = block(&s, 3);
        assert!(items.contains("class=\"state\" data-state=\"Item\""), "{items}");
        assert!(!items.contains("visited"), "{items}");
    }
}
