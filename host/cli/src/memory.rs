//! Memory: how the allocators are set up, and giving memory back after a burst.
//!
//! A burst of work (100,000 starts, a restore) makes the allocators take pages that they keep once it
//! is over. mimalloc (the binary's Rust allocations) keeps freed pages for a while and per thread,
//! and on a system whose transparent huge pages are on (`madvise` or `always`) it backs its arenas
//! with 2 MiB pages, which one live object keeps resident. glibc's malloc, which SQLite and
//! librdkafka call, keeps the free room of each arena until asked.
//!
//! Measured on one Kafka worker (`bench/kafka/share.py`, 100,000 waiting instances, 10,000 of them
//! cached, 28 November 2026): 217 MB resident at rest as the allocators left it, 138 MB with
//! [`tune`] and [`spawn`], at the same rate of starts and correlated events.
//!
//! [`tune`] sets the allocators up: no transparent huge pages for this process, mimalloc's freed
//! pages purged at once and no full pages retained per size class, and two glibc arenas at most.
//! A `MIMALLOC_*` or `MALLOC_ARENA_MAX` variable the user sets wins.
//! [`spawn`] starts a thread that asks both allocators to return what is free, while the process
//! is quiet.

use std::time::Duration;

/// mimalloc's option numbers (`mi_option_t` in the `include/mimalloc.h` of the mimalloc 3 that
/// libmimalloc-sys builds; its Rust bindings name only the older ones). A test checks them against
/// the defaults of its `src/options.c`.
const PURGE_DELAY: i32 = 15;
const PAGE_FULL_RETAIN: i32 = 36;

/// Sets the allocators up for a long-running process; called first thing in `main`.
#[expect(unsafe_code, reason = "mimalloc's options, mallopt and prctl are C functions")]
pub fn tune() {
    let unset = |name: &str| std::env::var_os(name).is_none();
    if unset("MIMALLOC_PURGE_DELAY") && unset("MIMALLOC_RESET_DELAY") {
        // SAFETY: sets an option; takes no pointers.
        unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, 0) };
    }
    if unset("MIMALLOC_PAGE_FULL_RETAIN") {
        // SAFETY: as above.
        unsafe { libmimalloc_sys::mi_option_set(PAGE_FULL_RETAIN, 0) };
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if unset("MALLOC_ARENA_MAX") {
        // glibc gives each thread that allocates while the others do an arena of its own, up to
        // 8 per core, and each keeps its free room apart: SQLite's and librdkafka's threads spread
        // a burst's allocations over many. Two arenas held 200,000 waiting instances' worker at
        // 109 MB against 166 (bench/kafka/README.md), with the same rates.
        // SAFETY: mallopt takes integers only.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, 2) };
    }
    #[cfg(target_os = "linux")]
    if unset("MIMALLOC_ALLOW_THP") {
        // What MIMALLOC_ALLOW_THP=0 does, which mimalloc can only read before `main`: the flag is
        // the process's, and huge pages are not used for what it touches from now on.
        // SAFETY: PR_SET_THP_DISABLE takes integers only.
        unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    }
}

/// Starts the trimming thread; it lives as long as the process.
pub fn spawn(every: Duration) {
    let spawned = std::thread::Builder::new().name("sm4c-trim".into()).spawn(move || {
        let mut last = resident_bytes();
        loop {
            std::thread::sleep(every);
            let now = resident_bytes();
            // Growing: a burst is under way; what it frees is taken again soon.
            if now > last.map(|l| l + (l >> 5)) {
                last = now;
                continue;
            }
            trim();
            last = resident_bytes();
        }
    });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the thread that gives memory back; memory stays as the allocators keep it");
    }
}

/// Asks both allocators to return their free pages now.
#[expect(
    unsafe_code,
    reason = "the allocators' own calls for returning memory are C functions"
)]
pub fn trim() {
    // SAFETY: mi_collect takes no pointers; `force` purges the pages freed on every thread that
    // mimalloc has not purged yet.
    unsafe { libmimalloc_sys::mi_collect(true) };
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointers and is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The process's resident memory (VmRSS), where the system tells it.
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// The resident memory is the process's: the tests that read it take turns.
    static RESIDENT: Mutex<()> = Mutex::new(());

    #[test]
    #[expect(unsafe_code, reason = "reads mimalloc's options and the THP flag back")]
    fn tuning_sets_the_options_it_names() {
        // SAFETY: reads options and a process flag; no pointers.
        let get = |o| unsafe { libmimalloc_sys::mi_option_get(o) };
        // The defaults in mimalloc's options.c: the numbers name the options meant.
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(
                get(PURGE_DELAY),
                1000,
                "mi_option_purge_delay is not number {PURGE_DELAY}"
            );
        }
        if std::env::var_os("MIMALLOC_PAGE_FULL_RETAIN").is_none() {
            assert_eq!(
                get(PAGE_FULL_RETAIN),
                2,
                "mi_option_page_full_retain is not number {PAGE_FULL_RETAIN}"
            );
        }
        tune();
        assert_eq!((get(PURGE_DELAY), get(PAGE_FULL_RETAIN)), (0, 0));
        #[cfg(target_os = "linux")]
        // SAFETY: as above.
        assert_eq!(unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) }, 1);
    }

    #[test]
    fn trimming_returns_freed_memory_to_the_system() {
        let _turn = RESIDENT.lock().unwrap_or_else(|p| p.into_inner());
        // Touch 64 MB in small blocks (as a burst of instances does), free them, then trim.
        let Some(before) = resident_bytes() else {
            panic!("/proc/self/status has no VmRSS on this system");
        };
        let mut blocks: Vec<Vec<u8>> = (0..64 * 1024).map(|i| vec![i as u8; 1024]).collect();
        let touched = resident_bytes().unwrap();
        assert!(touched > before + 32 * 1024 * 1024, "the blocks were not resident");
        blocks.clear();
        blocks.shrink_to_fit();
        // The test binary has the binary's allocator, mimalloc: this is its part of the trim.
        trim();
        let after = resident_bytes().unwrap();
        assert!(
            after < touched - 32 * 1024 * 1024,
            "64 MB freed, and the resident memory went from {touched} to {after} only"
        );
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn trimming_returns_what_sqlite_freed_to_glibc() {
        let _turn = RESIDENT.lock().unwrap_or_else(|p| p.into_inner());
        // SQLite allocates with glibc's malloc: an in-memory database of about 64 MB in 4 KB pages,
        // closed, leaves glibc's arena with free room it keeps.
        let before = resident_bytes().unwrap();
        let db = rusqlite::Connection::open_in_memory().unwrap();
        db.execute_batch("PRAGMA cache_size = -200000; CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB);")
            .unwrap();
        let mut ins = db.prepare("INSERT INTO t VALUES (?1, zeroblob(3000))").unwrap();
        for k in 0..20_000 {
            ins.execute([k]).unwrap();
        }
        drop(ins);
        // A second database, still open, allocated above the first: glibc cannot give the first's
        // room back by lowering the top of its heap when it is freed.
        let above = rusqlite::Connection::open_in_memory().unwrap();
        above
            .execute_batch("CREATE TABLE t (v BLOB); INSERT INTO t VALUES (zeroblob(100));")
            .unwrap();
        let touched = resident_bytes().unwrap();
        assert!(touched > before + 32 * 1024 * 1024, "the database was not resident");
        drop(db);
        trim();
        let after = resident_bytes().unwrap();
        drop(above);
        assert!(
            after < touched - 32 * 1024 * 1024,
            "a 64 MB database closed, and the resident memory went from {touched} to {after} only"
        );
    }
}
