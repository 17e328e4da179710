//! Task tokens: how a worker names the task it answers.
//!
//! A token is the base64url (no padding) of `<instance id>\n<operation id>`: deterministic, so a
//! task handed out again after a restart has the same token, and self-locating, so the server finds
//! the instance and the operation from the token alone. It is opaque to workers and not a secret.
//! The engine gives it to ASL definitions as `$$.Task.Token`; hosts hand it out with worker tasks.

/// The token of task `op` of `instance`.
pub fn token(instance: &str, op: &str) -> String {
    base64url(format!("{instance}\n{op}").as_bytes())
}

/// The instance and operation a token names, if it is a token at all.
pub fn decode_token(token: &str) -> Option<(String, String)> {
    let text = String::from_utf8(unbase64url(token)?).ok()?;
    // Operation ids never hold a newline; instance ids are split off at the last one.
    let (instance, op) = text.rsplit_once('\n')?;
    (!instance.is_empty() && !op.is_empty()).then(|| (instance.to_string(), op.to_string()))
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fn base64url(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (*b as u32) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

fn unbase64url(text: &str) -> Option<Vec<u8>> {
    let digits: Vec<u32> = text
        .bytes()
        .map(|c| ALPHABET.iter().position(|a| *a == c).map(|p| p as u32))
        .collect::<Option<_>>()?;
    if digits.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, d)| n | d << (18 - 6 * i));
        for i in 0..chunk.len() - 1 {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    // Canonical form only: the bits a short last chunk leaves over must be zero.
    (base64url(&out) == text).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_bad_tokens_are_refused() {
        for (instance, op) in [
            ("order-1", "1.enter"),
            ("parent/1.enter/0", "2.t0.1/3#2"),
            ("a\nb", "timeout/0#4"),
            ("é ü 🦀", "1.exit"),
        ] {
            let t = token(instance, op);
            assert!(
                t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
                "{t}"
            );
            assert_eq!(decode_token(&t), Some((instance.to_string(), op.to_string())));
        }
        assert_eq!(base64url(b"\xfb\xff"), "-_8");
        assert_eq!(base64url(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64url(b"fooba"), "Zm9vYmE");
        for bad in ["", "!!", "Zm9vYmFy", "Zm9vYmF", "Zm9vYmFz=", "Zg==", "Zh", "A"] {
            assert_eq!(decode_token(bad), None, "{bad}");
        }
    }
}
