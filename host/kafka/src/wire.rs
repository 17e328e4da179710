//! What goes over Kafka: instance commands, state records, journal records and CloudEvents.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sm4c_runtime::kernel::hash::{fnv1a32, Fnv1a64};
use sm4c_runtime::{Entry, ErrorInfo, Snapshot};
use std::collections::HashMap;

/// A message on the commands topic, keyed by instance id (by the correlation key for events routed
/// by key and for subscriptions, by nothing for broadcasts).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Command {
    /// Start an instance (API, start event or a parent's `invokeSubflow`).
    Start {
        /// Instance id.
        id: String,
        /// Definition id.
        definition: String,
        /// Definition version (latest when absent).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        version: Option<String>,
        /// Input.
        input: Value,
        /// Parent instance, operation and whether it waits.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        parent: Option<sm4c_host::driver::ParentLink>,
        /// Subflow nesting depth.
        #[serde(default)]
        depth: u32,
        /// For a start event: where it was read.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        origin: Option<Origin>,
        /// For a start through the API: a token unique to the request, kept by the instance it
        /// creates, so that of two requests for one id only the one that created it says so.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        request: Option<String>,
        /// The W3C `traceparent` of the request or event that started the instance (its origin):
        /// the spans of its steps link to it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        traceparent: Option<String>,
        /// For a run of a schedule: the schedule, on its id's partition, which is told when the
        /// instance ends ([`Command::ScheduleEnded`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        schedule: Option<String>,
        /// For a run of a schedule: its nominal time (ms).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        nominal: Option<i64>,
    },
    /// The step debugger: a paused instance goes on (`step`: to the next breakpoint-able point).
    Resume {
        /// Instance id.
        id: String,
        /// Pause again at the next point.
        #[serde(default)]
        step: bool,
    },
    /// Cancel an instance.
    Cancel {
        /// Instance id.
        id: String,
        /// Why.
        reason: String,
    },
    /// Move an instance to another version of its definition.
    Migrate {
        /// Instance id.
        id: String,
        /// The version.
        version: String,
        /// Old state name to new, where they differ.
        #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
        states: std::collections::BTreeMap<String, String>,
    },
    /// Redrive a failed or timed-out instance, its data changed by `update` (a jq expression).
    Redrive {
        /// Instance id.
        id: String,
        /// The update, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        update: Option<String>,
    },
    /// An incoming event for one instance (`target`) or for every instance of the partition.
    Event {
        /// The instance the event names, if it names one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        target: Option<String>,
        /// The event, in CloudEvents JSON form.
        event: Value,
        /// Where it was read (`topic/partition/offset`), so a copy delivered twice is applied once.
        origin: Origin,
        /// For broadcasts: the partition that counts the partitions it reached none on.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        home: Option<i32>,
        /// For an event routed by its correlation key: how many partitions the key's partition
        /// handed it to (`home` dead-letters it once that many said no instance took it; a
        /// broadcast expects every partition).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expect: Option<u32>,
    },
    /// An incoming event without `sm4cinstanceid` whose correlation key ([`corr_key`]) this
    /// partition owns: handed to the partitions of the instances subscribed to the key, or
    /// parked here until one subscribes.
    Keyed {
        /// The correlation key.
        key: String,
        /// The event, in CloudEvents JSON form.
        event: Value,
        /// Where it was read.
        origin: Origin,
    },
    /// Instance `id` may take events carrying correlation key `key`: sent by the instance's
    /// owner to the key's partition when the instance's key appears.
    Subscribe {
        /// The correlation key.
        key: String,
        /// Instance id.
        id: String,
    },
    /// Instance `id` no longer takes events of correlation key `key` (its data changed, or it
    /// ended).
    Unsubscribe {
        /// The correlation key.
        key: String,
        /// Instance id.
        id: String,
    },
    /// The key's partition took a new subscription of instance `id` to correlation key `key`:
    /// sent back to the instance's partition, whose owner answers with an [`Command::Unsubscribe`]
    /// when the instance does not take the key's events. On a broker that shows the records of
    /// aborted transactions (tansu), a `Subscribe` of a transaction that was aborted is taken
    /// all the same, and the transaction that replaced it may never have subscribed (the
    /// instance ended in it): without this the subscription stayed for good. The answer comes
    /// after every input of the aborted transaction was decided again (it is later in the
    /// instance partition's log), and the instance's owner sends its subscription changes in
    /// the order it commits them, so the key's partition ends with what the owner holds.
    Subscribed {
        /// The correlation key.
        key: String,
        /// Instance id.
        id: String,
    },
    /// A call or subflow the instance started has a result.
    Result {
        /// Instance id.
        id: String,
        /// Operation id.
        op: String,
        /// The result or the error.
        outcome: Outcome,
    },
    /// A worker answered a task: completed, failed or heartbeat.
    Answer {
        /// Instance id.
        id: String,
        /// The task's operation id.
        op: String,
        /// What the worker said.
        answer: sm4c_host::tasks::Answer,
        /// The `sm4c.task.*` CloudEvent it came in, and where it was read; dead-lettered if the
        /// task is closed. `None` for answers through the HTTP API.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        event: Option<(Value, Origin)>,
        /// For an answer through the HTTP API: a token unique to the request, kept by the instance
        /// if this answer closes the task, so that of two concurrent answers only the one applied
        /// says so.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        request: Option<String>,
    },
    /// A timer came due.
    Timer {
        /// Instance id.
        id: String,
        /// Timer id.
        timer: String,
    },
    /// Time passes: parked events past their window leave, broadcast tallies past their
    /// retention go, and ended instances past `--retention` are deleted, each measured in the
    /// partition's stream time. `at`: the time the proposing owner found something due at (a
    /// parked event's window, a tally's or an ended instance's retention), which moves the
    /// stream time on to it; `None` (an idle partition's refresh, a router's or the stall
    /// guard's tick) moves nothing. Never the proposer's clock reading: what is decided follows
    /// the inputs, the clock only says when to propose.
    Tick {
        /// The due time this tick was proposed for (ms).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at: Option<i64>,
    },
    /// Put by a worker that took the partition or an events partition: once it reads its own
    /// barrier back, the commands routed here before it are applied.
    Barrier {
        /// Unique to the barrier.
        token: String,
    },
    /// What `/schedules` asks of schedule `schedule`, on the partition its id hashes to: decided
    /// by the partition's owner like any command, and answered to the request `request`.
    Schedule {
        /// The schedule's id.
        schedule: String,
        /// What is asked.
        op: ScheduleCmd,
        /// The API request's token: the answer is kept under it for the request that waits.
        request: String,
    },
    /// Schedule `schedule` has something to do: proposed by its owner when the time came (as a
    /// timer is), decided at the command's timestamp. A repeated one does nothing more.
    ScheduleTick {
        /// The schedule's id.
        schedule: String,
    },
    /// A run of schedule `schedule` ended (or never started): sent by the run's partition to the
    /// schedule's, for its overlap policy.
    ScheduleEnded {
        /// The schedule's id.
        schedule: String,
        /// The run's instance.
        instance: String,
        /// Its final status (`completed`, `failed`, ..., `notStarted`).
        status: String,
    },
    /// A batch operation (`POST /batches`), sent to every commands partition: each owner
    /// applies it to its own instances, keeping its share as a record of the partition's own
    /// ([`batch_key`]). A repeated one does nothing more.
    Batch {
        /// The batch's id.
        id: String,
        /// The request, as posted (checked before it was sent; without `dryRun`).
        spec: Value,
        /// When it was posted (ms since the Unix epoch).
        created: i64,
    },
    /// Batch `id` has instances left on this partition: proposed by the partition's owner at
    /// the batch's pace, decided at the command's timestamp, it applies the next group.
    BatchTick {
        /// The batch's id.
        id: String,
    },
    /// `POST /batches/{id}/cancel`, sent to every commands partition: the partition's share
    /// stops (the instances without an outcome are left as they are).
    BatchStop {
        /// The batch's id.
        id: String,
    },
    /// A broadcast event stayed unmatched on `partition` for its whole window.
    Unmatched {
        /// The event's key (`origin`).
        key: String,
        /// The reporting partition.
        partition: i32,
        /// The event.
        event: Value,
        /// How many partitions must report it (every partition when absent).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expect: Option<u32>,
    },
}

