//! What the inspector shows of one instance, read through [`Backend`] only (so the same on SQLite
//! and Kafka): its record, its diagram with its marks, what it is waiting on, its steps with the
//! data after each, and its children.
//!
//! The data after each step is not stored: the journal is replayed here (the engine is
//! deterministic, so the fold gives the data each step left), up to [`MAX_ENTRIES`] entries.

use super::diagram::{self, Marks};
use serde_json::{json, Value};
use sm4c_host::driver::child_id;
use sm4c_host::service::{Backend, HostError};
use sm4c_runtime::asl::engine::{Run, Slot, Step};
use sm4c_runtime::asl::model::{AslMachine, Kind as AslKind};
use sm4c_runtime::engine::event::attribute_text;
use sm4c_runtime::engine::rfc3339;
use sm4c_runtime::json::{from_val, to_val};
use sm4c_runtime::model::Trigger;
use sm4c_runtime::{Effect, Entry, Input, Instance, Machine, Options, Snapshot, Trace};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

/// Most journal entries read and replayed for one instance page.
pub const MAX_ENTRIES: usize = 5000;

/// The page of instance `id`: `{instance, diagram, waiting, steps, children, truncated}`.
/// The journal is replayed in `work` ([`crate::work`]), off the async runtime's threads.
pub async fn instance(h: &Arc<dyn Backend>, id: &str, work: &crate::work::Work) -> Result<Value, crate::ApiError> {
    let record = crate::instances::instance_json(h, id)?;
    let stored = h
        .instance(id)?
        .ok_or_else(|| HostError::UnknownInstance(id.to_string()))?;
    let snap = &stored.snapshot;
    // Every version of its definition: a migrated instance's journal crosses several.
    let versions: BTreeMap<String, Arc<Machine>> = h
        .machines()
        .into_iter()
        .filter(|m| m.id == snap.definition)
        .map(|m| (m.version.clone(), m))
        .collect();
    let machine = versions.get(&snap.version).cloned();
    let mut journal = Vec::new();
    let mut after = 0;
    let mut history_error = None;
    while journal.len() < MAX_ENTRIES {
        match h.history(id, after, 1000).await {
            Ok(page) => {
                let full = page.len() == 1000;
                after = page.last().map_or(after, |r| r.0);
                journal.extend(page);
                if !full {
                    break;
                }
            }
            Err(e) => {
                history_error = Some(e.to_string());
                break;
            }
        }
    }
    let truncated = journal.len() >= MAX_ENTRIES;
    let (steps, marks, open) = match machine.clone() {
        Some(m) => {
            let id = id.to_string();
            work.run("the instance page's replay", move |_| {
                replay(&m, &versions, &id, &journal)
            })
            .await?
        }
        None => Default::default(),
    };
    let mut marks = marks;
    if !snap.status.is_final() {
        match (&snap.asl, machine.as_ref().and_then(|m| m.asl.as_deref())) {
            (Some(exec), Some(asl)) => mark_runs(&exec.root, asl, &mut marks),
            _ => marks.current.extend(snap.state_name.clone()),
        }
    }
    let diagram = machine.as_ref().map(|m| diagram::svg(&diagram::graph(m), &marks));
    let waiting = match &machine {
        Some(m) if !snap.status.is_final() => waiting(m, snap, &open),
        _ => json!({"events": [], "timers": [], "operations": []}),
    };
    let mut children = Vec::new();
    for step in &steps {
        for e in step["effects"].as_array().into_iter().flatten() {
            if e["effect"] == "startSubflow" {
                let child = child_id(id, e["op"].as_str().unwrap_or(""));
                let status = h
                    .instance(&child)
                    .ok()
                    .flatten()
                    .map(|s| s.snapshot.status.as_str().to_string());
                children.push(json!({"id": child, "definition": e["definition"], "status": status}));
            }
        }
    }
    Ok(json!({
        "instance": record,
        "diagram": diagram,
        "waiting": waiting,
        "steps": steps,
        "children": children,
        "truncated": truncated,
        "historyError": history_error,
        "machineMissing": machine.is_none(),
    }))
}

/// Operations the instance has asked for and not had answered: op -> what it is.
type Open = BTreeMap<String, Value>;

