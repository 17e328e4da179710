//! What a schedule does as time passes: a deterministic state machine that a host keeps durable
//! beside the schedule's specification and drives with its clock.
//!
//! [`State::tick`] is given the time now and answers what to do: instances to start (each under its
//! nominal time's id, so a start repeated after a crash or a failover is the same start) and
//! instances to cancel. The host tells it when one of its instances ends ([`State::ended`]). No
//! clock is read here: the same inputs give the same actions on every worker.

use crate::spec::{Overlap, Spec};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, VecDeque};

/// How many runs a schedule remembers (what `GET /schedules/{id}` shows).
pub const RECENT: usize = 10;

/// At most this many times one backfill asks for.
pub const MAX_BACKFILL: usize = 10_000;

/// One start of a schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Run {
    /// Its nominal time (ms since the epoch).
    pub nominal: i64,
    /// The instance started.
    pub instance: String,
    /// How late it was started (ms after its nominal time).
    pub late: i64,
    /// Its status once it ended (`completed`, `failed`, ...); `None` while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
}

/// Times a schedule did not run, by why.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Skipped {
    /// The previous instance still ran (overlap `skip`, or a second time for `bufferOne`).
    pub overlap: u64,
    /// Missed for longer than the catch-up window (the server, or every worker, was down).
    pub catchup: u64,
    /// The schedule was paused.
    pub paused: u64,
}

impl Skipped {
    /// The times skipped since `was` (an earlier count of the same schedule), by reason
    /// (`overlap`, `catchup`, `paused`; the metric's `reason` label), reasons with none left out.
    pub fn since(&self, was: &Skipped) -> Vec<(&'static str, u64)> {
        [
            ("overlap", self.overlap.saturating_sub(was.overlap)),
            ("catchup", self.catchup.saturating_sub(was.catchup)),
            ("paused", self.paused.saturating_sub(was.paused)),
        ]
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .collect()
    }
}

/// What to do now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Start the schedule's definition as `instance` (its id says the nominal time).
    Start {
        /// The nominal time.
        nominal: i64,
        /// The instance's id, `<schedule>@<nominal time>`.
        instance: String,
        /// How late the start is (ms after its nominal time).
        late: i64,
    },
    /// Cancel a running instance of the schedule (overlap `cancelOther`).
    Cancel {
        /// The instance to cancel.
        instance: String,
    },
}

/// A schedule's state: what it has done and what it still owes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct State {
    /// The latest nominal time dealt with (started, kept or skipped): later ones are to come.
    pub last: i64,
    /// Paused: times that come are skipped.
    pub paused: bool,
    /// Times kept for when the running instance ends (`bufferOne`, `bufferAll`).
    #[serde(default)]
    pub buffered: VecDeque<i64>,
    /// Times a backfill asked for, not yet dealt with.
    #[serde(default)]
    pub backfill: VecDeque<i64>,
    /// Instances started by this schedule that have not ended.
    #[serde(default)]
    pub running: BTreeSet<String>,
    /// The latest runs, oldest first.
    #[serde(default)]
    pub recent: VecDeque<Run>,
    /// How many instances it started.
    #[serde(default)]
    pub runs: u64,
    /// Times not run, by why.
    #[serde(default)]
    pub skipped: Skipped,
}

impl State {
    /// A schedule created at `now`: its first time is the first after `now`.
    pub fn new(spec: &Spec, now: i64) -> State {
        State {
            last: now,
            paused: spec.paused,
            buffered: VecDeque::new(),
            backfill: VecDeque::new(),
            running: BTreeSet::new(),
            recent: VecDeque::new(),
            runs: 0,
            skipped: Skipped::default(),
        }
    }