impl Command {
    /// Where the incoming event this command was made of was read, if it was made of one.
    pub fn origin(&self) -> Option<&Origin> {
        match self {
            Command::Event { origin, .. } | Command::Keyed { origin, .. } => Some(origin),
            Command::Start { origin, .. } => origin.as_ref(),
            Command::Answer { event, .. } => event.as_ref().map(|(_, o)| o),
            _ => None,
        }
    }
}

/// An operation on a schedule ([`Command::Schedule`]); the specification is checked before the
/// command is appended, and again by the owner.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "op")]
pub enum ScheduleCmd {
    /// Register it (the specification, as JSON).
    Create {
        /// Its specification.
        spec: Value,
    },
    /// Change its specification; what it did and owes is kept.
    Replace {
        /// Its new specification.
        spec: Value,
    },
    /// Pause it.
    Pause,
    /// Resume it.
    Resume,
    /// Start one now.
    Trigger,
    /// One start per nominal time in `[from, to)` (ms).
    Backfill {
        /// From (ms).
        from: i64,
        /// To (ms, not included).
        to: i64,
    },
    /// Delete it.
    Delete,
}

/// A call's result.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Outcome {
    /// It returned.
    Ok(Value),
    /// It failed.
    Err(ErrorInfo),
}

/// Where an incoming event was read.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Hash)]
pub struct Origin {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
}

