//! The newest instances first, through [`Backend::list`], which lists oldest first after a cursor.
//!
//! The inspector shows the newest instances; the backends keep a cursor (`seq`) that grows with
//! each new instance and list after it. So the newest matching instance is found by probing
//! (`list(after = a, limit = 1)`, doubling `a`, then halving the gap: about 2·log2(N) probes of
//! one row), and a page is read in a window below it that widens until it holds the page.

use sm4c_host::service::{Backend, HostError, Summary};
use std::sync::Arc;

/// Filters `GET /instances` has.
#[derive(Clone, Copy, Default)]
pub struct Filter<'a> {
    /// Status.
    pub status: Option<&'a str>,
    /// Definition id.
    pub definition: Option<&'a str>,
}

async fn probe(h: &Arc<dyn Backend>, f: Filter<'_>, after: i64) -> Result<Option<i64>, HostError> {
    Ok(h.list(f.status, f.definition, after, 1).await?.first().map(|r| r.seq))
}

/// The cursor just above the newest instance that matches `f`; `None` when none does.
pub async fn top(h: &Arc<dyn Backend>, f: Filter<'_>) -> Result<Option<i64>, HostError> {
    let Some(mut lo) = probe(h, f, 0).await? else {
        return Ok(None);
    };
    // `lo` matches; after the loop no instance above `hi` does.
    let mut step = 1i64;
    let mut hi = loop {
        match probe(h, f, lo.saturating_add(step)).await? {
            Some(s) => {
                lo = s;
                step = step.saturating_mul(2);
            }
            None => break lo.saturating_add(step),
        }
    };
    while hi > lo + 1 {
        let mid = lo + (hi - lo) / 2;
        match probe(h, f, mid).await? {
            Some(s) => lo = s,
            None => hi = mid,
        }
    }
    if let Some(s) = probe(h, f, lo).await? {
        lo = s;
    }
    Ok(Some(lo + 1))
}

/// Up to `limit` instances matching `f` below cursor `before`, newest first, and the cursor of the
/// next (older) page when there may be one.
pub async fn page(
    h: &Arc<dyn Backend>,
    f: Filter<'_>,
    before: i64,
    limit: usize,
) -> Result<(Vec<Summary>, Option<i64>), HostError> {
    let mut width = limit.max(1) as i64;
    loop {
        let start = before.saturating_sub(1).saturating_sub(width).max(0);
        let want = (before - start).clamp(1, 1_000_000) as usize;
        let mut rows: Vec<Summary> = h
            .list(f.status, f.definition, start, want)
            .await?
            .into_iter()
            .filter(|r| r.seq < before)
            .collect();
        if rows.len() >= limit || start == 0 {
            let more = rows.len() > limit || start > 0;
            rows.reverse();
            rows.truncate(limit);
            let next = more.then(|| rows.last().map(|r| r.seq)).flatten();
            return Ok((rows, next));
        }
        width = width.saturating_mul(4);
    }
}
