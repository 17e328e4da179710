//! A schedule's specification, as `POST /schedules` and `sm4c schedule create` take it, read from
//! JSON with every error naming its field (a JSON pointer).

use crate::cron::Cron;
use chrono_tz::Tz;
use serde_json::{json, Map, Value};
use sm4c_runtime::kernel::hash::Fnv1a64;

/// What happens when a nominal time comes while this schedule's previous instance still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Overlap {
    /// The time is skipped (counted).
    #[default]
    Skip,
    /// One time is kept, started when the running instance ends; later ones are skipped.
    BufferOne,
    /// Every time is kept, started one after another as the running instances end.
    BufferAll,
    /// The running instance is cancelled and the new one started.
    CancelOther,
    /// The new one is started anyway.
    AllowAll,
}

impl Overlap {
    /// The name in a specification.
    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Skip => "skip",
            Overlap::BufferOne => "bufferOne",
            Overlap::BufferAll => "bufferAll",
            Overlap::CancelOther => "cancelOther",
            Overlap::AllowAll => "allowAll",
        }
    }

    fn parse(text: &str) -> Option<Overlap> {
        [
            Overlap::Skip,
            Overlap::BufferOne,
            Overlap::BufferAll,
            Overlap::CancelOther,
            Overlap::AllowAll,
        ]
        .into_iter()
        .find(|o| o.as_str() == text)
    }
}

/// When a schedule's times come.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum When {
    /// Every period (ms, whole seconds), aligned to the Unix epoch: `PT1H` runs on the hour.
    Every(i64),
    /// A cron expression on the wall clock of the schedule's time zone.
    Cron(Cron),
}

/// A schedule: what it starts and when.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    /// Its id: letters, digits, `.`, `_` and `-`; the instances it starts are `<id>@<nominal time>`.
    pub id: String,
    /// The definition its instances run.
    pub definition: String,
    /// The definition's version (the latest when `None`).
    pub version: Option<String>,
    /// Every instance's input.
    pub input: Value,
    /// When its times come.
    pub when: When,
    /// The time zone of a cron expression (UTC by default).
    pub timezone: Tz,
    /// Each start comes up to this long (ms) after its nominal time, by an amount fixed by the
    /// schedule's id and the nominal time (the same on every worker and after a restart).
    pub jitter: i64,
    /// What a time does while the previous instance runs.
    pub overlap: Overlap,
    /// How late (ms) a missed time may still be started (one minute by default).
    pub catchup_window: i64,
    /// No time before this (ms since the epoch).
    pub start_at: Option<i64>,
    /// No time at or after this.
    pub end_at: Option<i64>,
    /// Created paused.
    pub paused: bool,
    /// A note for people.
    pub note: Option<String>,
}

/// One thing wrong with a specification: where (a JSON pointer) and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecError {
    /// The field, as a JSON pointer (`/cron`).
    pub pointer: String,
    /// What is wrong with it.
    pub message: String,
}

impl std::fmt::Display for SpecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.pointer, self.message)
    }
}

/// The default catch-up window: one minute.
pub const CATCHUP_WINDOW: i64 = 60_000;

const FIELDS: [&str; 14] = [
    "id",
    "definition",
    "version",
    "input",
    "every",
    "cron",
    "timezone",
    "jitter",
    "overlap",
    "catchupWindow",
    "startAt",
    "endAt",
    "paused",
    "note",
];