impl Origin {
    /// `topic/partition/offset`.
    pub fn key(&self) -> String {
        format!("{}/{}/{}", self.topic, self.partition, self.offset)
    }
}

/// A record on the state topic. `through` is the last commands offset the writing transaction
/// consumed: a record whose `through` is not below the committed offset comes from a transaction
/// that did not commit, and restoring skips it (brokers that do not filter aborted records
/// cannot then fool a new owner).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StateRecord {
    /// Last consumed commands offset of the writing transaction (-1 when it consumed none).
    pub through: i64,
    /// The writing transaction's number on its partition's clock: the record is committed when
    /// the group's committed offset of `P.clock` for the partition is above it. Records without
    /// one are judged by `through`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock: Option<i64>,
    /// The instance, for instance keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<InstanceRecord>,
    /// The partition's own state, for the partition key: written by earlier versions, read once
    /// and replaced by one record per parked event and tally entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<PartitionRecord>,
    /// A parked event, for a [`parked_key`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parked: Option<Parked>,
    /// A tally entry, for a [`tally_key`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tally: Option<Tally>,
    /// A subscription to a correlation key this partition owns, for a [`subscription_key`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subscription: Option<Subscription>,
    /// A schedule whose id hashes to this partition, for a [`schedule_key`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<ScheduleRecord>,
    /// The partition's share of a batch, for a [`batch_key`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<sm4c_host::batch::Share>,
    /// The partition's stream time (ms) after the transaction, for the [`POSITION_KEY`]: a new
    /// owner starts from it. Without it (records of earlier versions) the stream time started at
    /// 0, and until an input with a timestamp moved it, the records the owner produced were
    /// stamped 0: a partition that parked an event routed by one of them took its window to end
    /// 5 minutes after 1970 and reported it unmatched at once (simulation seeds 1030 and 2929).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<i64>,
}

/// A schedule as its partition keeps it: its specification and what it did and owes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ScheduleRecord {
    /// Its specification, as JSON ([`sm4c_schedule::Spec::to_json`]).
    pub spec: Value,
    /// Its state.
    pub state: sm4c_schedule::State,
}

/// See [`PARKED_PREFIX`].
pub const SCHEDULE_PREFIX: &str = "\u{0}schedule/";

/// The state topic key of schedule `id` (on partition `partition_of(id)`).
pub fn schedule_key(id: &str) -> String {
    format!("{SCHEDULE_PREFIX}{id}")
}

