//! The workers of the group and what each owns: every worker publishes a membership record on
//! `P.members` (compacted, keyed by the worker's member id) with its HTTP address and the commands
//! partitions it has restored, when they change and every [`HEARTBEAT`]; a worker that stops
//! deletes its record. Every worker follows the topic, so any of them can say which worker answers
//! for a partition.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

/// How often a worker publishes its record when nothing changed.
pub const HEARTBEAT: Duration = Duration::from_secs(5);

/// A record older than this is of a worker that is gone (killed before it could delete it).
pub const STALE_MS: i64 = 20_000;

/// One worker, as its membership record has it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Member {
    /// Where its HTTP API answers (`http://host:port`), once it listens.
    pub url: Option<String>,
    /// The commands partitions it owns, restored.
    pub partitions: Vec<i32>,
    /// When it published this record (ms since the epoch, its clock).
    pub at: i64,
    /// When it started (ms since the epoch).
    pub started: i64,
    /// Its static name in the group (`group.instance.id`), when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// The group's members as `P.members` has them, and what this worker publishes.
pub struct Members {
    /// This worker's member id: the key of its record.
    pub me: String,
    started: i64,
    /// This worker's static name in the group, when it has one.
    name: Option<String>,
    known: RwLock<BTreeMap<String, Member>>,
    /// Where this worker's HTTP API answers.
    url: RwLock<Option<String>>,
    /// The commands partitions this worker owns, restored.
    owned: Mutex<Vec<i32>>,
    /// Set once this worker stopped for good (superseded): its record is deleted, and not
    /// published again.
    retired: AtomicBool,
}

impl Members {
    pub fn new(me: String, started: i64, name: Option<String>) -> Members {
        Members {
            me,
            started,
            name,
            known: RwLock::default(),
            url: RwLock::default(),
            owned: Mutex::default(),
            retired: AtomicBool::new(false),
        }
    }

    /// This worker stopped for good: its record is deleted (the next turn of [`run`]), so that a
    /// worker that replaces it under its name need not wait for it ([`hand_over`]).
    pub fn retire(&self) {
        self.retired.store(true, Ordering::Relaxed);
    }

    /// Where this worker's HTTP API answers, once it listens.
    pub fn url(&self) -> Option<String> {
        self.url.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether this worker's own record has been read back from `P.members`: what was published
    /// before it has been read too (the topic has one partition).
    pub fn knows_me(&self) -> bool {
        self.known
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(&self.me)
    }

    /// The live members other than this worker that have its static name and started before it
    /// (see [`Members::superseded_by`] for the order), if it has a name.
    pub fn older_namesakes(&self, now: i64) -> Vec<(String, Member)> {
        let Some(name) = self.name.as_ref() else {
            return Vec::new();
        };
        self.live(now)
            .into_iter()
            .filter(|(k, m)| *k != self.me && m.name.as_ref() == Some(name))
            .filter(|(k, m)| (m.started, k.as_str()) < (self.started, self.me.as_str()))
            .collect()
    }

    /// A record of `P.members`: `None` deletes the member.
    pub fn note(&self, key: &str, payload: Option<&[u8]>) {
        let mut known = self.known.write().unwrap_or_else(|p| p.into_inner());
        match payload.map(serde_json::from_slice::<Member>) {
            Some(Ok(m)) => {
                known.insert(key.to_string(), m);
            }
            Some(Err(e)) => tracing::warn!(member = key, error = %e, "a membership record does not read"),
            None => {
                known.remove(key);
            }
        }
    }

    pub fn set_url(&self, url: String) {
        *self.url.write().unwrap_or_else(|p| p.into_inner()) = Some(url);
    }

    /// The commands partitions this worker owns, sorted.
    pub fn owned(&self) -> Vec<i32> {
        self.owned.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn set_owned(&self, mut partitions: Vec<i32>) {
        partitions.sort_unstable();
        *self.owned.lock().unwrap_or_else(|p| p.into_inner()) = partitions;
    }

    /// This worker's record as of `now`.
    pub fn mine(&self, now: i64) -> Member {
        Member {
            url: self.url.read().unwrap_or_else(|p| p.into_inner()).clone(),
            partitions: self.owned.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            at: now,
            started: self.started,
            name: self.name.clone(),
        }
    }

    /// A live member other than this worker that started later under this worker's static name,
    /// if any: Kafka fences the older of two members of one name (`FENCED_INSTANCE_ID`), and so
    /// does this check on brokers that do not (tansu gave both the same partitions, and the two
    /// fenced each other's transactions in turn).
    pub fn superseded_by(&self, now: i64) -> Option<(String, Member)> {
        let name = self.name.as_ref()?;
        self.live(now)
            .into_iter()
            .filter(|(k, m)| *k != self.me && m.name.as_ref() == Some(name))
            .find(|(k, m)| (m.started, k.as_str()) > (self.started, self.me.as_str()))
    }

    /// The members whose record is fresh at `now`, by member id.
    pub fn live(&self, now: i64) -> BTreeMap<String, Member> {
        self.known
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, m)| now - m.at <= STALE_MS)
            .map(|(k, m)| (k.clone(), m.clone()))
            .collect()
    }