    /// When the schedule next has something to do: its next time's start (with jitter), or now
    /// when a kept or backfilled time can start. `None`: nothing more, ever (past `endAt`), unless
    /// an instance ends or an operator asks.
    pub fn wake_at(&self, spec: &Spec, now: i64) -> Option<i64> {
        let ready =
            (!self.backfill.is_empty() || (!self.buffered.is_empty() && self.running.is_empty())).then_some(now);
        let next = spec.next_after(self.last).map(|n| spec.due_at(n));
        match (ready, next) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The next `count` nominal times to come (for people: paused or not).
    pub fn upcoming(&self, spec: &Spec, count: usize) -> Vec<i64> {
        spec.times_after(self.last, count)
    }

    /// What to do at `now`: the times whose start is due are dealt with in order (kept times
    /// first, then the times that came, then backfilled ones), up to the first that starts. The
    /// next tick, once that start is decided, goes on ([`State::wake_at`] is then `now`): a
    /// catch-up or a backfill of short runs starts every time, one after another, while under
    /// `skip` a run that does not end in between makes the next times pass.
    pub fn tick(&mut self, spec: &Spec, now: i64) -> Vec<Action> {
        let mut out = Vec::new();
        self.pass_missed(spec, now);
        if self.start_kept(spec, now, &mut out) {
            return out;
        }
        while let Some(n) = spec.next_after(self.last) {
            if spec.due_at(n) > now {
                break;
            }
            self.last = n;
            if self.paused {
                self.skipped.paused += 1;
            } else if now - n > spec.catchup_window {
                self.skipped.catchup += 1;
            } else if self.offer(spec, n, now, &mut out) {
                return out;
            }
        }
        while let Some(n) = self.backfill.pop_front() {
            if self.offer(spec, n, now, &mut out) {
                return out;
            }
        }
        out
    }

    /// Instance `instance` of this schedule ended with `status`.
    pub fn ended(&mut self, instance: &str, status: &str) {
        if self.running.remove(instance) {
            if let Some(r) = self.recent.iter_mut().rev().find(|r| r.instance == instance) {
                r.outcome = Some(status.to_string());
            }
        }
    }

    /// Pauses the schedule at `now`: times that come from now on are skipped (and counted).
    pub fn pause(&mut self, spec: &Spec, now: i64) -> Vec<Action> {
        let out = self.tick(spec, now);
        self.paused = true;
        out
    }

    /// Resumes the schedule at `now`: the times that came while it was paused are not run.
    pub fn resume(&mut self, spec: &Spec, now: i64) -> Vec<Action> {
        self.tick(spec, now);
        self.paused = false;
        self.tick(spec, now)
    }

    /// Starts one now, under the overlap policy: its nominal time is `now` (whole seconds).
    pub fn trigger(&mut self, spec: &Spec, now: i64) -> Vec<Action> {
        let mut out = self.tick(spec, now);
        self.offer(spec, now - now.rem_euclid(1000), now, &mut out);
        out
    }

    /// Asks for one start per nominal time in `[from, to)`, under the overlap policy; how many.
    pub fn backfill(&mut self, spec: &Spec, from: i64, to: i64) -> Result<usize, String> {
        if to <= from {
            return Err("to must be after from".into());
        }
        let mut times = Vec::new();
        let mut t = from - 1;
        while let Some(n) = spec.next_after(t).filter(|n| *n < to) {
            if times.len() == MAX_BACKFILL {
                return Err(format!(
                    "more than {MAX_BACKFILL} times fall in it; backfill a shorter span at a time"
                ));
            }
            times.push(n);
            t = n;
        }
        let n = times.len();
        self.backfill.extend(times);
        Ok(n)
    }

    /// Counts, without walking them one by one, the times missed for longer than the catch-up
    /// window (a schedule of every second, down for a month, has millions).
    fn pass_missed(&mut self, spec: &Spec, now: i64) {
        let horizon = now - spec.catchup_window;
        let Some(first) = spec.next_after(self.last) else {
            return;
        };
        if first >= horizon {
            return;
        }
        let missed = match &spec.when {
            crate::spec::When::Every(p) => {
                let last = (horizon - 1).div_euclid(*p) * p;
                let last = match spec.end_at {
                    Some(e) if last >= e => (e - 1).div_euclid(*p) * p,
                    _ => last,
                };
                let n = ((last - first) / p + 1).max(0) as u64;
                self.last = self.last.max(last);
                n
            }
            crate::spec::When::Cron(_) => {
                let mut n = 0;
                while let Some(t) = spec.next_after(self.last).filter(|t| *t < horizon) {
                    self.last = t;
                    n += 1;
                }
                n
            }
        };
        match self.paused {
            true => self.skipped.paused += missed,
            false => self.skipped.catchup += missed,
        }
    }

    /// Offers nominal time `nominal` under the overlap policy; whether it started.
    fn offer(&mut self, spec: &Spec, nominal: i64, now: i64, out: &mut Vec<Action>) -> bool {
        let instance = spec.instance_id(nominal);
        if self.running.contains(&instance) || self.recent.iter().any(|r| r.instance == instance) {
            // Started already: the id is the nominal time.
            return false;
        }
        if self.running.is_empty() || spec.overlap == Overlap::AllowAll {
            self.start(nominal, instance, now, out);
            return true;
        }
        match spec.overlap {
            Overlap::Skip => self.skipped.overlap += 1,
            Overlap::BufferOne if self.buffered.is_empty() => self.buffered.push_back(nominal),
            Overlap::BufferOne => self.skipped.overlap += 1,
            Overlap::BufferAll => self.buffered.push_back(nominal),
            Overlap::CancelOther => {
                out.extend(self.running.iter().map(|i| Action::Cancel { instance: i.clone() }));
                self.start(nominal, instance, now, out);
                return true;
            }
            // Started above.
            Overlap::AllowAll => {}
        }
        false
    }

    /// Starts the first kept time once nothing runs; whether it did.
    fn start_kept(&mut self, spec: &Spec, now: i64, out: &mut Vec<Action>) -> bool {
        while self.running.is_empty() {
            let Some(n) = self.buffered.pop_front() else {
                return false;
            };
            let instance = spec.instance_id(n);
            if !self.recent.iter().any(|r| r.instance == instance) {
                self.start(n, instance, now, out);
                return true;
            }
        }
        false
    }

    fn start(&mut self, nominal: i64, instance: String, now: i64, out: &mut Vec<Action>) {
        let late = (now - nominal).max(0);
        self.running.insert(instance.clone());
        self.runs += 1;
        self.recent.push_back(Run {
            nominal,
            instance: instance.clone(),
            late,
            outcome: None,
        });
        while self.recent.len() > RECENT {
            self.recent.pop_front();
        }
        out.push(Action::Start {
            nominal,
            instance,
            late,
        });
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn skipped_since_counts_only_what_is_new() {
        let was = Skipped {
            overlap: 2,
            catchup: 0,
            paused: 1,
        };
        let is = Skipped {
            overlap: 5,
            catchup: 0,
            paused: 1,
        };
        assert_eq!(is.since(&was), vec![("overlap", 3)]);
        assert_eq!(is.since(&Skipped::default()), vec![("overlap", 5), ("paused", 1)]);
        assert!(was.since(&is).is_empty());
    }

    use super::*;
    use crate::spec::{parse_time, rfc3339};
    use serde_json::json;

    fn spec(extra: serde_json::Value) -> Spec {
        let mut v = json!({"id": "s", "definition": "d", "every": "PT1M"});
        for (k, x) in extra.as_object().expect("an object") {
            v[k] = x.clone();
        }
        Spec::from_json(&v).expect("valid")
    }

    fn at(text: &str) -> i64 {
        parse_time(text).expect("a time")
    }

    /// Ticks at `now` until nothing more happens, as a host's loop does.
    fn settle(st: &mut State, s: &Spec, now: i64) -> Vec<Action> {
        let mut all = Vec::new();
        loop {
            let a = st.tick(s, now);
            if a.is_empty() {
                return all;
            }
            all.extend(a);
        }
    }

    fn started(actions: &[Action]) -> Vec<String> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Start { nominal, .. } => Some(rfc3339(*nominal)[11..19].to_string()),
                Action::Cancel { .. } => None,
            })
            .collect()
    }

    fn cancelled(actions: &[Action]) -> Vec<String> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Cancel { instance } => Some(instance.clone()),
                Action::Start { .. } => None,
            })
            .collect()
    }

    #[test]
    fn each_time_starts_once_with_its_nominal_id_and_lateness() {
        let s = spec(json!({}));
        let mut st = State::new(&s, at("2026-11-28T10:00:30Z"));
        assert_eq!(st.wake_at(&s, 0), Some(at("2026-11-28T10:01:00Z")));
        assert!(st.tick(&s, at("2026-11-28T10:00:59Z")).is_empty());
        let a = st.tick(&s, at("2026-11-28T10:01:00.250Z"));
        assert_eq!(
            a,
            [Action::Start {
                nominal: at("2026-11-28T10:01:00Z"),
                instance: "s@2026-11-28T10:01:00Z".into(),
                late: 250
            }]
        );
        // The same time again (a repeated tick) starts nothing.
        assert!(st.tick(&s, at("2026-11-28T10:01:00.500Z")).is_empty());
        st.ended("s@2026-11-28T10:01:00Z", "completed");
        assert_eq!(started(&st.tick(&s, at("2026-11-28T10:02:00Z"))), ["10:02:00"]);
        assert_eq!(st.recent[0].outcome.as_deref(), Some("completed"));
        assert_eq!(st.runs, 2);
    }

    #[test]
    fn skip_passes_over_a_time_while_the_previous_runs() {
        let s = spec(json!({}));
        let mut st = State::new(&s, at("2026-11-28T10:00:00Z"));
        assert_eq!(started(&st.tick(&s, at("2026-11-28T10:01:00Z"))), ["10:01:00"]);
        assert!(st.tick(&s, at("2026-11-28T10:02:00Z")).is_empty());
        assert_eq!(st.skipped.overlap, 1);
        st.ended("s@2026-11-28T10:01:00Z", "completed");
        // Nothing kept: the next time starts at its own time.
        assert!(st.tick(&s, at("2026-11-28T10:02:30Z")).is_empty());
        assert_eq!(started(&st.tick(&s, at("2026-11-28T10:03:00Z"))), ["10:03:00"]);
    }

    #[test]
    fn buffer_one_keeps_one_and_buffer_all_keeps_every_time() {
        let s = spec(json!({"overlap": "bufferOne"}));
        let mut st = State::new(&s, at("2026-11-28T10:00:00Z"));
        st.tick(&s, at("2026-11-28T10:01:00Z"));
        st.tick(&s, at("2026-11-28T10:02:00Z"));
        st.tick(&s, at("2026-11-28T10:03:00Z"));
        assert_eq!((st.buffered.len(), st.skipped.overlap), (1, 1));
        st.ended("s@2026-11-28T10:01:00Z", "failed");
        assert_eq!(
            st.wake_at(&s, at("2026-11-28T10:03:10Z")),
            Some(at("2026-11-28T10:03:10Z"))
        );
        assert_eq!(started(&st.tick(&s, at("2026-11-28T10:03:10Z"))), ["10:02:00"]);

        let s = spec(json!({"overlap": "bufferAll"}));
        let mut st = State::new(&s, at("2026-11-28T10:00:00Z"));
        st.tick(&s, at("2026-11-28T10:01:00Z"));
        st.tick(&s, at("2026-11-28T10:03:00Z"));
        assert_eq!(st.buffered.len(), 2);
        st.ended("s@2026-11-28T10:01:00Z", "completed");
        assert_eq!(started(&st.tick(&s, at("2026-11-28T10:03:05Z"))), ["10:02:00"]);
        st.ended("s@2026-11-28T10:02:00Z", "completed");
        assert_eq!(started(&st.tick(&s, at("2026-11-28T10:03:06Z"))), ["10:03:00"]);
        assert_eq!(st.skipped.overlap, 0);
    }

    #[test]
    fn cancel_other_cancels_the_running_one_and_allow_all_starts_anyway() {
        let s = spec(json!({"overlap": "cancelOther"}));
        let mut st = State::new(&s, at("2026-11-28T10:00:00Z"));
        st.tick(&s, at("2026-11-28T10:01:00Z"));
        let a = st.tick(&s, at("2026-11-28T10:02:00Z"));
        assert_eq!(cancelled(&a), ["s@2026-11-28T10:01:00Z"]);
        assert_eq!(started(&a), ["10:02:00"]);

        let s = spec(json!({"overlap": "allowAll"}));
        let mut st = State::new(&s, at("2026-11-28T10:00:00Z"));
        st.tick(&s, at("2026-11-28T10:01:00Z"));
        assert_eq!(started(&st.tick(&s, at("2026-11-28T10:02:00Z"))), ["10:02:00"]);
        assert_eq!(st.running.len(), 2);
    }

    #[test]
    fn missed_times_within_the_window_catch_up_in_order_and_older_ones_are_counted() {
        let s = spec(json!({"catchupWindow": "PT3M", "overlap": "allowAll"}));
        let mut st = State::new(&s, at("2026-11-28T10:00:00Z"));
        // Down from 10:00 to 10:10: 10:07 to 10:10 are within three minutes, the six before are not.
        // One start a tick: the host ticks again once it is decided.
        assert_eq!(started(&st.tick(&s, at("2026-11-28T10:10:00Z"))), ["10:07:00"]);
        assert_eq!(
            st.wake_at(&s, at("2026-11-28T10:10:00Z")),
            Some(at("2026-11-28T10:08:00Z"))
        );
        assert_eq!(
            started(&settle(&mut st, &s, at("2026-11-28T10:10:00Z"))),
            ["10:08:00", "10:09:00", "10:10:00"]
        );
        assert_eq!(st.skipped.catchup, 6);
        // A second-by-second schedule down for thirty days counts its misses without walking them.
        let s = spec(json!({"every": "PT1S"}));
        let mut st = State::new(&s, at("2026-11-01T00:00:00Z"));
        let a = settle(&mut st, &s, at("2026-12-01T00:00:00Z"));
        assert_eq!(
            started(&a),
            ["23:59:00"],
            "the first within the minute; the others overlap it"
        );
        // 00:00:01 on the 1st to 23:58:59 on the 30th: more than a minute late.
        assert_eq!(st.skipped.catchup, 30 * 86_400 - 61);
        assert_eq!(st.skipped.overlap, 60);
    }

    #[test]
    fn times_while_paused_are_not_run_and_end_at_ends_it() {
        let s = spec(json!({"endAt": "2026-11-28T10:05:00Z"}));
        let mut st = State::new(&s, at("2026-11-28T10:00:00Z"));
        st.pause(&s, at("2026-11-28T10:00:10Z"));
        assert!(st.tick(&s, at("2026-11-28T10:02:00Z")).is_empty());
        assert!(st.resume(&s, at("2026-11-28T10:02:30Z")).is_empty());
        assert_eq!(st.skipped.paused, 2);
        assert_eq!(started(&st.tick(&s, at("2026-11-28T10:03:00Z"))), ["10:03:00"]);
        st.ended("s@2026-11-28T10:03:00Z", "completed");
        assert_eq!(started(&st.tick(&s, at("2026-11-28T10:04:00Z"))), ["10:04:00"]);
        st.ended("s@2026-11-28T10:04:00Z", "completed");
        assert!(
            st.tick(&s, at("2026-11-28T11:00:00Z")).is_empty(),
            "10:05 is endAt: no more"
        );
        assert_eq!(st.wake_at(&s, at("2026-11-28T11:00:00Z")), None);
    }

    #[test]
    fn trigger_and_backfill_start_under_the_overlap_policy() {
        let s = spec(json!({"overlap": "bufferAll"}));
        let mut st = State::new(&s, at("2026-11-28T10:00:00Z"));
        let a = st.trigger(&s, at("2026-11-28T10:00:20.700Z"));
        assert_eq!(started(&a), ["10:00:20"]);
        assert_eq!(
            st.running.iter().next().map(String::as_str),
            Some("s@2026-11-28T10:00:20Z")
        );
        assert_eq!(
            st.backfill(&s, at("2026-11-27T09:00:00Z"), at("2026-11-27T09:03:00Z")),
            Ok(3)
        );
        assert!(
            st.tick(&s, at("2026-11-28T10:00:30Z")).is_empty(),
            "kept behind the running one"
        );
        st.ended("s@2026-11-28T10:00:20Z", "completed");
        assert_eq!(started(&st.tick(&s, at("2026-11-28T10:00:31Z"))), ["09:00:00"]);
        assert!(st
            .backfill(&s, at("2026-11-27T09:00:00Z"), at("2026-11-27T09:00:00Z"))
            .is_err());
        assert!(st
            .backfill(&s, 0, at("2026-11-27T09:00:00Z"))
            .unwrap_err()
            .contains("more than 10000"));
    }

    #[test]
    fn the_state_reads_back_from_json() {
        let s = spec(json!({"overlap": "bufferOne"}));
        let mut st = State::new(&s, at("2026-11-28T10:00:00Z"));
        st.tick(&s, at("2026-11-28T10:01:00Z"));
        st.tick(&s, at("2026-11-28T10:02:00Z"));
        let text = serde_json::to_string(&st).expect("serializes");
        let back: State = serde_json::from_str(&text).expect("reads back");
        assert_eq!(back, st);
    }
}
