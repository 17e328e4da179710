//! From incoming events to commands: where each event goes (an instance's partition, a
//! correlation key's partition, or every partition an open correlation may take it on), which
//! owned partition's transaction carries it, and the committed offsets these decisions rest on.

use super::*;

/// Turns incoming events into commands for the instances' partitions (no IO).
pub(super) fn plan(shared: &Shared, topic: &str, p: i32, msgs: Vec<OwnedMessage>) -> Plan {
    let n = shared.partitions;
    let mut outs = Vec::new();
    let mut cmds: Vec<RoutedCommand> = Vec::new();
    let mut last = -1;
    let machines = shared.machines();
    for m in &msgs {
        last = m.offset();
        let at = m.timestamp().to_millis();
        let origin = Origin {
            topic: topic.to_string(),
            partition: p,
            offset: m.offset(),
        };
        let event = match read_event(m) {
            Ok(e) => e,
            Err((code, why)) => {
                outs.push(dead_message(shared, m, &origin, code, &why));
                continue;
            }
        };
        match sm4c_host::tasks::Answer::from_event(&event) {
            Ok(None) => {}
            Ok(Some((token, answer))) => {
                match sm4c_host::tasks::decode_token(&token) {
                    Some((id, op)) => {
                        let c = Command::Answer {
                            id: id.clone(),
                            op,
                            answer,
                            event: Some((event, origin)),
                            request: None,
                        };
                        cmds.push((partition_of(&id, n), Some(id), c, at, m.offset()));
                    }
                    None => {
                        let why = format!("{token:?} in {} is not a task token", sm4c_host::tasks::TOKEN_ATTRIBUTE);
                        outs.push(dead_message(shared, m, &origin, "unknownTask", &why));
                    }
                }
                continue;
            }
            Err(why) => {
                outs.push(dead_message(shared, m, &origin, "invalidTaskEvent", &why));
                continue;
            }
        }
        let mut starts = 0;
        for mach in machines.iter().filter(|mach| {
            mach.start_event
                .as_ref()
                .is_some_and(|s| sm4c_host::explain::starts_with(s, &event))
        }) {
            let id = start_id(
                &mach.id,
                &attribute_text(&event, "source").unwrap_or_default(),
                &attribute_text(&event, "id").unwrap_or_default(),
            );
            let input = event.get("data").cloned().unwrap_or(Value::Null);
            let c = Command::Start {
                id: id.clone(),
                definition: mach.id.clone(),
                version: Some(mach.version.clone()),
                input,
                parent: None,
                depth: 0,
                origin: Some(origin.clone()),
                request: None,
                traceparent: event
                    .get("traceparent")
                    .and_then(Value::as_str)
                    .and_then(sm4c_host::driver::traceparent)
                    .map(str::to_string),
                schedule: None,
                nominal: None,
            };
            cmds.push((partition_of(&id, n), Some(id), c, at, m.offset()));
            starts += 1;
        }
        match route(&machines, &event) {
            Route::Instance(target) => {
                let c = Command::Event {
                    target: Some(target.clone()),
                    event,
                    origin,
                    home: None,
                    expect: None,
                };
                cmds.push((partition_of(&target, n), Some(target), c, at, m.offset()));
                continue;
            }
            Route::Key { attribute, value } => {
                // Routed by its correlation key: to the one partition that owns the key.
                let key = corr_key(&attribute, &value);
                let c = Command::Keyed {
                    key: key.clone(),
                    event,
                    origin,
                };
                cmds.push((partition_of(&key, n), Some(key), c, at, m.offset()));
                continue;
            }
            Route::None => {
                if starts == 0 {
                    let why = format!(
                        "no registered definition declares an event of type {:?} and source {:?}",
                        attribute_text(&event, "type").unwrap_or_default(),
                        attribute_text(&event, "source").unwrap_or_default()
                    );
                    outs.push(dead_message(shared, m, &origin, "noDefinition", &why));
                }
                continue;
            }
            Route::Every => {}
        }
        let home = partition_of(&origin.key(), n);
        for q in 0..n {
            let c = Command::Event {
                target: None,
                event: event.clone(),
                origin: origin.clone(),
                home: Some(home),
                expect: None,
            };
            cmds.push((q, None, c, at, m.offset()));
        }
    }
    Plan { cmds, outs, last }
}

/// Per (events partition, owned commands partition), the largest event offset routed there as a
/// command and not yet applied (see [`Worker::outstanding`]).
pub(super) type Outstanding = HashMap<((String, i32), i32), i64>;

