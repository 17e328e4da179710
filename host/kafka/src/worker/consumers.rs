//! The worker's two group consumers: the commands topic's, in the group `--group`, and the events
//! topics', in the group `<group>.events`.
//!
//! Two groups, so that each balances its own topics: with one group subscribed to both, the
//! sticky assignors balance the partitions of all topics together and may leave a worker with
//! every commands partition and another with none. Apart, both use cooperative rebalancing
//! (`cooperative-sticky`, KIP-429): a rebalance takes from a worker only the partitions that must
//! move, and the worker goes on deciding for the others meanwhile. Each batch's transaction
//! commits the commands and clock offsets under the commands group's metadata and the events
//! offsets under the events group's (KIP-447 checks each against its own group's generation), so a
//! worker that lost an events partition in a rebalance it has not seen yet cannot commit past its
//! new owner.
//!
//! One loop polls both, taking their records oldest first (as one consumer of both topics took
//! them in the order they came): each consumer rings a shared bell when its queue fills, and the
//! loop waits on the bell (never longer than a poll's wait) when both are empty. Taking them in
//! turn instead, a record of each, slowed a burst of 100,000 correlated events on one worker from
//! about 21,000 to 12,000 decided per second: the commands the events gave rise to went before the
//! rest of the burst.

use super::route::committed_of;
use crate::wire::Quiet;
use crate::Shared;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::producer::{Producer, ThreadedProducer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::collections::HashSet;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Rung by either consumer when its queue turns non-empty.
#[derive(Default)]
struct Bell {
    rung: Mutex<bool>,
    cv: Condvar,
}

impl Bell {
    fn ring(&self) {
        *self.rung.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.cv.notify_one();
    }

    fn clear(&self) {
        *self.rung.lock().unwrap_or_else(|p| p.into_inner()) = false;
    }

    /// Waits until rung (since the last [`Bell::clear`]) or for `at_most`.
    fn wait(&self, at_most: Duration) {
        let rung = self.rung.lock().unwrap_or_else(|p| p.into_inner());
        let _ = self.cv.wait_timeout_while(rung, at_most, |r| !*r);
    }
}

pub(super) struct Consumers {
    pub(super) commands: BaseConsumer<Quiet>,
    pub(super) events: BaseConsumer<Quiet>,
    commands_topic: String,
    events_topics: HashSet<String>,
    bell: Arc<Bell>,
}

/// The assignment strategy of both groups unless `--kafka-config` names another.
const STRATEGY: &str = "cooperative-sticky";

/// A group consumer's configuration: the group's, cooperative rebalancing, librdkafka's
/// statistics (each partition's consumer lag, for the metrics: see [`Quiet`]) and this worker's
/// static name ([`crate::KafkaConfig::group_instance_id`]) when it has one: the same name in both
/// groups (a name is unique within its group).
pub(super) fn group_consumer_config(shared: &Shared, group: &str) -> ClientConfig {
    let mut config = shared.consumer_config(group);
    if config.get("statistics.interval.ms").is_none() {
        config.set("statistics.interval.ms", "5000");
    }
    if shared
        .cfg
        .settings
        .iter()
        .all(|(k, _)| k != "partition.assignment.strategy")
    {
        config.set("partition.assignment.strategy", STRATEGY);
    }
    if let Some(id) = &shared.cfg.group_instance_id {
        config.set("group.instance.id", id);
    }
    config
}

/// The offsets reader shares the commands group's id but never joins it: it carries no static
/// name, which is the group consumers' alone (a `group.instance.id` from `--kafka-config` too).
pub(super) fn offsets_reader_config(shared: &Shared) -> ClientConfig {
    let mut config = shared.consumer_config(&shared.cfg.group);
    config.remove("group.instance.id");
    config
}

/// Why the worker stops after a group consumer's fatal error.
pub(super) fn fatal_consumer_error(code: rdkafka::types::RDKafkaErrorCode, why: &str) -> String {
    let hint = match code {
        rdkafka::types::RDKafkaErrorCode::FencedInstanceId => {
            ": another worker joined the group under this worker's group instance id (--group-instance-id); each worker needs its own"
        }
        _ => "",
    };
    format!("the group consumer failed and cannot go on ({code:?}: {why}){hint}; this worker stopped, restart it")
}

impl Consumers {
    /// Both consumers, subscribed.
    pub(super) fn new(shared: &Shared) -> Result<Consumers, String> {
        let bell = Arc::new(Bell::default());
        let make = |group: &str, topics: &[&str]| -> Result<BaseConsumer<Quiet>, String> {
            let mut c: BaseConsumer<Quiet> = group_consumer_config(shared, group)
                .create_with_context(Quiet)
                .map_err(|e| format!("cannot create the consumer of group {group}: {e}"))?;
            let b = bell.clone();
            c.set_nonempty_callback(move || b.ring());
            c.subscribe(topics)
                .map_err(|e| format!("cannot subscribe to {topics:?}: {e}"))?;
            Ok(c)
        };
        let events: Vec<&str> = shared.topics.events.iter().map(String::as_str).collect();
        Ok(Consumers {
            commands: make(&shared.cfg.group, &[shared.topics.commands.as_str()])?,
            events: make(&shared.cfg.events_group(), &events)?,
            commands_topic: shared.topics.commands.clone(),
            events_topics: shared.topics.events.iter().cloned().collect(),
            bell,
        })
    }

    /// The consumer that reads `topic`.
    pub(super) fn of(&self, topic: &str) -> &BaseConsumer<Quiet> {
        if topic == self.commands_topic {
            &self.commands
        } else {
            &self.events
        }
    }

    /// What both consumers are assigned.
    pub(super) fn assigned(&self) -> HashSet<(String, i32)> {
        let mut all = HashSet::new();
        for c in [&self.commands, &self.events] {
            if let Ok(a) = c.assignment() {
                all.extend(a.elements().iter().map(|e| (e.topic().to_string(), e.partition())));
            }
        }
        all
    }

    /// Polls both for up to `max` records: waits up to `wait` for the first, then takes what
    /// came within a few milliseconds more. Records are taken oldest first across the two
    /// consumers (by their timestamps, one in the future counting as now), as one consumer of both
    /// topics takes them in the order they came: a burst of events goes before the commands it
    /// gives rise to, and neither topic holds the other back. A fatal consumer error ends the poll
    /// with its reason.
    pub(super) fn poll(&self, max: usize, wait: Duration) -> Result<Vec<OwnedMessage>, String> {
        let started = Instant::now();
        let mut batch = Vec::new();
        let consumers = [&self.commands, &self.events];
        loop {
            self.bell.clear();
            let turn = Instant::now();
            let now = sm4c_host::clock::wall_ms();
            // The next record of each consumer, and whether it may have more.
            let mut next: [Option<(i64, OwnedMessage)>; 2] = [None, None];
            let mut open = [true, true];
            while batch.len() + 2 < max && turn.elapsed() <= Duration::from_millis(5) {
                for i in 0..2 {
                    if next[i].is_some() || !open[i] {
                        continue;
                    }
                    match consumers[i].poll(Duration::ZERO) {
                        Some(Ok(m)) => {
                            let at = m.timestamp().to_millis().unwrap_or(now).min(now);
                            next[i] = Some((at, m.detach()));
                        }
                        Some(Err(e)) => {
                            tracing::debug!(error = %e, "consumer");
                            // A fatal error (a static member fenced by another worker of the
                            // same name) leaves the consumer unusable: the worker stops.
                            if let Some((code, why)) = consumers[i].client().fatal_error() {
                                return Err(fatal_consumer_error(code, &why));
                            }
                            open[i] = false;
                        }
                        None => open[i] = false,
                    }
                }
                let older = match (&next[0], &next[1]) {
                    (Some((a, _)), Some((b, _))) => usize::from(b < a),
                    (Some(_), None) => 0,
                    (None, Some(_)) => 1,
                    (None, None) => break,
                };
                if let Some((_, m)) = next[older].take() {
                    batch.push(m);
                }
            }
            // What was polled is taken in this batch: nothing waits in here for the next one.
            batch.extend(next.into_iter().flatten().map(|(_, m)| m));
            let waited = started.elapsed();
            if !batch.is_empty() || waited >= wait {
                return Ok(batch);
            }
            self.bell.wait(wait - waited);
        }
    }

    /// The group's committed offset of a partition, read by the consumer of its topic.
    pub(super) fn committed(&self, topic: &str, p: i32, timeout: Duration) -> Result<i64, String> {
        committed_of(self.of(topic), topic, p, timeout)
    }

    /// Splits a batch's offsets by the group they are committed in.
    fn by_group(&self, offsets: &TopicPartitionList) -> [(&BaseConsumer<Quiet>, TopicPartitionList); 2] {
        let (mut commands, mut events) = (TopicPartitionList::new(), TopicPartitionList::new());
        for e in offsets.elements() {
            let to = if self.events_topics.contains(e.topic()) {
                &mut events
            } else {
                &mut commands
            };
            // Adding an offset that was in a list already cannot fail.
            let _ = to.add_partition_offset(e.topic(), e.partition(), e.offset());
        }
        [(&self.commands, commands), (&self.events, events)]
    }

    /// Sends a batch's offsets to its transaction, each group's under that group's metadata.
    pub(super) fn send_offsets(
        &self,
        p: &ThreadedProducer<Quiet>,
        offsets: &TopicPartitionList,
        deadline: Instant,
    ) -> Result<(), String> {
        for (c, part) in self.by_group(offsets) {
            if part.count() == 0 {
                continue;
            }
            let meta = c.group_metadata().ok_or("no consumer group metadata")?;
            p.send_offsets_to_transaction(&part, &meta, deadline.saturating_duration_since(Instant::now()))
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Commits a batch's offsets outside a transaction (at least once), each group's by its own
    /// consumer.
    pub(super) fn commit(&self, offsets: &TopicPartitionList) -> Result<(), String> {
        for (c, part) in self.by_group(offsets) {
            if part.count() > 0 {
                c.commit(&part, rdkafka::consumer::CommitMode::Sync)
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }

    /// Where a new router of an events partition reads from. The events group has its own
    /// offsets since the commands and the events topics were split into two groups; a partition
    /// it has none for yet goes on from the offset the commands group committed for it before
    /// (workers of an earlier version committed events offsets there), never from its beginning:
    /// that offset is committed to the events group first. `Ok(true)`: the router can start now;
    /// `Ok(false)`: the consumer was moved back to that offset, and the router starts at the next
    /// assignment check (what was polled from the partition meanwhile is dropped).
    pub(super) fn adopt_earlier_offset(
        &self,
        older: &BaseConsumer<Quiet>,
        topic: &str,
        p: i32,
        timeout: Duration,
    ) -> Result<bool, String> {
        if self.committed(topic, p, timeout)? > 0 {
            return Ok(true);
        }
        let earlier = committed_of(older, topic, p, timeout)?;
        if earlier == 0 {
            return Ok(true);
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, p, Offset::Offset(earlier))
            .map_err(|e| e.to_string())?;
        self.events
            .commit(&tpl, rdkafka::consumer::CommitMode::Sync)
            .map_err(|e| format!("cannot take over the earlier committed offset {earlier}: {e}"))?;
        tracing::info!(
            topic,
            partition = p,
            offset = earlier,
            "the events group takes over the offset committed before"
        );
        self.events
            .seek(topic, p, Offset::Offset(earlier), timeout)
            .map_err(|e| e.to_string())?;
        Ok(false)
    }

    /// Leaves both groups.
    pub(super) fn unsubscribe(&self) {
        self.commands.unsubscribe();
        self.events.unsubscribe();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The simulation's shared state, and the runtime it runs on.
    fn sim_shared() -> (tokio::runtime::Runtime, Shared) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap_or_else(|e| panic!("runtime: {e}"));
        let shared = super::super::sim::shared(&rt);
        (rt, shared)
    }

    #[test]
    fn only_the_group_consumers_carry_the_static_name() {
        let (_rt, mut shared) = sim_shared();
        let events = shared.cfg.events_group();
        assert_eq!(group_consumer_config(&shared, "sm4c").get("group.instance.id"), None);
        shared.cfg.group_instance_id = Some("w1".into());
        for g in ["sm4c", events.as_str()] {
            assert_eq!(group_consumer_config(&shared, g).get("group.instance.id"), Some("w1"));
        }
        assert_eq!(offsets_reader_config(&shared).get("group.instance.id"), None);
        // One given as a librdkafka setting names the group consumers only, too.
        shared.cfg.group_instance_id = None;
        shared.cfg.settings.push(("group.instance.id".into(), "w2".into()));
        assert_eq!(
            group_consumer_config(&shared, "sm4c").get("group.instance.id"),
            Some("w2")
        );
        assert_eq!(offsets_reader_config(&shared).get("group.instance.id"), None);
    }

    #[test]
    fn both_groups_rebalance_cooperatively_unless_configured_otherwise() {
        let (_rt, mut shared) = sim_shared();
        assert_eq!(shared.cfg.events_group(), format!("{}.events", shared.cfg.group));
        for g in [shared.cfg.group.clone(), shared.cfg.events_group()] {
            let c = group_consumer_config(&shared, &g);
            assert_eq!(c.get("partition.assignment.strategy"), Some("cooperative-sticky"));
            assert_eq!(c.get("group.id"), Some(g.as_str()));
        }
        shared
            .cfg
            .settings
            .push(("partition.assignment.strategy".into(), "range".into()));
        let c = group_consumer_config(&shared, "sm4c");
        assert_eq!(c.get("partition.assignment.strategy"), Some("range"));
    }

    #[test]
    fn a_batch_commits_commands_and_clock_offsets_in_the_commands_group_and_events_offsets_in_the_events_group() {
        let (_rt, mut shared) = sim_shared();
        shared.cfg.bootstrap = "127.0.0.1:1".into();
        shared.topics = crate::Topics::new("sim", &["orders".to_string()]);
        let c = Consumers::new(&shared).unwrap_or_else(|e| panic!("consumers: {e}"));
        let mut offsets = TopicPartitionList::new();
        for (topic, p, o) in [
            (&shared.topics.commands, 1, 10),
            (&shared.topics.clock, 1, 3),
            (&shared.topics.events[0], 0, 7),
            (&"orders".to_string(), 2, 5),
        ] {
            offsets
                .add_partition_offset(topic, p, Offset::Offset(o))
                .unwrap_or_else(|e| panic!("offset: {e}"));
        }
        let [(commands, ours), (events, theirs)] = c.by_group(&offsets);
        let list = |t: &TopicPartitionList| -> Vec<(String, i32, Offset)> {
            let mut v: Vec<_> = t
                .elements()
                .iter()
                .map(|e| (e.topic().to_string(), e.partition(), e.offset()))
                .collect();
            v.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
            v
        };
        assert!(std::ptr::eq(commands, &c.commands) && std::ptr::eq(events, &c.events));
        assert_eq!(
            list(&ours),
            vec![
                (shared.topics.clock.clone(), 1, Offset::Offset(3)),
                (shared.topics.commands.clone(), 1, Offset::Offset(10)),
            ]
        );
        assert_eq!(
            list(&theirs),
            vec![
                ("orders".to_string(), 2, Offset::Offset(5)),
                (shared.topics.events[0].clone(), 0, Offset::Offset(7)),
            ]
        );
        assert!(std::ptr::eq(c.of(&shared.topics.commands), &c.commands));
        assert!(std::ptr::eq(c.of("orders"), &c.events));
    }

    #[test]
    fn a_fenced_static_member_is_told_which_setting_to_change() {
        use rdkafka::types::RDKafkaErrorCode;
        let why = fatal_consumer_error(RDKafkaErrorCode::FencedInstanceId, "Fatal consumer error");
        assert!(why.contains("--group-instance-id"), "{why}");
        assert!(why.contains("this worker stopped"), "{why}");
        let other = fatal_consumer_error(RDKafkaErrorCode::InconsistentGroupProtocol, "x");
        assert!(!other.contains("--group-instance-id"), "{other}");
    }

    #[test]
    fn the_bell_wakes_a_waiter_and_a_wait_ends_on_its_own() {
        let bell = Arc::new(Bell::default());
        bell.clear();
        // Rung before the wait: the wait returns at once.
        bell.ring();
        bell.wait(Duration::from_secs(30));
        // Rung from another thread while waiting.
        bell.clear();
        let b = bell.clone();
        let t = std::thread::spawn(move || b.ring());
        bell.wait(Duration::from_secs(30));
        t.join().unwrap_or_else(|_| panic!("the ringing thread panicked"));
        // Not rung: the wait ends after its bound.
        bell.clear();
        bell.wait(Duration::from_millis(1));
    }
}