    /// The member that owns commands partition `p` at `now`: of the live members that say they own
    /// it (two may, for a moment, while it moves), the one that said so last.
    pub fn owner(&self, p: i32, now: i64) -> Option<(String, Member)> {
        self.live(now)
            .into_iter()
            .filter(|(_, m)| m.partitions.contains(&p))
            .max_by_key(|(k, m)| (m.at, k.clone()))
    }
}

/// When to publish: `last` is what was published last and when (ms); a record is published when
/// what it says changed, and every [`HEARTBEAT`].
pub fn due(last: Option<&Member>, now: Member) -> Option<Member> {
    match last {
        Some(l)
            if l.url == now.url && l.partitions == now.partitions && now.at - l.at < HEARTBEAT.as_millis() as i64 =>
        {
            None
        }
        _ => Some(now),
    }
}

/// Follows `P.members` and publishes this worker's record (when it changes, and every
/// [`HEARTBEAT`]) until the worker stops; then deletes it, so the others see it leave at once.
pub(crate) fn run(shared: &crate::Shared) {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{Message, Offset, TopicPartitionList};
    use std::sync::atomic::Ordering;
    let topic = shared.topics.members.clone();
    let me = shared.members.me.clone();
    let consumer: Option<BaseConsumer<crate::wire::Quiet>> = shared
        .consumer_config(&format!("{}.members", shared.cfg.group))
        .create_with_context(crate::wire::Quiet)
        .map_err(|e| tracing::error!(error = %e, "cannot follow the membership topic"))
        .ok();
    if let Some(c) = &consumer {
        let mut tpl = TopicPartitionList::new();
        let assigned = tpl
            .add_partition_offset(&topic, 0, Offset::Beginning)
            .map_err(|e| e.to_string())
            .and_then(|()| c.assign(&tpl).map_err(|e| e.to_string()));
        if let Err(e) = assigned {
            tracing::error!(error = %e, "cannot follow the membership topic");
        }
    }
    let publish = |payload: Option<Vec<u8>>| {
        let out = crate::worker::Out {
            topic: topic.clone(),
            partition: Some(0),
            key: Some(me.clone()),
            payload,
            headers: Vec::new(),
        };
        if let Err(e) = crate::worker::produce(&shared.plain, &out) {
            tracing::warn!(error = %e, "cannot publish this worker's membership record");
        }
    };
    let mut last: Option<Member> = None;
    let mut deleted = false;
    while !shared.stop.load(Ordering::Relaxed) {
        let now = sm4c_host::clock::wall_ms();
        if shared.members.retired.load(Ordering::Relaxed) {
            if !deleted {
                publish(None);
                deleted = true;
            }
        } else if let Some(m) = due(last.as_ref(), shared.members.mine(now)) {
            publish(Some(serde_json::to_vec(&m).unwrap_or_default()));
            last = Some(m);
        }
        match consumer.as_ref().map(|c| c.poll(Duration::from_millis(100))) {
            Some(Some(Ok(m))) => {
                if let Some(key) = m.key().map(|k| String::from_utf8_lossy(k).into_owned()) {
                    shared.members.note(&key, m.payload());
                }
            }
            Some(Some(Err(e))) => tracing::debug!(error = %e, "membership reader"),
            Some(None) => {}
            None => std::thread::sleep(Duration::from_millis(100)),
        }
    }
    if !deleted {
        publish(None);
    }
    let _ = rdkafka::producer::Producer::flush(&shared.plain, Duration::from_secs(2));
}

