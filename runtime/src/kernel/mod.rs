//! The language-neutral kernel: what every language's engine shares and no language defines.
//!
//! The seed of the future `sm4c-kernel` crate (issue 36): nothing here knows jq or JSONata, and
//! [`random`] and [`hash`] import nothing else from this crate, so they can move out as they are.
//! It holds the deterministic random source ([`random`]); the stable hashes behind seeds,
//! partitions, start ids and versions ([`hash`]); and the types every engine and host speak
//! ([`types`]: inputs, effects, journal entries, status, errors), whose one remaining tie to a
//! language, the SM4C debugger's breakpoints, is named in that module's documentation.

pub mod hash;
pub mod output;
pub mod random;
pub mod types;

pub use random::Random;