/// See [`PARKED_PREFIX`].
pub const BATCH_PREFIX: &str = "\u{0}batch/";

/// The state topic key of a partition's share of batch `id` (on every partition).
pub fn batch_key(id: &str) -> String {
    format!("{BATCH_PREFIX}{id}")
}

/// An instance that may take the events of a correlation key: kept by the key's partition.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Subscription {
    /// The correlation key ([`corr_key`]).
    pub key: String,
    /// The instance.
    pub id: String,
}

/// See [`PARKED_PREFIX`].
pub const SUBSCRIPTION_PREFIX: &str = "\u{0}sub/";

/// The state topic key of a subscription.
pub fn subscription_key(key: &str, id: &str) -> String {
    format!("{SUBSCRIPTION_PREFIX}{key}\u{0}{id}")
}

/// A correlation key: the correlation attribute (lower case) and the value an event carries. The
/// partition that owns it is `partition_of(key)`.
pub fn corr_key(attribute: &str, value: &str) -> String {
    format!("{attribute}\u{1}{value}")
}

/// The partitions that reported no instance for a broadcast event, the event, and when the first
/// report came (ms).
pub type Tally = (Vec<i32>, Value, i64);

/// What the state topic keys of a partition's own records start with: parked events, tally
/// entries. Instance ids never start with a NUL character.
pub const PARKED_PREFIX: &str = "\u{0}parked/";

/// The key prefix of the step debugger's breakpoints of a definition on the definitions topic
/// (followed by the definition id; the value is the JSON list, a tombstone clears it).
pub const BREAKPOINTS_PREFIX: &str = "\u{0}breakpoints/";
/// The key prefix of a definition id's default version on the definitions topic (followed by the
/// id; the value is `{"version": V}`, a tombstone clears it: new starts take the newest again).
pub const DEFAULT_VERSION_PREFIX: &str = "\u{0}default-version/";
/// See [`PARKED_PREFIX`].
pub const TALLY_PREFIX: &str = "\u{0}tally/";

/// The state topic key of a parked event: one record each, so that nothing grows into one ever
/// larger record (they used to share the partition's record, which outgrew the broker's message
/// limit and failed every transaction after it).
pub fn parked_key(p: &Parked) -> String {
    format!(
        "{PARKED_PREFIX}{}#{}",
        p.origin.key(),
        p.target.as_deref().unwrap_or("")
    )
}

/// The state topic key of a tally entry (`origin` is the event's [`Origin::key`]).
pub fn tally_key(origin: &str) -> String {
    format!("{TALLY_PREFIX}{origin}")
}

/// The header of a tombstone on the state topic that carries the deleting transaction's number
/// (as [`StateRecord::clock`]), so that a restore honours only committed deletions.
pub const CLOCK_HEADER: &str = "sm4c-clock";

/// An instance as its owner keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceRecord {
    /// The engine's snapshot.
    pub snapshot: Snapshot,
    /// Parent instance, operation, whether it waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<sm4c_host::driver::ParentLink>,
    /// Subflow depth.
    #[serde(default)]
    pub depth: u32,
    /// Calls and subflow starts in flight: (op, effect).
    #[serde(default)]
    pub calls: Vec<(String, sm4c_runtime::Effect)>,
    /// Journal length.
    pub journal_len: i64,
    /// Last applied offset per event source partition (`topic/partition`).
    #[serde(default)]
    pub seen: std::collections::BTreeMap<String, i64>,
    /// Creation order, for listings (ms timestamp of the start command, then its offset).
    #[serde(default)]
    pub order: (i64, i64),
    /// The token of the API request that created the instance, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// The W3C `traceparent` of what started the instance, kept so the spans of its steps link
    /// to it after a restore too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    /// The latest tasks closed by an answer through the HTTP API: (op, request token), at most
    /// [`ANSWERS_KEPT`], newest last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub answered: Vec<(String, String)>,
    /// The `source` and `id` of the latest events the instance took, at most [`EVENTS_KEPT`],
    /// newest last: an event with the same pair is a duplicate (as the CloudEvents spec has it),
    /// e.g. a `POST /events` retried by its client, and is not applied again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recent: Vec<(String, String)>,
    /// The schedule that started the instance, if one did: told when it ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
}