/// Replays `journal`: one step per input, with the effects and traces it produced and the data it
/// left; the marks of the states it visited; the operations still open at the end.
///
/// `m` is the version the instance runs now; a journal that migrated it starts on the version its
/// first migration moved from, and moves as it did, with the `versions` of the definition.
fn replay(
    m: &Arc<Machine>,
    versions: &BTreeMap<String, Arc<Machine>>,
    id: &str,
    journal: &[(i64, Entry)],
) -> (Vec<Value>, Marks, Open) {
    let options = Options {
        journal: true,
        trace: true,
        ..Options::default()
    };
    let first = journal.iter().find_map(|(_, e)| match e {
        Entry::Input(t) => match &t.input {
            Input::Migrate { from, .. } => versions.get(from).cloned(),
            _ => None,
        },
        _ => None,
    });
    let m = &first.unwrap_or_else(|| m.clone());
    let mut inst = Instance::new(m.clone(), id, options);
    let mut steps = Vec::new();
    let mut marks = Marks::default();
    let mut open = Open::new();
    let mut last_state: Option<String> = None;
    let mut asl = m.asl.as_deref().map(AslTrail::new);
    for (seq, e) in journal {
        let Entry::Input(timed) = e else { continue };
        match &timed.input {
            Input::Completed { op, .. } | Input::Failed { op, .. } => {
                open.remove(op);
            }
            _ => {}
        }
        let out = match &timed.input {
            Input::Migrate { version, states, .. } => match versions.get(version) {
                Some(to) => inst.migrate(to.clone(), states, timed.at).unwrap_or_default(),
                None => Default::default(),
            },
            _ => inst.handle(timed.clone()),
        };
        let mut effects = Vec::new();
        let mut traces = Vec::new();
        for entry in out.entries {
            match entry {
                Entry::Effect(effect) => {
                    match &effect {
                        Effect::InvokeFunction {
                            op,
                            function,
                            wait: true,
                            ..
                        } => {
                            open.insert(op.clone(), json!({"op": op, "kind": "function", "name": function}));
                        }
                        Effect::StartSubflow {
                            op,
                            definition,
                            wait: true,
                            ..
                        } => {
                            open.insert(
                                op.clone(),
                                json!({"op": op, "kind": "subflow", "name": definition, "instance": child_id(id, op)}),
                            );
                        }
                        Effect::CancelOperation { op } => {
                            open.remove(op);
                        }
                        _ => {}
                    }
                    effects.push(serde_json::to_value(&effect).unwrap_or(Value::Null));
                }
                Entry::Trace(t) => {
                    match &t {
                        Trace::StateEntered { state } if asl.is_some() => {
                            if let Some(trail) = &mut asl {
                                trail.entered(state, &mut marks);
                            }
                        }
                        Trace::StateEntered { state } => {
                            if let Some(prev) = last_state.replace(state.clone()) {
                                marks.fired.insert((prev, state.clone()));
                            }
                            marks.visited.insert(state.clone());
                        }
                        Trace::TransitionFired { state, next, .. } => {
                            let to = next.clone().unwrap_or_else(|| state.clone());
                            marks.fired.insert((state.clone(), to));
                        }
                        _ => {}
                    }
                    traces.push(serde_json::to_value(&t).unwrap_or(Value::Null));
                }
                Entry::Input(_) => {}
            }
        }
        let s = inst.snapshot();
        let mut input = serde_json::to_value(&timed.input).unwrap_or(Value::Null);
        // Keep a step light: the start data and event payloads are in `data` and the event view.
        if let Some(o) = input.as_object_mut() {
            o.remove("data");
        }
        steps.push(json!({
            "seq": seq,
            "time": rfc3339(timed.at),
            "input": input,
            "effects": effects,
            "traces": traces,
            "state": s.state_name,
            "status": s.status.as_str(),
            "data": data_of(s),
        }));
    }
    (steps, marks, open)
}

/// Marks the states an ASL execution's runs are in as current: the machine's own run and every
/// running Parallel branch and Map iteration, in the block each runs.
fn mark_runs(run: &Run, asl: &AslMachine, marks: &mut Marks) {
    if matches!(run.step, Step::Done { .. }) {
        return;
    }
    if let Some(st) = asl.graphs.get(run.graph).and_then(|g| g.states.get(run.state)) {
        marks.block(run.graph).current.insert(st.name.clone());
    }
    if let Step::Children { slots, .. } = &run.step {
        for slot in slots {
            if let Slot::Running { run } = slot {
                mark_runs(run, asl, marks);
            }
        }
    }
}

