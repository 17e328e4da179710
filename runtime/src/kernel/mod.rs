//! The language-neutral kernel: what every language's engine shares and no language defines.
//!
//! The seed of the future `sm4c-kernel` crate (issue 36): nothing here knows SM4C or the Amazon
//! States Language, jq or JSONata, and no module here imports another part of this crate, so it
//! can move out as it is. For now it holds the pieces each engine and host had written for
//! itself: the deterministic random source ([`random`]) and the stable hashes behind seeds,
//! partitions, start ids and versions ([`hash`]).

pub mod hash;
pub mod random;

pub use random::Random;
