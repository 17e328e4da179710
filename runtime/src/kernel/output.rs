//! What one input produced and how it is recorded, the same for every language: the engine
//! [`Options`], the [`Output`] (journal entries and effects), and the one way an engine records an
//! effect, arms or cancels a timer, or adds a trace. Both engines' contexts (`engine::Cx`,
//! `asl::engine::Cx`) call these instead of each writing its own.
//!
//! Re-exported from `sm4c_runtime::engine` and the crate root. One field still belongs to a
//! language: `Output::noted`, the SM4C conditions already traced as not boolean in this input.

use crate::kernel::types::{Effect, Entry, Millis, Trace};
use std::collections::BTreeMap;

/// Engine settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Record inputs and effects as journal entries.
    pub journal: bool,
    /// Record readable [`Trace`] entries too.
    pub trace: bool,
    /// Transitions one input may cause before the instance fails as looping (default 10 million).
    pub max_transitions: u64,
    /// Events an instance keeps in its inbox; the oldest unmatched is dropped past this (default 10,000).
    pub max_inbox: usize,
    /// Record a [`Trace::Covered`] entry for every transition, error handler and action taken
    /// (ASL: every `Next`, Choice rule, `Default` and `Catch`), as `sm4c test` measures coverage
    /// with; off by default, and then nothing is recorded.
    pub coverage: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            journal: true,
            trace: false,
            max_transitions: 10_000_000,
            max_inbox: 10_000,
            coverage: false,
        }
    }
}

/// What one input produced.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Output {
    /// Entries to append to the journal, in order (empty when journaling is off).
    pub entries: Vec<Entry>,
    /// Effects for the host to perform, in order, after the entries are stored.
    pub effects: Vec<Effect>,
    /// Pointers of the conditions already traced as not boolean in this output (each is traced once
    /// per input, however often it is evaluated).
    pub(crate) noted: Vec<String>,
}

impl Output {
    /// Records effect `e`: a journal entry when `options.journal`, and an effect for the host.
    pub(crate) fn effect(&mut self, options: &Options, e: Effect) {
        if options.journal {
            self.entries.push(Entry::Effect(e.clone()));
        }
        self.effects.push(e);
    }

    /// Arms `timer` at `due` in `timers` and asks the host to fire it then.
    pub(crate) fn start_timer(
        &mut self,
        options: &Options,
        timers: &mut BTreeMap<String, Millis>,
        timer: &str,
        due: Millis,
    ) {
        timers.insert(timer.to_string(), due);
        self.effect(
            options,
            Effect::StartTimer {
                timer: timer.to_string(),
                due,
            },
        );
    }

    /// Disarms `timer` if `timers` holds it, and then only tells the host.
    pub(crate) fn cancel_timer(&mut self, options: &Options, timers: &mut BTreeMap<String, Millis>, timer: &str) {
        if timers.remove(timer).is_some() {
            self.effect(
                options,
                Effect::CancelTimer {
                    timer: timer.to_string(),
                },
            );
        }
    }

    /// Adds the trace `f` makes, only when `options.trace` (so an untraced run builds none).
    pub(crate) fn trace(&mut self, options: &Options, f: impl FnOnce() -> Trace) {
        if options.trace {
            self.entries.push(Entry::Trace(f()));
        }
    }

    /// Records that the part of the definition at JSON pointer `pointer` was taken, only when
    /// `options.coverage`.
    pub(crate) fn cover(&mut self, options: &Options, pointer: impl FnOnce() -> String) {
        if options.coverage {
            self.entries.push(Entry::Trace(Trace::Covered { pointer: pointer() }));
        }
    }
}
