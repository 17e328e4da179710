//! The deterministic random source: splitmix64 over a state kept in the instance's snapshot.
//!
//! An engine never draws from the operating system: an instance's first state is the FNV-1a
//! hash of its id ([`Random::for_id`]), each draw advances it, and the snapshot stores it, so
//! replaying a journal draws the same numbers (retry jitter in SM4C; `States.MathRandom`,
//! `States.UUID`, `$random()`, `$uuid()` and retry jitter in ASL). The stored state is a bare
//! JSON number; changing what a state draws would change what stored instances do next, so the
//! tables below pin it.

use serde::{Deserialize, Serialize};

/// The splitmix64 increment (the golden ratio in 64 bits).
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// A deterministic random state. Stored as its bare state number (`"rng": 16061103592383113325`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Random(u64);

impl Random {
    /// The source at state `state` (as stored).
    pub const fn new(state: u64) -> Random {
        Random(state)
    }

    /// The first state of the instance `id`: the 64-bit FNV-1a hash of the id.
    pub fn for_id(id: &str) -> Random {
        Random(crate::kernel::hash::fnv1a64(id.as_bytes()))
    }

    /// The state, as stored.
    pub const fn state(self) -> u64 {
        self.0
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GAMMA);
        mix(self.0)
    }

    /// The next number in `[0, 1)`, uniform over 53-bit steps.
    pub fn next_unit(&mut self) -> f64 {
        unit(self.next_u64())
    }
}

/// The splitmix64 finaliser: mixes the bits of `z` (a bijection on `u64`).
pub const fn mix(z: u64) -> u64 {
    let z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One splitmix64 step from `seed` without keeping a state: the first draw of
/// `Random::new(seed)` (`States.MathRandom` with a seed argument).
pub const fn splitmix64(seed: u64) -> u64 {
    mix(seed.wrapping_add(GAMMA))
}

/// A number in `[0, 1)` from 64 random bits: the top 53 bits over 2⁵³.
pub fn unit(bits: u64) -> f64 {
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_table() {
        // splitmix64's published vector from state 0, then states the engines meet: small seeds,
        // the largest state (wrapping), and the first state of instance "order-1".
        for (state, draws, last) in [
            (
                0,
                [0xe220_a839_7b1d_cdaf, 0x6e78_9e6a_a1b9_65f4, 0x06c4_5d18_8009_454f],
                0xdaa6_6d2c_7ddf_743f,
            ),
            (
                1,
                [0x910a_2dec_8902_5cc1, 0xbeeb_8da1_658e_ec67, 0xf893_a2ee_fb32_555e],
                0xdaa6_6d2c_7ddf_7440,
            ),
            (
                42,
                [0xbdd7_3226_2feb_6e95, 0x28ef_e333_b266_f103, 0x4752_6757_130f_9f52],
                0xdaa6_6d2c_7ddf_7469,
            ),
            (
                u64::MAX,
                [0xe4d9_7177_1b65_2c20, 0xe99f_f867_dbf6_82c9, 0x382f_f84c_b272_81e9],
                0xdaa6_6d2c_7ddf_743e,
            ),
            (
                0xdee4_809f_34be_e86d,
                [0x4b1f_a4bb_6f60_e07b, 0x313b_2716_b1f7_535e, 0x2d30_6f41_15ff_a2a7],
                0xb98a_edcb_b29e_5cac,
            ),
        ] {
            let mut r = Random::new(state);
            assert_eq!(splitmix64(state), draws[0], "one step from {state:#x}");
            for (i, want) in draws.into_iter().enumerate() {
                assert_eq!(r.next_u64(), want, "draw {i} from {state:#x}");
            }
            assert_eq!(r.state(), last, "state after three draws from {state:#x}");
        }
    }

    #[test]
    fn units_table() {
        for (state, want) in [
            (0, 0.8833108082136426),
            (1, 0.5665615751722809),
            (42, 0.7415648787718233),
            (0xdee4_809f_34be_e86d, 0.2934515912633091),
        ] {
            assert_eq!(Random::new(state).next_unit(), want, "{state:#x}");
        }
        assert_eq!(unit(0), 0.0);
        assert_eq!(unit(u64::MAX), 1.0 - 1.0 / (1u64 << 53) as f64);
    }

    #[test]
    fn an_instance_starts_at_the_hash_of_its_id_and_is_stored_as_a_number() {
        assert_eq!(Random::for_id("order-1"), Random::new(0xdee4_809f_34be_e86d));
        let text = serde_json::to_string(&Random::for_id("order-1")).unwrap();
        assert_eq!(text, "16061103592383113325");
        assert_eq!(
            serde_json::from_str::<Random>(&text).unwrap(),
            Random::for_id("order-1")
        );
    }
}