impl Spec {
    /// Reads a specification; every error names its field.
    pub fn from_json(v: &Value) -> Result<Spec, Vec<SpecError>> {
        let mut errs = Vec::new();
        let mut err = |pointer: &str, message: String| {
            errs.push(SpecError {
                pointer: pointer.to_string(),
                message,
            })
        };
        let Some(o) = v.as_object() else {
            err("", "a schedule is a JSON object".into());
            return Err(errs);
        };
        for k in o.keys() {
            if !FIELDS.contains(&k.as_str()) {
                err(
                    &format!("/{}", escape(k)),
                    format!("unknown field; a schedule has {}", FIELDS.join(", ")),
                );
            }
        }
        let id = match o.get("id") {
            Some(Value::String(s)) if valid_id(s) => s.clone(),
            Some(Value::String(_)) => {
                err(
                    "/id",
                    "1 to 128 letters, digits, '.', '_' or '-' (the instances are named <id>@<nominal time>)".into(),
                );
                String::new()
            }
            Some(_) => {
                err("/id", "must be a string".into());
                String::new()
            }
            None => {
                err("/id", "required".into());
                String::new()
            }
        };
        let definition = match o.get("definition") {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            Some(_) => {
                err("/definition", "must be a definition's id (a string)".into());
                String::new()
            }
            None => {
                err("/definition", "required".into());
                String::new()
            }
        };
        let version = text(o, "version", &mut err);
        let note = text(o, "note", &mut err);
        let input = o.get("input").cloned().unwrap_or_else(|| json!({}));
        let when = match (o.get("every"), o.get("cron")) {
            (Some(_), Some(_)) => {
                err("/cron", "give either every or cron, not both".into());
                None
            }
            (None, None) => {
                err("/every", "required: either every (an ISO 8601 duration) or cron".into());
                None
            }
            (Some(e), None) => match e.as_str().map(sm4c_runtime::timespan::parse) {
                Some(Ok(ms)) if ms >= 1000 && ms % 1000 == 0 => Some(When::Every(ms as i64)),
                Some(Ok(_)) => {
                    err("/every", "must be whole seconds, at least PT1S".into());
                    None
                }
                Some(Err(e)) => {
                    err("/every", e);
                    None
                }
                None => {
                    err("/every", "must be an ISO 8601 duration such as PT5M".into());
                    None
                }
            },
            (None, Some(c)) => match c.as_str().map(Cron::parse) {
                Some(Ok(c)) => Some(When::Cron(c)),
                Some(Err(e)) => {
                    err("/cron", e);
                    None
                }
                None => {
                    err("/cron", "must be a cron expression (a string)".into());
                    None
                }
            },
        };
        let timezone = match o.get("timezone") {
            None => Tz::UTC,
            Some(Value::String(s)) => s.parse::<Tz>().unwrap_or_else(|_| {
                err(
                    "/timezone",
                    format!("{s:?} is not an IANA time zone (such as Europe/Paris or UTC)"),
                );
                Tz::UTC
            }),
            Some(_) => {
                err("/timezone", "must be an IANA time zone name (a string)".into());
                Tz::UTC
            }
        };
        let jitter = duration(o, "jitter", 0, true, &mut err);
        let catchup_window = duration(o, "catchupWindow", CATCHUP_WINDOW, false, &mut err);
        let overlap = match o.get("overlap") {
            None => Overlap::Skip,
            Some(v) => v.as_str().and_then(Overlap::parse).unwrap_or_else(|| {
                err(
                    "/overlap",
                    "must be one of skip, bufferOne, bufferAll, cancelOther, allowAll".into(),
                );
                Overlap::Skip
            }),
        };
        let start_at = time(o, "startAt", &mut err);
        let end_at = time(o, "endAt", &mut err);
        if let (Some(s), Some(e)) = (start_at, end_at) {
            if e <= s {
                err("/endAt", "must be after startAt".into());
            }
        }
        let paused = match o.get("paused") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                err("/paused", "must be true or false".into());
                false
            }
        };
        match (errs.is_empty(), when) {
            (true, Some(when)) => Ok(Spec {
                id,
                definition,
                version,
                input,
                when,
                timezone,
                jitter,
                overlap,
                catchup_window,
                start_at,
                end_at,
                paused,
                note,
            }),
            _ => Err(errs),
        }
    }

    /// The specification as JSON, as it was given (with its defaults filled in).
    pub fn to_json(&self) -> Value {
        let mut o = Map::new();
        o.insert("id".into(), json!(self.id));
        o.insert("definition".into(), json!(self.definition));
        if let Some(v) = &self.version {
            o.insert("version".into(), json!(v));
        }
        o.insert("input".into(), self.input.clone());
        match &self.when {
            When::Every(ms) => o.insert("every".into(), json!(sm4c_runtime::timespan::format(*ms as u64))),
            When::Cron(c) => o.insert("cron".into(), json!(c.text())),
        };
        o.insert("timezone".into(), json!(self.timezone.name()));
        o.insert(
            "jitter".into(),
            json!(sm4c_runtime::timespan::format(self.jitter as u64)),
        );
        o.insert("overlap".into(), json!(self.overlap.as_str()));
        o.insert(
            "catchupWindow".into(),
            json!(sm4c_runtime::timespan::format(self.catchup_window as u64)),
        );
        if let Some(t) = self.start_at {
            o.insert("startAt".into(), json!(rfc3339(t)));
        }
        if let Some(t) = self.end_at {
            o.insert("endAt".into(), json!(rfc3339(t)));
        }
        o.insert("paused".into(), json!(self.paused));
        if let Some(n) = &self.note {
            o.insert("note".into(), json!(n));
        }
        Value::Object(o)
    }

    /// The first nominal time strictly after `after` (ms since the epoch), within `startAt` and
    /// `endAt`; `None` when there is none.
    pub fn next_after(&self, after: i64) -> Option<i64> {
        let after = match self.start_at {
            // The first time may be startAt itself.
            Some(s) if after < s => s - 1,
            _ => after,
        };
        let next = match &self.when {
            When::Every(p) => (after.div_euclid(*p) + 1).checked_mul(*p)?,
            When::Cron(c) => c.next_after(after, self.timezone)?,
        };
        match self.end_at {
            Some(e) if next >= e => None,
            _ => Some(next),
        }
    }

    /// The next `count` nominal times after `after`.
    pub fn times_after(&self, after: i64, count: usize) -> Vec<i64> {
        let mut out = Vec::with_capacity(count);
        let mut t = after;
        while out.len() < count {
            match self.next_after(t) {
                Some(n) => {
                    out.push(n);
                    t = n;
                }
                None => break,
            }
        }
        out
    }

    /// When the start of nominal time `nominal` is due: the nominal time plus this schedule's
    /// jitter for it, a fixed amount below `jitter` drawn from the id and the time.
    pub fn due_at(&self, nominal: i64) -> i64 {
        if self.jitter <= 0 {
            return nominal;
        }
        nominal + (fnv1a(self.id.as_bytes(), nominal) % self.jitter as u64) as i64
    }

    /// The id of the instance this schedule starts for nominal time `nominal`:
    /// `<schedule id>@<nominal time in RFC 3339 UTC, seconds>`.
    pub fn instance_id(&self, nominal: i64) -> String {
        instance_id(&self.id, nominal)
    }
}