/// How many event ids an instance record remembers (see [`InstanceRecord::recent`]).
pub const EVENTS_KEPT: usize = 32;

/// How many API answers an instance record remembers (see [`InstanceRecord::answered`]): enough
/// for the requests still waiting to learn whether theirs was the one applied.
pub const ANSWERS_KEPT: usize = 16;

/// Events parked on a partition, and the tally of partitions that found no instance for a
/// broadcast event this partition is home to.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PartitionRecord {
    /// Parked events.
    pub parked: Vec<Parked>,
    /// Broadcast event key → (partitions that reported no instance, event, first report time).
    pub tally: std::collections::BTreeMap<String, (Vec<i32>, Value, i64)>,
}

/// An event waiting for an instance.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Parked {
    /// The event.
    pub event: Value,
    /// Where it was read.
    pub origin: Origin,
    /// The instance it names, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// The home partition of a broadcast.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home: Option<i32>,
    /// For an event routed by key: the correlation key, while it is parked at the key's
    /// partition (a subscription takes it from there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// For an event routed by key: how many partitions `home` waits for (see
    /// [`Command::Event`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect: Option<u32>,
    /// When it leaves (ms).
    pub expires: i64,
}

/// The journal entries one transaction appended to an instance's journal, keyed by instance id.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JournalRecord {
    /// As for [`StateRecord::through`].
    pub through: i64,
    /// As for [`StateRecord::clock`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock: Option<i64>,
    /// Sequence number of the first entry in the instance's journal (from 1).
    pub seq: i64,
    /// The entries, in order.
    pub entries: Vec<Entry>,
}

/// Whether a state or journal record was written by a committed transaction, given the committed
/// offsets of its commands partition and of its clock partition: brokers that show records of
/// aborted transactions cannot fool a reader that checks this.
pub fn committed(through: i64, clock: Option<i64>, commands: i64, clock_committed: i64) -> bool {
    match clock {
        Some(c) => c < clock_committed,
        None => through < commands,
    }
}

/// The state topic's key of a partition's position: every transaction of its owner writes it first,
/// a [`StateRecord`] with only `through` (the last commands offset applied, -1 for none) and
/// `clock` (the transaction's number). The group's committed offsets say the same, until they are
/// lost (expired after `offsets.retention.minutes` with no worker running, or reset by hand): a
/// restore that reads a position the committed offsets are behind repairs them from it (see
/// `worker::restore`), rather than reading the partition's commands again from the beginning.
pub const POSITION_KEY: &str = "\u{0}position";

/// The state topic's key for a partition's own record.
pub const PARTITION_KEY: &str = "\u{0}partition";

/// The partition of an instance id: FNV-1a, so every worker and tool computes the same.
pub fn partition_of(id: &str, partitions: i32) -> i32 {
    (fnv1a32(id.as_bytes()) % partitions.max(1) as u32) as i32
}