/// Where the events partitions' batches of one loop turn go.
pub(super) struct Routing {
    /// Per owned commands partition: what its transaction carries.
    pub(super) hosted: HashMap<i32, Carried>,
    /// The owned commands partition whose transaction carries each events partition's batch.
    pub(super) hosted_by: Vec<((String, i32), i32)>,
    /// Batches routed in a transaction of their own (no owned partition to carry them).
    pub(super) solo: Vec<Solo>,
}

/// An events partition's batch routed in its own transaction: (events partition, records, last
/// offset, the latest timestamp of its events, which stamps the records).
pub(super) type Solo = ((String, i32), Vec<Out>, i64, Option<i64>);

/// Routes the events partitions' batches of one loop turn, with no IO: each rides in the
/// transaction of the owned commands partition most of its events are for (`local` are the owned
/// ones, `ready` those past their barrier, `commanded` those with commands of their own this turn);
/// the events for that partition's instances are applied there at once unless commands routed
/// there from the same events partition are still pending (`outstanding`), the others become
/// commands. With no owned partition, a batch is routed in its own transaction.
pub(super) fn route_events(
    shared: &Shared,
    local: &BTreeSet<i32>,
    ready: &BTreeSet<i32>,
    outstanding: &Outstanding,
    commanded: &BTreeSet<i32>,
    event_batches: Vec<((String, i32), Vec<OwnedMessage>)>,
) -> Routing {
    let mut r = Routing {
        hosted: HashMap::new(),
        hosted_by: Vec::new(),
        solo: Vec::new(),
    };
    for (k, msgs) in event_batches {
        let plan = plan(shared, &k.0, k.1, msgs);
        let eligible: BTreeSet<i32> = ready
            .iter()
            .filter(|q| !outstanding.contains_key(&(k.clone(), **q)))
            .copied()
            .collect();
        let Some(host) = host_of(&plan, local, &eligible, commanded) else {
            let mut outs = plan.outs;
            let at = plan.cmds.iter().filter_map(|c| c.3).max();
            for (q, key, c, _, _) in plan.cmds {
                outs.push(command(shared, q, key.as_deref(), &c));
            }
            r.solo.push((k, outs, plan.last, at));
            continue;
        };
        let h = r.hosted.entry(host).or_default();
        h.latest = h.latest.max(plan.cmds.iter().filter_map(|c| c.3).max());
        for (q, key, c, at, offset) in plan.cmds {
            if q == host && eligible.contains(&q) {
                h.inline.push((c, at, offset));
            } else {
                if local.contains(&q) {
                    h.forwarded.push((k.clone(), q, offset));
                }
                h.outs.push(command(shared, q, key.as_deref(), &c));
            }
        }
        tracing::debug!(events = ?k, host, eligible = ?eligible, inline = h.inline.len(), forwarded = h.forwarded.len(), "routed");
        h.outs.extend(plan.outs);
        h.offsets.push((k.0.clone(), k.1, plan.last + 1));
        r.hosted_by.push((k, host));
    }
    r
}

/// Once partition `p`'s batch committed: the commands it forwarded to other owned partitions are
/// pending there, and those it applied are no longer.
pub(super) fn note_committed(
    outstanding: &mut Outstanding,
    p: i32,
    applied: Applied,
    forwarded: Vec<((String, i32), i32, i64)>,
) {
    for (e, q, offset) in forwarded {
        let o = outstanding.entry((e, q)).or_insert(offset);
        *o = (*o).max(offset);
    }
    for (e, offset) in applied {
        let k = (e, p);
        if outstanding.get(&k).is_some_and(|o| *o <= offset) {
            outstanding.remove(&k);
        }
    }
}

/// A batch whose transaction may or may not have committed (its commit failed: the broker may
/// have committed it all the same) forwarded `forwarded`: they are awaited as if it had committed.
/// Were they not, a newer event of the same events partition could be applied directly on the
/// target before the forwarded one arrives, and that one would then be skipped as applied already.
/// Awaiting one that never comes holds nothing back for long: the batch's events are read again,
/// and forwarded again while it is awaited.
pub(super) fn note_uncertain(outstanding: &mut Outstanding, forwarded: Vec<((String, i32), i32, i64)>) {
    for (e, q, offset) in forwarded {
        let o = outstanding.entry((e, q)).or_insert(offset);
        *o = (*o).max(offset);
    }
}

