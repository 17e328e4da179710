//! FNV-1a: a fixed, portable hash for what must come out the same in every process and every
//! version (the standard library's hasher is neither): an instance's first random state, the
//! version of an ASL definition, the Kafka partition of an instance id, the id of the instance a
//! start event starts, a schedule's jitter. Changing an output here moves stored records, so the
//! tables below pin them.

const OFFSET_64: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME_64: u64 = 0x0000_0100_0000_01b3;
const OFFSET_32: u32 = 0x811c_9dc5;
const PRIME_32: u32 = 0x0100_0193;

/// The 64-bit FNV-1a hash of `bytes`.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    Fnv1a64::new().update(bytes).finish()
}

/// The 32-bit FNV-1a hash of `bytes`.
pub fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes
        .iter()
        .fold(OFFSET_32, |h, b| (h ^ u32::from(*b)).wrapping_mul(PRIME_32))
}

/// A 64-bit FNV-1a hash fed in parts: hashing `a` then `b` is hashing their concatenation.
///
/// ```
/// use sm4c_runtime::kernel::hash::{fnv1a64, Fnv1a64};
/// assert_eq!(Fnv1a64::new().update(b"order").update(b"-1").finish(), fnv1a64(b"order-1"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fnv1a64(u64);

impl Fnv1a64 {
    /// The hash of nothing yet.
    pub const fn new() -> Fnv1a64 {
        Fnv1a64(OFFSET_64)
    }

    /// The hash with `bytes` appended.
    #[must_use]
    pub fn update(self, bytes: &[u8]) -> Fnv1a64 {
        Fnv1a64(
            bytes
                .iter()
                .fold(self.0, |h, b| (h ^ u64::from(*b)).wrapping_mul(PRIME_64)),
        )
    }

    /// The hash of everything appended.
    pub const fn finish(self) -> u64 {
        self.0
    }
}

impl Default for Fnv1a64 {
    fn default() -> Fnv1a64 {
        Fnv1a64::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a64_table() {
        // The published FNV-1a test vectors ("", "a"), then ids as the engine seeds them.
        for (input, want) in [
            ("", 0xcbf2_9ce4_8422_2325),
            ("a", 0xaf63_dc4c_8601_ec8c),
            ("foobar", 0x8594_4171_f739_67e8),
            ("order-1", 0xdee4_809f_34be_e86d),
            ("helloworld-1", 0x4b73_a172_0337_8fcf),
        ] {
            assert_eq!(fnv1a64(input.as_bytes()), want, "{input:?}");
        }
    }

    #[test]
    fn fnv1a32_table() {
        for (input, want) in [
            ("", 0x811c_9dc5),
            ("a", 0xe40c_292c),
            ("foobar", 0xbf9c_f968),
            ("order-1", 0x2b7f_cd6d),
            ("helloworld-1", 0x57f0_fb8f),
        ] {
            assert_eq!(fnv1a32(input.as_bytes()), want, "{input:?}");
        }
    }

    #[test]
    fn parts_hash_as_their_concatenation() {
        for (a, b) in [("", ""), ("src", "\0e1"), ("h", "\0\0\0\0\0\0\0\0")] {
            let whole = format!("{a}{b}");
            assert_eq!(
                Fnv1a64::new().update(a.as_bytes()).update(b.as_bytes()).finish(),
                fnv1a64(whole.as_bytes())
            );
        }
        assert_eq!(Fnv1a64::default().finish(), fnv1a64(b""));
    }
}