/// The id of the instance a start event starts: derived from the event's `source` and `id`, so
/// a redelivered event starts nothing new.
pub fn start_id(definition: &str, source: &str, id: &str) -> String {
    let h = Fnv1a64::new()
        .update(source.as_bytes())
        .update(&[0])
        .update(id.as_bytes())
        .finish();
    format!("{definition}-{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A tick names the due time it is for (issue 34, item 5); in a cluster being upgraded, a
    /// worker of the version before reads it as the tick it knew, and a tick of that version
    /// reads as one that names nothing.
    #[test]
    fn a_tick_that_names_its_due_time_reads_back_in_both_versions() {
        #[derive(Debug, Deserialize, PartialEq)]
        #[serde(rename_all = "camelCase", tag = "kind")]
        enum Before {
            Tick,
        }
        let new = serde_json::to_string(&Command::Tick { at: Some(5) }).expect("json");
        assert_eq!(new, r#"{"kind":"tick","at":5}"#);
        assert_eq!(
            serde_json::from_str::<Before>(&new).expect("read by the version before"),
            Before::Tick
        );
        let old = r#"{"kind":"tick"}"#;
        assert!(matches!(
            serde_json::from_str::<Command>(old).expect("a tick of the version before"),
            Command::Tick { at: None }
        ));
    }

    #[test]
    fn a_repeated_librdkafka_message_is_logged_once_a_window_with_its_count() {
        let t0 = std::time::Instant::now();
        let mut r = Repeats::default();
        let down = |port: u32| format!("127.0.0.1:{port}/1: Connect failed: Connection refused (after {port}ms)");
        assert_eq!(r.admit(&down(4001), t0), Some(0));
        // The same message with other numbers in it: quiet, and counted.
        assert_eq!(r.admit(&down(4002), t0 + Duration::from_secs(1)), None);
        assert_eq!(r.admit(&down(4003), t0 + Duration::from_secs(29)), None);
        // Another message is not held back by the first.
        assert_eq!(r.admit("1/1 brokers are down", t0 + Duration::from_secs(2)), Some(0));
        // Once the window has passed, logged again with how often it came meanwhile.
        assert_eq!(r.admit(&down(4004), t0 + REPEAT_WINDOW), Some(2));
        assert_eq!(r.admit(&down(4005), t0 + REPEAT_WINDOW + Duration::from_secs(1)), None);
    }

    #[test]
    fn partitions_and_start_ids_are_stable() {
        // Fixed values: other workers and tools must compute the same partition for an id.
        assert_eq!(partition_of("order-1", 8), partition_of("order-1", 8));
        let spread: std::collections::HashSet<i32> = (0..100).map(|i| partition_of(&format!("i{i}"), 8)).collect();
        assert_eq!(spread.len(), 8);
        assert_eq!(start_id("saga", "/shop", "e1"), start_id("saga", "/shop", "e1"));
        assert_ne!(start_id("saga", "/shop", "e1"), start_id("saga", "/shop", "e2"));
        assert_ne!(start_id("saga", "/sho", "pe1"), start_id("saga", "/shop", "e1"));
    }

    #[test]
    fn partitions_and_start_ids_are_pinned() {
        // Taken from the build before the hash moved to the kernel: a record already written is
        // on the partition these give, and a start event redelivered names the same instance.
        for (id, partitions, want) in [
            ("", 12, 1),
            ("a", 12, 4),
            ("order-1", 12, 1),
            ("order-1", 16, 13),
            ("helloworld-1", 3, 1),
            ("helloworld-1", 16, 15),
            ("order-1", 1, 0),
            ("order-1", 0, 0),
        ] {
            assert_eq!(partition_of(id, partitions), want, "{id:?} over {partitions}");
        }
        assert_eq!(start_id("d", "src", "e1"), "d-3b5ae054e8c1bea1");
        assert_eq!(start_id("d", "", ""), "d-af63bd4c8601b7df");
    }
}

/// librdkafka's client callbacks, routed to `tracing`: end-of-partition notices are not errors,
/// settings meant for the other kind of client are not worth a warning, and a warning or error
/// that every client repeats while the broker is away is logged once per [`REPEAT_WINDOW`].
#[derive(Clone, Default)]
pub struct Quiet;

/// How long an identical librdkafka warning or error stays quiet after it was logged.
pub const REPEAT_WINDOW: std::time::Duration = std::time::Duration::from_secs(30);

/// Which repeated messages to log: a message is logged when it is new or its window has passed,
/// with how many times it came meanwhile. Messages that differ only in numbers (ports, times,
/// counts, partitions) count as the same.
#[derive(Default)]
pub struct Repeats {
    seen: HashMap<String, (std::time::Instant, u64)>,
}

impl Repeats {
    /// `Some(n)`: log it, saying it came `n` more times since it was last logged; `None`: quiet.
    pub fn admit(&mut self, message: &str, now: std::time::Instant) -> Option<u64> {
        let key: String = message.chars().filter(|c| !c.is_ascii_digit()).collect();
        if self.seen.len() > 1000 {
            self.seen.retain(|_, (at, _)| now.duration_since(*at) < REPEAT_WINDOW);
        }
        match self.seen.get_mut(&key) {
            Some((at, n)) if now.duration_since(*at) < REPEAT_WINDOW => {
                *n += 1;
                None
            }
            Some((at, n)) => {
                let quiet = *n;
                (*at, *n) = (now, 0);
                Some(quiet)
            }
            None => {
                self.seen.insert(key, (now, 0));
                Some(0)
            }
        }
    }
}

fn repeats(message: &str) -> Option<u64> {
    static REPEATS: std::sync::OnceLock<std::sync::Mutex<Repeats>> = std::sync::OnceLock::new();
    REPEATS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .admit(message, std::time::Instant::now())
}

impl rdkafka::ClientContext for Quiet {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        use rdkafka::config::RDKafkaLogLevel as L;
        if fac == "CONFWARN" && (message.contains("consumer property") || message.contains("producer property")) {
            tracing::debug!(target: "librdkafka", "{fac}: {message}");
            return;
        }
        match level {
            L::Emerg | L::Alert | L::Critical | L::Error | L::Warning => {
                let Some(quiet) = repeats(&format!("{fac}: {message}")) else {
                    tracing::debug!(target: "librdkafka", "{fac}: {message}");
                    return;
                };
                if matches!(level, L::Warning) {
                    tracing::warn!(target: "librdkafka", repeated = quiet, "{fac}: {message}");
                } else {
                    tracing::error!(target: "librdkafka", repeated = quiet, "{fac}: {message}");
                }
            }
            L::Notice | L::Info => tracing::info!(target: "librdkafka", "{fac}: {message}"),
            L::Debug => tracing::debug!(target: "librdkafka", "{fac}: {message}"),
        }
    }

    /// The statistics of the worker's consumer (the only client that asks for them): each
    /// partition's consumer lag, to the metrics.
    fn stats(&self, statistics: rdkafka::Statistics) {
        let Some(o) = sm4c_host::metrics::observer() else {
            return;
        };
        for (topic, t) in &statistics.topics {
            for (p, part) in &t.partitions {
                if *p >= 0 {
                    o.kafka_lag(topic, *p, part.consumer_lag.max(0));
                }
            }
        }
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        if error.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::PartitionEOF) {
            return;
        }
        match repeats(&format!("{error}: {reason}")) {
            Some(quiet) => tracing::warn!(target: "librdkafka", error = %error, repeated = quiet, "{reason}"),
            None => tracing::debug!(target: "librdkafka", error = %error, "{reason}"),
        }
    }
}

