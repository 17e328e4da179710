//! Crash and durability tests (being written).