/// The id of the instance schedule `schedule` starts for nominal time `nominal`.
pub fn instance_id(schedule: &str, nominal: i64) -> String {
    format!("{schedule}@{}", rfc3339(nominal))
}

/// A time (ms since the epoch) in RFC 3339, UTC, whole seconds: `2026-11-28T02:00:00Z`.
pub fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|| ms.to_string())
}

/// Gives a specification sent to `PUT /schedules/{id}` the path's `id` when it has none; `Err`
/// (what is wrong with its `/id`) when it names another.
pub fn path_id(doc: &mut Value, id: &str) -> Result<(), String> {
    if let Some(o) = doc.as_object_mut() {
        match o.get("id") {
            None => drop(o.insert("id".into(), json!(id))),
            Some(given) if *given == json!(id) => {}
            Some(given) => return Err(format!("{given} disagrees with the path's schedule {id:?}")),
        }
    }
    Ok(())
}

/// Reads an RFC 3339 time as ms since the epoch.
pub fn parse_time(text: &str) -> Result<i64, String> {
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| t.timestamp_millis())
        .map_err(|e| format!("{text:?} is not an RFC 3339 time such as 2026-11-28T02:00:00Z: {e}"))
}

fn valid_id(s: &str) -> bool {
    !s.is_empty() && s.len() <= 128 && s.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
}

fn escape(k: &str) -> String {
    k.replace('~', "~0").replace('/', "~1")
}

fn text(o: &Map<String, Value>, key: &str, err: &mut impl FnMut(&str, String)) -> Option<String> {
    match o.get(key) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => {
            err(&format!("/{key}"), "must be a string".into());
            None
        }
    }
}

fn duration(o: &Map<String, Value>, key: &str, default: i64, zero: bool, err: &mut impl FnMut(&str, String)) -> i64 {
    match o.get(key) {
        None => default,
        Some(Value::String(s)) => match sm4c_runtime::timespan::parse(s) {
            Ok(0) if !zero => {
                err(&format!("/{key}"), "must be more than zero".into());
                default
            }
            Ok(ms) => ms as i64,
            Err(e) => {
                err(&format!("/{key}"), e);
                default
            }
        },
        Some(_) => {
            err(&format!("/{key}"), "must be an ISO 8601 duration such as PT1M".into());
            default
        }
    }
}

fn time(o: &Map<String, Value>, key: &str, err: &mut impl FnMut(&str, String)) -> Option<i64> {
    match o.get(key) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => parse_time(s).map_err(|e| err(&format!("/{key}"), e)).ok(),
        Some(_) => {
            err(&format!("/{key}"), "must be an RFC 3339 time (a string)".into());
            None
        }
    }
}

