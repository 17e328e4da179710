//! Bounded work for the callers of the API: what a request may make the server compute (the
//! inspector's jq search, the instance page's replay of a journal, `POST /events/explain`) runs
//! off the async runtime's threads, a few at a time, within a time budget, and evaluates jq with
//! the server's configured expression limits.
//!
//! [`Work::run`] takes one of [`Work`]'s slots (as many as the machine has cores by default),
//! waiting for one at most the time budget, and runs the job on a blocking thread; the caller is
//! answered 503 `busy` when no slot freed up in time or the job took longer than its budget. The
//! job keeps its slot until it ends, so jobs whose callers gave up still count: the number of
//! threads busy with them stays bounded. A job is told its deadline and stops there where it can
//! (a search stops between instances); a jq evaluation is bounded by its fuel and sizes.

use crate::errors::{Busy, Internal};
use crate::ApiError;
use sm4c_runtime::Limits;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

/// The time budget of one job by default.
pub const BUDGET: Duration = Duration::from_secs(10);

/// The pool of bounded work, with the expression limits of the server.
#[derive(Debug, Clone)]
pub struct Work {
    /// The limits of each jq evaluation a request asks for (a search's condition).
    pub limits: Limits,
    /// Longest a job may take, and wait for a slot.
    pub budget: Duration,
    slots: Arc<Semaphore>,
    size: usize,
}

impl Default for Work {
    fn default() -> Work {
        Work::new(Limits::default(), BUDGET, 0)
    }
}

impl Work {
    /// A pool of `slots` jobs at once (0: as many as the machine has cores).
    pub fn new(limits: Limits, budget: Duration, slots: usize) -> Work {
        let size = match slots {
            0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
            n => n,
        };
        Work {
            limits,
            budget,
            slots: Arc::new(Semaphore::new(size)),
            size,
        }
    }

    /// Runs `job` (`what` it is, for the messages) on a blocking thread, given its deadline.
    pub async fn run<T: Send + 'static>(
        &self,
        what: &str,
        job: impl FnOnce(Instant) -> T + Send + 'static,
    ) -> Result<T, ApiError> {
        let budget = sm4c_runtime::timespan::format(self.budget.as_millis() as u64);
        let Ok(Ok(slot)) = tokio::time::timeout(self.budget, self.slots.clone().acquire_owned()).await else {
            return Err(Busy(format!(
                "the server is busy with {} searches, replays or explanations and none ended within {budget}; try again later",
                self.size
            ))
            .into());
        };
        let deadline = Instant::now() + self.budget;
        let handle = tokio::task::spawn_blocking(move || {
            let out = job(deadline);
            drop(slot);
            out
        });
        match tokio::time::timeout(self.budget, handle).await {
            Ok(Ok(out)) => Ok(out),
            Ok(Err(e)) => Err(Internal(format!("{what} failed: {e}")).into()),
            Err(_) => Err(Busy(format!("{what} took longer than its budget, {budget}")).into()),
        }
    }
}

/// The pool a request was given by [`crate::door::layer`], else the process's default one.
pub(crate) fn of(given: Option<axum::Extension<Work>>) -> Work {
    static DEFAULT: std::sync::OnceLock<Work> = std::sync::OnceLock::new();
    match given {
        Some(axum::Extension(w)) => w,
        None => DEFAULT.get_or_init(Work::default).clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_job_over_its_budget_is_answered_busy_and_keeps_its_slot() {
        let w = Work::new(Limits::default(), Duration::from_millis(200), 1);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let e = w
            .run("the test job", move |_| {
                // Runs until the test lets it go: longer than the budget.
                let _ = rx.recv();
            })
            .await
            .expect_err("over budget");
        assert_eq!(e.code(), "busy");
        assert!(e.message().contains("the test job took longer"), "{}", e.message());
        // Its slot is still taken: the next job cannot start.
        let e = w.run("another", |_| 1).await.expect_err("no slot");
        assert!(e.message().contains("busy with 1"), "{}", e.message());
        tx.send(()).expect("the job listens");
        let mut waited = 0;
        loop {
            match w.run("another", |_| 1).await {
                Ok(v) => break assert_eq!(v, 1),
                Err(_) if waited < 50 => waited += 1,
                Err(e) => panic!("the slot was never given back: {}", e.message()),
            }
        }
    }

    #[tokio::test]
    async fn a_job_runs_off_the_async_threads_and_gets_its_deadline() {
        let w = Work::new(Limits::default(), Duration::from_secs(5), 2);
        let before = Instant::now();
        let here = std::thread::current().id();
        let (deadline, there) = w
            .run("a job", |d| (d, std::thread::current().id()))
            .await
            .expect("runs");
        assert!(deadline > before && deadline <= Instant::now() + Duration::from_secs(5));
        assert_ne!(here, there, "the job ran on the runtime's thread");
    }
}
