//! Schedules: start a definition every interval or on a cron expression, once per nominal time.
//!
//! - [`Spec`]: what `POST /schedules` takes, read from JSON with every error naming its field;
//!   [`Spec::next_after`] gives its nominal times (an `every` interval aligned to the Unix epoch, or
//!   a [`Cron`] expression on the wall clock of an IANA time zone, daylight-saving days included).
//! - [`State`]: what a schedule does as time passes: which times start (each as the instance
//!   `<schedule>@<nominal time>`, so a repeated start is the same start), which are kept or skipped
//!   under its [`Overlap`] policy, the catch-up of missed times, pause, trigger and backfill.
//! - [`view()`]: a schedule as `GET /schedules/{id}` shows it, the same in every host.
//!
//! This crate reads no clock and does no IO: a host keeps a schedule's [`Spec`] and [`State`]
//! durable and drives it with its time.

pub mod cron;
pub mod plan;
pub mod spec;
pub mod view;
pub mod wakes;

pub use cron::Cron;
pub use plan::{Action, Run, Skipped, State};
pub use spec::{instance_id, parse_time, path_id, rfc3339, Overlap, Spec, SpecError, When};
pub use view::{view, UPCOMING};
pub use wakes::Wakes;