/// How long a worker with a static name waits for an older worker of its name to stop before it
/// joins its groups anyway.
pub const HANDOVER_WAIT: Duration = Duration::from_secs(30);

/// Before a worker with a static name (`--group-instance-id`) joins its consumer groups: an older
/// worker of the same name that still runs is let stop first. That one stops once it reads this
/// worker's record ([`Members::superseded_by`]), and deletes its own ([`Members::retire`]).
///
/// Joining before it has stopped works on Kafka, which fences the older member; tansu instead
/// gives both processes the one member id of the name, and the two took that member's
/// partitions from each other until the group stopped assigning them at all (a rare race that the
/// named-workers test found under load). An older record whose worker is gone (killed: its
/// address is now this worker's, or nothing answers a TCP connection there) is not waited for, so a
/// restart under the same name joins at once. Waits at most [`HANDOVER_WAIT`], then joins with a
/// warning.
pub(crate) fn hand_over(shared: &crate::Shared) {
    let m = &shared.members;
    if m.name.is_none() {
        return;
    }
    let started = Instant::now();
    let stopping = || shared.stop.load(Ordering::Relaxed);
    // What was published before this worker's record has been read once that record reads back;
    // its address is known once it listens (a host embedded without one is not waited for).
    while !(stopping() || m.knows_me() && m.url().is_some()) {
        if started.elapsed() > Duration::from_secs(10) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mine = m.url();
    let mut said = false;
    while !stopping() {
        let running: Vec<(String, Member)> = m
            .older_namesakes(sm4c_host::clock::wall_ms())
            .into_iter()
            .filter(|(_, o)| {
                o.url
                    .as_deref()
                    .is_some_and(|u| Some(u) != mine.as_deref() && answers(u))
            })
            .collect();
        let Some((member, older)) = running.first() else {
            return;
        };
        if started.elapsed() > HANDOVER_WAIT {
            tracing::warn!(
                member,
                url = older.url.as_deref(),
                "an older worker of this worker's name (--group-instance-id) has not stopped; joining the group anyway"
            );
            return;
        }
        if !said {
            tracing::info!(
                member,
                url = older.url.as_deref(),
                "an older worker of this worker's name (--group-instance-id) still runs; it stops on reading this worker's record, then this one joins"
            );
            said = true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether something accepts a TCP connection at `url`'s host and port (within a second).
fn answers(url: &str) -> bool {
    use std::net::{TcpStream, ToSocketAddrs};
    let (https, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (scheme.eq_ignore_ascii_case("https"), rest),
        None => (false, url),
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let with_port = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        authority.to_string()
    } else {
        format!("{authority}:{}", if https { 443 } else { 80 })
    };
    let Ok(addrs) = with_port.to_socket_addrs() else {
        return false;
    };
    addrs
        .into_iter()
        .any(|a| TcpStream::connect_timeout(&a, Duration::from_secs(1)).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(partitions: &[i32], at: i64) -> Member {
        Member {
            url: Some("http://w".into()),
            partitions: partitions.to_vec(),
            at,
            started: 0,
            name: None,
        }
    }

    #[test]
    fn the_owner_of_a_partition_is_the_live_member_that_claimed_it_last() {
        let m = Members::new("me".into(), 0, None);
        let rec = |x: &Member| serde_json::to_vec(x).unwrap();
        m.note("a", Some(&rec(&member(&[0, 1], 1_000))));
        m.note("b", Some(&rec(&member(&[1, 2], 2_000))));
        assert_eq!(m.owner(0, 3_000).map(|(k, _)| k).as_deref(), Some("a"));
        // Both claim partition 1 while it moves: the later claim wins.
        assert_eq!(m.owner(1, 3_000).map(|(k, _)| k).as_deref(), Some("b"));
        assert_eq!(m.owner(3, 3_000), None);
        // A member that stopped publishing is gone after STALE_MS; one that left is gone at once.
        assert_eq!(m.owner(0, 1_000 + STALE_MS + 1), None);
        m.note("b", None);
        assert_eq!(m.owner(1, 3_000).map(|(k, _)| k).as_deref(), Some("a"));
        // A record that does not read changes nothing.
        m.note("a", Some(b"{"));
        assert_eq!(m.owner(0, 3_000).map(|(k, _)| k).as_deref(), Some("a"));
    }

    #[test]
    fn a_worker_is_superseded_by_a_later_live_worker_of_its_name_only() {
        let rec = |name: Option<&str>, started: i64, at: i64| {
            let mut m = member(&[0], at);
            m.name = name.map(str::to_string);
            m.started = started;
            serde_json::to_vec(&m).unwrap()
        };
        let m = Members::new("me".into(), 1_000, Some("w1".into()));
        // Its own record, an earlier worker of its name, and a later one of another name: no.
        m.note("me", Some(&rec(Some("w1"), 1_000, 5_000)));
        m.note("old", Some(&rec(Some("w1"), 500, 5_000)));
        m.note("other", Some(&rec(Some("w2"), 2_000, 5_000)));
        m.note("unnamed", Some(&rec(None, 2_000, 5_000)));
        assert_eq!(m.superseded_by(6_000), None);
        // A later one of its name: yes, while its record is live.
        m.note("new", Some(&rec(Some("w1"), 2_000, 5_000)));
        assert_eq!(m.superseded_by(6_000).map(|(k, _)| k).as_deref(), Some("new"));
        assert_eq!(m.superseded_by(5_000 + STALE_MS + 1), None);
        // The earlier worker is superseded by this one; a worker without a name never is.
        let old = Members::new("old".into(), 500, Some("w1".into()));
        old.note("me", Some(&rec(Some("w1"), 1_000, 5_000)));
        assert_eq!(old.superseded_by(6_000).map(|(k, _)| k).as_deref(), Some("me"));
        let unnamed = Members::new("u".into(), 0, None);
        unnamed.note("me", Some(&rec(Some("w1"), 1_000, 5_000)));
        assert_eq!(unnamed.superseded_by(6_000), None);
        // Records of builds without names still read.
        let legacy = br#"{"url":null,"partitions":[1],"at":5000,"started":9000}"#;
        m.note("legacy", Some(legacy));
        assert_eq!(m.live(6_000)["legacy"].name, None);
        // The older workers of its name are the ones a hand-over waits for; only once its own
        // record read back does it know it has read what came before.
        let older: Vec<String> = m.older_namesakes(6_000).into_iter().map(|(k, _)| k).collect();
        assert_eq!(older, ["old"]);
        assert!(m.knows_me());
        assert!(!Members::new("fresh".into(), 0, Some("w1".into())).knows_me());
        assert!(unnamed.older_namesakes(6_000).is_empty());
        m.note("old", None);
        assert!(m.older_namesakes(6_000).is_empty());
    }

    #[test]
    fn a_worker_that_is_gone_does_not_answer_at_its_address() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        assert!(answers(&format!("http://127.0.0.1:{port}")));
        assert!(answers(&format!("https://127.0.0.1:{port}/")));
        drop(listener);
        assert!(!answers(&format!("http://127.0.0.1:{port}")));
        assert!(!answers("http://no-such-host.invalid:1"));
    }

    #[test]
    fn a_record_is_published_when_it_changes_and_every_heartbeat() {
        let last = member(&[0], 1_000);
        assert_eq!(due(Some(&last), member(&[0], 2_000)), None);
        assert!(due(Some(&last), member(&[0, 1], 2_000)).is_some());
        assert!(due(Some(&last), member(&[0], 1_000 + HEARTBEAT.as_millis() as i64)).is_some());
        assert!(due(None, member(&[], 0)).is_some());
    }
}