/// The committed offset of `topic`/`p` in a committed-offsets answer: 0 when the group has none, an
/// error when the broker failed that partition.
pub(super) fn committed_offset(c: &TopicPartitionList, topic: &str, p: i32) -> Result<i64, String> {
    let e = c
        .find_partition(topic, p)
        .ok_or_else(|| format!("the broker's answer has no committed offset for {topic} partition {p}"))?;
    e.error()
        .map_err(|err| format!("cannot read the committed offset of {topic} partition {p}: {err}"))?;
    match e.offset() {
        Offset::Offset(o) => Ok(o),
        Offset::Invalid => Ok(0),
        other => Err(format!(
            "unexpected committed offset {other:?} for {topic} partition {p}"
        )),
    }
}

/// Where the router sends an event (start events aside).
pub(super) enum Route {
    /// To the partition of the instance it names (`sm4cinstanceid`).
    Instance(String),
    /// To the partition of its correlation key ([`index::keyed_route`]).
    Key { attribute: String, value: String },
    /// To every partition.
    Every,
    /// Nowhere: no registered definition declares it.
    None,
}

pub(super) fn route(machines: &[Arc<Machine>], event: &Value) -> Route {
    if let Some(id) = attribute_text(event, "sm4cinstanceid") {
        return Route::Instance(id);
    }
    if let Some((attribute, value)) = index::keyed_route(machines, event) {
        return Route::Key { attribute, value };
    }
    if machines.iter().any(|m| driver::may_accept(m, event)) {
        return Route::Every;
    }
    Route::None
}

/// Where the router sends an event, as `POST /events/explain` says it: to the partition of the
/// instance it names, to the partition of its correlation key, to every partition, or nowhere (no
/// definition declares it; only a start event may take it).
pub(crate) fn route_of(shared: &Shared, event: &Value) -> Value {
    let n = shared.partitions;
    match route(&shared.machines(), event) {
        Route::Instance(id) => {
            serde_json::json!({"via": "instance", "partition": partition_of(&id, n), "instance": id})
        }
        Route::Key { attribute, value } => {
            let partition = partition_of(&corr_key(&attribute, &value), n);
            serde_json::json!({"via": "key", "attribute": attribute, "value": value, "partition": partition})
        }
        Route::Every => serde_json::json!({"via": "every partition", "partitions": n}),
        Route::None => serde_json::json!({"via": "none"}),
    }
}

/// What POST /events answers in Kafka mode.
pub(crate) fn queued(topic: &str, partition: i32, offset: i64) -> Delivery {
    Delivery {
        queued: true,
        topic: topic.to_string(),
        partition,
        offset,
    }
}

/// The owned commands partition whose transaction takes in an events partition's batch: the one
/// most of its commands are for, else one deciding anyway, else any; `None` when this worker owns
/// no commands partition.
pub(super) fn host_of(
    plan: &Plan,
    local: &BTreeSet<i32>,
    eligible: &BTreeSet<i32>,
    busy: &BTreeSet<i32>,
) -> Option<i32> {
    let mut counts: HashMap<i32, usize> = HashMap::new();
    for (q, ..) in &plan.cmds {
        if eligible.contains(q) {
            *counts.entry(*q).or_default() += 1;
        }
    }
    counts
        .into_iter()
        .max_by_key(|(q, n)| (*n, std::cmp::Reverse(*q)))
        .map(|(q, _)| q)
        .or_else(|| busy.iter().filter(|q| local.contains(q)).min().copied())
        .or_else(|| local.first().copied())
}

/// The group's committed offset of a partition, 0 when it has none. A failed fetch is an error,
/// also when the broker answers the request but fails the partition: taken for 0, it would restore
/// a partition empty or read an events partition again from its beginning.
pub(super) fn committed_of(
    consumer: &BaseConsumer<Quiet>,
    topic: &str,
    p: i32,
    timeout: Duration,
) -> Result<i64, String> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, p);
    let c = consumer
        .committed_offsets(tpl, timeout)
        .map_err(|e| format!("cannot read committed offsets: {e}"))?;
    committed_offset(&c, topic, p)
}

/// Puts a barrier command at the end of a commands partition; returns its token. If it cannot,
/// the partition keeps taking events through the commands topic until the next assignment (no
/// token it reads matches).
pub(super) fn put_barrier(shared: &Shared, p: i32) -> String {
    let token = sm4c_host::service::new_id("barrier");
    let c = Command::Barrier { token: token.clone() };
    if let Err(e) = produce(&shared.plain, &command(shared, p, None, &c)) {
        tracing::warn!(partition = p, error = %e, "cannot put a barrier");
    }
    token
}
