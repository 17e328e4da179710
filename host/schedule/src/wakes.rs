//! When each of a host's schedules next has something to do.

use std::collections::{BTreeSet, HashMap};

/// Each schedule's next wake (ms since the epoch), ordered by time, and each schedule's entry found
/// without a scan (ten thousand schedules firing each minute each change theirs).
#[derive(Debug, Default, Clone)]
pub struct Wakes {
    by_time: BTreeSet<(i64, String)>,
    of: HashMap<String, i64>,
}

impl Wakes {
    /// The earliest wake: its time and schedule.
    pub fn first(&self) -> Option<(i64, &str)> {
        self.by_time.first().map(|(t, id)| (*t, id.as_str()))
    }

    /// Schedule `id` wakes at `at`, or not at all (`None`), instead of when it woke before.
    pub fn set(&mut self, id: &str, at: Option<i64>) {
        if let Some(t) = self.of.remove(id) {
            self.by_time.remove(&(t, id.to_string()));
        }
        if let Some(t) = at {
            self.by_time.insert((t, id.to_string()));
            self.of.insert(id.to_string(), t);
        }
    }

    /// At most `max` of the schedules due at `now`, earliest first (they stay until [`Wakes::set`]).
    pub fn due(&self, now: i64, max: usize) -> Vec<String> {
        self.by_time
            .iter()
            .take_while(|(t, _)| *t <= now)
            .take(max)
            .map(|(_, id)| id.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_has_one_wake_found_by_time() {
        let mut w = Wakes::default();
        w.set("a", Some(30));
        w.set("b", Some(10));
        w.set("c", Some(20));
        w.set("a", Some(5));
        assert_eq!(w.first(), Some((5, "a")));
        assert_eq!(w.due(20, 10), ["a", "b", "c"]);
        assert_eq!(w.due(20, 2), ["a", "b"]);
        w.set("a", None);
        assert_eq!(w.due(100, 10), ["b", "c"]);
        w.set("b", None);
        w.set("c", None);
        assert_eq!(w.first(), None);
    }
}