impl rdkafka::consumer::ConsumerContext for Quiet {}

impl rdkafka::producer::ProducerContext for Quiet {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &rdkafka::message::DeliveryResult<'_>, _: ()) {
        use rdkafka::Message;
        match result {
            Ok(m) => note_delivered(m.topic(), m.partition(), m.offset()),
            Err((e, m)) => {
                tracing::warn!(target: "librdkafka", error = %e, topic = m.topic(), "a message was not delivered")
            }
        }
    }
}

type Delivered = std::sync::Mutex<HashMap<(String, i32), i64>>;

fn delivered_map() -> &'static Delivered {
    static DELIVERED: std::sync::OnceLock<Delivered> = std::sync::OnceLock::new();
    DELIVERED.get_or_init(Default::default)
}

fn note_delivered(topic: &str, p: i32, offset: i64) {
    let mut map = delivered_map().lock().unwrap_or_else(|p| p.into_inner());
    match map.get_mut(&(topic.to_string(), p)) {
        Some(o) => *o = (*o).max(offset),
        None => {
            map.insert((topic.to_string(), p), offset);
        }
    }
}

/// The largest offset of a record this process's producers had acknowledged on a partition.
/// Once a transaction committed (its records all acknowledged first), the offset after it is
/// past every record that transaction wrote there.
pub fn delivered(topic: &str, p: i32) -> Option<i64> {
    delivered_map()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&(topic.to_string(), p))
        .copied()
}