/// FNV-1a over the id and the time: a fixed, portable spread for the jitter.
fn fnv1a(bytes: &[u8], n: i64) -> u64 {
    Fnv1a64::new().update(bytes).update(&n.to_le_bytes()).finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> i64 {
        parse_time(text).expect("a time")
    }

    #[test]
    fn jitter_hash_is_pinned() {
        // Taken from the build before the hash moved to the kernel: a schedule's runs keep
        // their times across versions.
        assert_eq!(fnv1a(b"h", 0), 0xeea1_d8d9_5cc6_9cb7);
        assert_eq!(fnv1a(b"nightly", 1_767_225_600_000), 0xd5e2_172d_24a3_49c6);
        assert_eq!(fnv1a(b"h", -1), 0x0dda_0422_07ce_872f);
    }

    #[test]
    fn every_is_aligned_to_the_epoch_and_bounded_by_start_and_end() {
        let s = Spec::from_json(&json!({"id": "h", "definition": "d", "every": "PT1H",
            "startAt": "2026-11-28T03:00:00Z", "endAt": "2026-11-28T06:00:00Z"}))
        .expect("valid");
        let times: Vec<String> = s
            .times_after(at("2026-11-28T01:20:00Z"), 10)
            .into_iter()
            .map(rfc3339)
            .collect();
        assert_eq!(
            times,
            ["2026-11-28T03:00:00Z", "2026-11-28T04:00:00Z", "2026-11-28T05:00:00Z"]
        );
        let s = Spec::from_json(&json!({"id": "s", "definition": "d", "every": "PT1S"})).expect("valid");
        assert_eq!(
            s.next_after(at("2026-11-28T01:20:00Z") + 1),
            Some(at("2026-11-28T01:20:01Z"))
        );
        assert_eq!(s.instance_id(at("2026-11-28T02:00:00Z")), "s@2026-11-28T02:00:00Z");
    }

    #[test]
    fn jitter_is_fixed_by_the_id_and_the_time_and_stays_below_its_bound() {
        let s =
            Spec::from_json(&json!({"id": "j", "definition": "d", "every": "PT1M", "jitter": "PT30S"})).expect("valid");
        let mut seen = std::collections::BTreeSet::new();
        for k in 0..200 {
            let n = k * 60_000;
            let due = s.due_at(n);
            assert!((n..n + 30_000).contains(&due), "{due} for {n}");
            assert_eq!(due, s.due_at(n), "the same every time");
            seen.insert(due - n);
        }
        assert!(seen.len() > 100, "spread: {} distinct offsets", seen.len());
    }

    #[test]
    fn a_spec_reads_back_as_it_was_given() {
        let given = json!({"id": "nightly", "definition": "report", "version": "2", "input": {"a": 1},
            "cron": "0 2 * * *", "timezone": "Europe/Paris", "jitter": "PT1M", "overlap": "bufferOne",
            "catchupWindow": "PT10M", "startAt": "2026-11-28T00:00:00Z", "paused": true, "note": "n"});
        let s = Spec::from_json(&given).expect("valid");
        let back = Spec::from_json(&s.to_json()).expect("reads back");
        assert_eq!(back, s);
        assert_eq!(s.overlap, Overlap::BufferOne);
        assert_eq!(s.catchup_window, 600_000);
    }

    #[test]
    fn bad_specs_name_each_field() {
        let e = Spec::from_json(&json!({"id": "a b", "every": "PT0.5S", "timezone": "Mars/Olympus",
            "overlap": "sometimes", "catchupWindow": "PT0S", "startAt": "yesterday", "paused": "no",
            "colour": "red"}))
        .expect_err("invalid");
        let pointers: Vec<&str> = e.iter().map(|e| e.pointer.as_str()).collect();
        assert_eq!(
            pointers,
            [
                "/colour",
                "/id",
                "/definition",
                "/every",
                "/timezone",
                "/catchupWindow",
                "/overlap",
                "/startAt",
                "/paused"
            ],
            "{e:?}"
        );
        let e = Spec::from_json(&json!({"id": "x", "definition": "d", "every": "PT1M", "cron": "* * * * *"}))
            .expect_err("both");
        assert_eq!(e[0].to_string(), "/cron: give either every or cron, not both");
        let e = Spec::from_json(&json!({"id": "x", "definition": "d", "cron": "0 25 * * *"})).expect_err("bad cron");
        assert_eq!(e[0].to_string(), "/cron: hour: 25 is outside 0-23");
        let e = Spec::from_json(&json!({"id": "x", "definition": "d", "every": "PT1M",
            "startAt": "2026-11-28T00:00:00Z", "endAt": "2026-11-27T00:00:00Z"}))
        .expect_err("end before start");
        assert_eq!(e[0].to_string(), "/endAt: must be after startAt");
        let e = Spec::from_json(&json!([])).expect_err("not an object");
        assert_eq!(e[0].pointer, "");
    }
}
