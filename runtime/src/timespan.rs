//! Timespans as definitions write them: ISO 8601 (`PT15M`), `hh:mm:ss` (`00:00:10`) and humantime (`15m`).

/// Parses a timespan into milliseconds.
///
/// Accepted forms:
/// - ISO 8601 durations: `PT15M`, `P1DT2H`, `PT0.5S`, `P2W` (years and months are refused: their length varies);
/// - .NET-style `[d.]hh:mm:ss[.fff]`: `00:00:10`, `1.02:00:00`, `00:00:00.250`;
/// - humantime: `15m`, `1h 30m`, `500ms`.
pub fn parse(text: &str) -> Result<u64, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err("empty timespan".into());
    }
    let parsed = if s.starts_with(['P', 'p']) {
        parse_iso(s)
    } else if s.contains(':') {
        parse_clock(s)
    } else {
        // humantime 2.4 panics ("overflow in Duration::new") when the seconds reach u64::MAX and
        // two fractions add up to exactly one second (`18446744073709551615s0.5s0.5s`, found by the
        // fuzz target timespan): a definition must not stop the process, so the panic is an error.
        std::panic::catch_unwind(|| humantime::parse_duration(s))
            .unwrap_or(Err(humantime::DurationError::NumberOverflow))
            .map_err(|e| e.to_string())
            .and_then(|d| to_ms(d.as_millis() as f64))
    };
    parsed.map_err(|why| {
        format!("invalid timespan {text:?}: {why} (use ISO 8601 like \"PT15M\", \"hh:mm:ss\" like \"00:15:00\", or \"15m\")")
    })
}

fn parse_iso(s: &str) -> Result<u64, String> {
    let mut ms: f64 = 0.0;
    let mut in_time = false;
    let mut num = String::new();
    let mut any = false;
    for c in s[1..].chars() {
        match c {
            'T' | 't' if num.is_empty() && !in_time => in_time = true,
            '0'..='9' | '.' | ',' => num.push(if c == ',' { '.' } else { c }),
            _ => {
                let value: f64 = num.parse().map_err(|_| format!("expected a number before '{c}'"))?;
                num.clear();
                let unit = match (c.to_ascii_uppercase(), in_time) {
                    ('W', false) => 604_800_000.0,
                    ('D', false) => 86_400_000.0,
                    ('H', true) => 3_600_000.0,
                    ('M', true) => 60_000.0,
                    ('S', true) => 1_000.0,
                    ('Y' | 'M', false) => return Err("years and months have no fixed length".into()),
                    _ => return Err(format!("unexpected '{c}'")),
                };
                ms += value * unit;
                any = true;
            }
        }
    }
    if !num.is_empty() {
        return Err("a number without a unit".into());
    }
    if !any {
        return Err("no duration components".into());
    }
    to_ms(ms)
}

fn parse_clock(s: &str) -> Result<u64, String> {
    let (days, rest) = match s.split_once('.') {
        Some((d, rest)) if rest.contains(':') && !d.contains(':') => {
            (d.parse::<u64>().map_err(|_| "bad day count")?, rest)
        }
        _ => (0, s),
    };
    let parts: Vec<&str> = rest.split(':').collect();
    if parts.len() != 3 {
        return Err("expected hh:mm:ss".into());
    }
    let h: f64 = parts[0].parse::<u64>().map_err(|_| "bad hours")? as f64;
    let m: u64 = parts[1].parse().map_err(|_| "bad minutes")?;
    if !parts[2].bytes().all(|b| b.is_ascii_digit() || b == b'.') || parts[2].ends_with('.') {
        return Err("bad seconds".into());
    }
    let sec: f64 = parts[2].parse().map_err(|_| "bad seconds")?;
    if m >= 60 || !(0.0..60.0).contains(&sec) {
        return Err("minutes and seconds must be below 60".into());
    }
    // In floating point: days and hours as large as u64 must not overflow; to_ms refuses them.
    to_ms(((days as f64 * 24.0 + h) * 3600.0 + m as f64 * 60.0) * 1000.0 + sec * 1000.0)
}

/// Every form has the same range, below 10^17 ms (about 3 million years), so that a timespan added
/// to an instance's clock (i64 ms) cannot overflow it.
fn to_ms(ms: f64) -> Result<u64, String> {
    if ms.is_finite() && (0.0..1e17).contains(&ms) {
        Ok(ms.round() as u64)
    } else {
        Err("out of range".into())
    }
}

/// Formats milliseconds as ISO 8601 (`PT1M30S`), for messages.
pub fn format(ms: u64) -> String {
    if ms == 0 {
        return "PT0S".into();
    }
    let mut out = String::from("PT");
    let (h, rem) = (ms / 3_600_000, ms % 3_600_000);
    let (m, rem) = (rem / 60_000, rem % 60_000);
    if h > 0 {
        out += &format!("{h}H");
    }
    if m > 0 {
        out += &format!("{m}M");
    }
    if rem > 0 {
        if rem % 1000 == 0 {
            out += &format!("{}S", rem / 1000);
        } else {
            out += &format!("{}S", rem as f64 / 1000.0);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms() {
        for (s, ms) in [
            ("PT15M", 900_000),
            ("P1DT2H", 93_600_000),
            ("PT0.5S", 500),
            ("pt1h30m", 5_400_000),
            ("P2W", 1_209_600_000),
            ("00:00:10", 10_000),
            ("1.02:00:00", 93_600_000),
            ("00:00:00.250", 250),
            ("15m", 900_000),
            ("1h 30m", 5_400_000),
            ("500ms", 500),
        ] {
            assert_eq!(parse(s), Ok(ms), "{s}");
        }
    }

    #[test]
    fn refused() {
        for s in [
            "",
            "soon",
            "PT",
            "P1M",
            "PT5",
            "00:61:00",
            "10",
            "1:2",
            "-PT1S",
            "00:00:1e1",
            "00:00:10.",
        ] {
            assert!(parse(s).is_err(), "{s} accepted");
        }
    }

    #[test]
    fn formats() {
        assert_eq!(format(900_000), "PT15M");
        assert_eq!(format(5_401_500), "PT1H30M1.5S");
        assert_eq!(format(0), "PT0S");
    }
}