/// Follows the states an ASL execution enters, to mark them in the block they belong to.
///
/// A trace names the state only. A name used in one block only (as the language asks) is that
/// block's state. A name used in several is taken as the one the execution can have gone to: first
/// the start of a block whose state was just entered and that has not started since, then a state
/// the last state entered in its block leads to, then the start of a block whose state has been
/// entered, then a state some visited state of its block leads to, then the first.
struct AslTrail<'a> {
    asl: &'a AslMachine,
    /// By name: the (block, state) pairs of that name.
    by_name: HashMap<&'a str, Vec<(usize, usize)>>,
    /// By block: the block and state that runs it.
    parent: HashMap<usize, (usize, usize)>,
    /// By block: the last state entered in it.
    last: HashMap<usize, usize>,
    /// The blocks whose state was entered and that have not started since.
    fresh: HashSet<usize>,
}

impl<'a> AslTrail<'a> {
    fn new(asl: &'a AslMachine) -> Self {
        let mut by_name: HashMap<&str, Vec<(usize, usize)>> = HashMap::new();
        let mut parent = HashMap::new();
        for (g, block) in asl.graphs.iter().enumerate() {
            for (s, st) in block.states.iter().enumerate() {
                by_name.entry(st.name.as_str()).or_default().push((g, s));
                for (child, _) in sm4c_host::asl_graph::children(&st.kind) {
                    parent.insert(child, (g, s));
                }
            }
        }
        AslTrail {
            asl,
            by_name,
            parent,
            last: HashMap::new(),
            fresh: HashSet::new(),
        }
    }

    /// Whether state `s` of block `g` leads to its state `to` (`Next`, a Choice rule, `Default`, `Catch`).
    fn leads(&self, g: usize, s: usize, to: usize) -> bool {
        let st = &self.asl.graphs[g].states[s];
        st.next == Some(to)
            || st.catch.iter().any(|c| c.next == to)
            || matches!(&st.kind, AslKind::Choice { choices, default }
                if *default == Some(to) || choices.iter().any(|c| c.next == to))
    }

    fn name(&self, g: usize, s: usize) -> &'a str {
        &self.asl.graphs[g].states[s].name
    }

    /// A visited state of block `g` that leads to `s`.
    fn visited_before(&self, g: usize, s: usize, marks: &Marks) -> Option<usize> {
        let visited = if g == 0 {
            &marks.visited
        } else {
            &marks.blocks.get(&g)?.visited
        };
        (0..self.asl.graphs[g].states.len()).find(|&p| visited.contains(self.name(g, p)) && self.leads(g, p, s))
    }

    /// How likely it is that the execution entered state `s` of block `g`: 0 the most.
    fn rank(&self, g: usize, s: usize, marks: &Marks) -> u8 {
        let start = self.asl.graphs[g].start == s;
        if start && self.fresh.contains(&g) {
            return 0;
        }
        if self.last.get(&g).is_some_and(|&p| self.leads(g, p, s)) {
            return 1;
        }
        if start {
            let started = match self.parent.get(&g) {
                None => g == 0 && self.last.is_empty(),
                Some(&(pg, ps)) => {
                    let pm = if pg == 0 { Some(marks) } else { marks.blocks.get(&pg) };
                    pm.is_some_and(|pm| pm.visited.contains(self.name(pg, ps)))
                }
            };
            if started {
                return 2;
            }
        }
        if self.visited_before(g, s, marks).is_some() {
            return 3;
        }
        4
    }

    /// State `name` was entered: marks it visited in its block, and the edge it came by fired.
    fn entered(&mut self, name: &str, marks: &mut Marks) {
        let Some(candidates) = self.by_name.get(name) else {
            return;
        };
        let Some(&(g, s)) = candidates.iter().min_by_key(|&&(g, s)| self.rank(g, s, marks)) else {
            return;
        };
        let from = match self.last.get(&g) {
            Some(&p) if self.leads(g, p, s) => Some(p),
            _ if self.asl.graphs[g].start == s => None,
            _ => self.visited_before(g, s, marks),
        };
        let block = marks.block(g);
        if let Some(p) = from {
            block.fired.insert((self.name(g, p).to_string(), name.to_string()));
        }
        block.visited.insert(name.to_string());
        self.last.insert(g, s);
        if self.asl.graphs[g].start == s {
            self.fresh.remove(&g);
        }
        for (child, _) in sm4c_host::asl_graph::children(&self.asl.graphs[g].states[s].kind) {
            self.fresh.insert(child);
        }
    }
}

/// The data an instance shows: for a running ASL execution, the current state's input.
pub(crate) fn data_of(s: &Snapshot) -> Value {
    match (&s.asl, s.status.is_final()) {
        (Some(exec), false) => exec.root.input.clone(),
        _ => from_val(&s.data.0),
    }
}

/// What can happen next to a waiting instance: the events its current state's transitions wait
/// for (with the correlation values each must carry), its timers, and the calls and subflows it
/// waits for.
fn waiting(m: &Machine, snap: &Snapshot, open: &Open) -> Value {
    let mut events = Vec::new();
    let state = snap.state.and_then(|i| m.states.get(i));
    let data = to_val(&data_of(snap));
    if let Some(st) = state.filter(|_| m.asl.is_none()) {
        for (i, t) in st.transitions.iter().enumerate() {
            if t.trigger != Trigger::Events {
                continue;
            }
            let next = t.next.and_then(|n| m.states.get(n)).map(|s| s.name.clone());
            for (g, group) in t.groups.iter().enumerate() {
                for &e in &group.events {
                    let d = &m.events[e];
                    let correlation: Vec<Value> = d
                        .correlation
                        .iter()
                        .map(|rule| {
                            let name = rule.name.to_ascii_lowercase();
                            match &rule.value {
                                Some(tpl) => match tpl.resolve(&data) {
                                    Ok(v) => {
                                        let v = from_val(&v);
                                        let text = v.as_str().map_or_else(|| v.to_string(), str::to_string);
                                        json!({"attribute": name, "value": text, "from": "data"})
                                    }
                                    Err(e) => json!({"attribute": name, "error": e.message}),
                                },
                                None => match snap.bindings.get(&name) {
                                    Some(v) => json!({"attribute": name, "value": v, "from": "bound"}),
                                    None => {
                                        json!({"attribute": name, "value": null, "from": "the first event binds it"})
                                    }
                                },
                            }
                        })
                        .collect();
                    events.push(json!({
                        "event": d.name,
                        "type": d.sent_type(),
                        "source": d.source,
                        "correlation": correlation,
                        "transition": i,
                        "group": g,
                        "next": next,
                        "all": group.events.len() > 1 || t.groups.len() > 1,
                    }));
                }
            }
        }
    }
    let timeout_next = state
        .and_then(|st| st.transitions.iter().find(|t| t.trigger == Trigger::Timeout))
        .and_then(|t| t.next)
        .and_then(|n| m.states.get(n))
        .map(|s| s.name.clone());
    let timers: Vec<Value> = snap
        .timers
        .iter()
        .map(|(name, due)| {
            let (kind, next) = if snap.state_timer.as_deref() == Some(name.as_str()) {
                ("state timeout", timeout_next.clone())
            } else if name == sm4c_runtime::engine::EXEC_TIMER {
                ("instance timeout", None)
            } else if name.ends_with(":delay") {
                ("delay", None)
            } else if name.ends_with(":retry") {
                ("retry", None)
            } else {
                ("timeout", None)
            };
            json!({"timer": name, "kind": kind, "due": rfc3339(*due), "dueMs": due, "next": next})
        })
        .collect();
    let inbox: Vec<Value> = snap
        .inbox
        .iter()
        .map(|e| json!({"type": attribute_text(e, "type"), "id": attribute_text(e, "id")}))
        .collect();
    json!({
        "events": events,
        "timers": timers,
        "operations": open.values().cloned().collect::<Vec<_>>(),
        "inbox": inbox,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ui::diagram::{graph, svg};
    use sm4c_runtime::{Input, Timed};

    fn machine(doc: Value) -> Arc<Machine> {
        Arc::new(
            sm4c_runtime::load(&doc, &mut sm4c_runtime::no_files, sm4c_runtime::LoadOptions::default())
                .expect("a valid definition"),
        )
    }

    /// A Parallel whose second branch waits 60 s, then a Map over `.items` with a 2-state processor.
    fn nested() -> Arc<Machine> {
        machine(json!({"sm4c:id": "nested", "StartAt": "Prepare", "States": {
            "Prepare": {"Type": "Pass", "Next": "Both"},
            "Both": {"Type": "Parallel", "ResultPath": "$.both", "Next": "Each", "Branches": [
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
        }}))
    }

    /// Runs `m` from `input`, firing its timers `fire` times; the journal and the last snapshot.
    fn run(m: &Arc<Machine>, input: Value, fire: usize) -> (Vec<(i64, Entry)>, Snapshot) {
        let options = Options {
            journal: true,
            ..Options::default()
        };
        let mut inst = Instance::new(m.clone(), "i-1", options);
        let mut journal = Vec::new();
        let mut at = 1_000;
        let mut input = Input::Start {
            data: input,
            scheduled: None,
        };
        for n in 0..=fire {
            let out = inst.handle(Timed { at, input });
            journal.extend(
                out.entries
                    .into_iter()
                    .enumerate()
                    .map(|(k, e)| ((n * 100 + k) as i64, e)),
            );
            let Some((timer, due)) = inst.snapshot().timers.iter().next() else {
                break;
            };
            at = *due;
            input = Input::TimerFired { timer: timer.clone() };
        }
        (journal, inst.snapshot().clone())
    }

    fn set(names: &[&str]) -> HashSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    fn fired(pairs: &[(&str, &str)]) -> HashSet<(String, String)> {
        pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
    }

    #[test]
    fn states_entered_in_branches_are_marked_in_their_block_and_the_waiting_one_current() {
        let m = nested();
        let (journal, snap) = run(&m, json!({"ok": true, "items": [1, 2]}), 0);
        assert_eq!(snap.status.as_str(), "waiting");
        let (_, mut marks, _) = replay(&m, &BTreeMap::new(), "i-1", &journal);
        mark_runs(
            &snap.asl.as_ref().expect("an execution").root,
            m.asl.as_deref().unwrap(),
            &mut marks,
        );
        assert_eq!(marks.visited, set(&["Prepare", "Both"]));
        assert_eq!(marks.current, set(&["Both"]));
        assert_eq!(marks.fired, fired(&[("Prepare", "Both")]));
        let left = &marks.blocks[&1];
        assert_eq!(left.visited, set(&["Left", "LeftDone"]));
        assert_eq!(left.fired, fired(&[("Left", "LeftDone")]));
        assert!(left.current.is_empty());
        let right = &marks.blocks[&2];
        assert_eq!(right.visited, set(&["Right"]));
        assert_eq!(right.current, set(&["Right"]));
        assert!(!marks.blocks.contains_key(&3));
        let s = svg(&graph(&m), &marks);
        assert!(
            s.contains("class=\"state visited current\" data-state=\"Right\""),
            "{s}"
        );
        assert!(
            s.contains("<g class=\"edge fired\" data-from=\"Left\" data-to=\"LeftDone\">"),
            "{s}"
        );
        assert!(s.contains("class=\"state\" data-state=\"Item\""), "{s}");
    }

    #[test]
    fn a_finished_execution_marks_every_branch_and_iteration_it_went_through() {
        let m = nested();
        let (journal, snap) = run(&m, json!({"ok": true, "items": [1, 2]}), 1);
        assert_eq!(snap.status.as_str(), "completed");
        let (_, marks, _) = replay(&m, &BTreeMap::new(), "i-1", &journal);
        assert_eq!(marks.visited, set(&["Prepare", "Both", "Each"]));
        assert_eq!(marks.fired, fired(&[("Prepare", "Both"), ("Both", "Each")]));
        assert_eq!(marks.blocks[&2].visited, set(&["Right", "RightCheck", "RightDone"]));
        assert_eq!(
            marks.blocks[&2].fired,
            fired(&[("Right", "RightCheck"), ("RightCheck", "RightDone")])
        );
        assert_eq!(marks.blocks[&3].visited, set(&["Item", "ItemDone"]));
        assert_eq!(marks.blocks[&3].fired, fired(&[("Item", "ItemDone")]));
        let s = svg(&graph(&m), &marks);
        assert!(
            s.contains("class=\"state visited final\" data-state=\"ItemDone\""),
            "{s}"
        );
        assert!(
            s.contains("<g class=\"edge fired\" data-from=\"RightCheck\" data-to=\"RightDone\">"),
            "{s}"
        );
        assert!(!s.contains("current"), "{s}");
    }

    #[test]
    fn a_name_used_in_two_blocks_is_marked_where_the_execution_went() {
        let m = machine(json!({"sm4c:id": "twice", "StartAt": "Both", "States": {
            "Both": {"Type": "Parallel", "Next": "Done", "Branches": [
                {"StartAt": "Done", "States": {"Done": {"Type": "Pass", "End": true}}},
                {"StartAt": "Hold", "States": {"Hold": {"Type": "Wait", "Seconds": 5, "End": true}}}
            ]},
            "Done": {"Type": "Succeed"}
        }}));
        let (journal, _) = run(&m, json!({}), 0);
        let (_, marks, _) = replay(&m, &BTreeMap::new(), "i-1", &journal);
        assert_eq!(marks.visited, set(&["Both"]), "the top-level Done is not reached yet");
        assert_eq!(marks.blocks[&1].visited, set(&["Done"]));
        let (journal, snap) = run(&m, json!({}), 1);
        assert_eq!(snap.status.as_str(), "completed");
        let (_, marks, _) = replay(&m, &BTreeMap::new(), "i-1", &journal);
        assert_eq!(marks.visited, set(&["Both", "Done"]));
        assert_eq!(marks.fired, fired(&[("Both", "Done")]));
    }
}
