//! JUnit XML, as CI systems read it: a `testsuite` per test file, a `testcase` per test, and a
//! `failure` element holding the differences of each failed test.

use super::TestResult;

/// Escapes text for XML content and attribute values; characters XML 1.0 does not allow become
/// `\u{..}` text.
fn xml(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' | '\t' => out.push(c),
            '\r' => out.push_str("&#13;"),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => {
                out.push_str(&format!("\\u{{{:x}}}", c as u32))
            }
            c => out.push(c),
        }
    }
    out
}

fn seconds(ms: u64) -> String {
    format!("{:.3}", ms as f64 / 1000.0)
}

/// The report of `results`, grouped by file in the order given.
pub fn report(results: &[TestResult]) -> String {
    let failed = results.iter().filter(|r| !r.passed).count();
    let total_ms: u64 = results.iter().map(|r| r.ms).sum();
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    out.push_str(&format!(
        "<testsuites name=\"sm4c test\" tests=\"{}\" failures=\"{failed}\" errors=\"0\" time=\"{}\">\n",
        results.len(),
        seconds(total_ms)
    ));
    let mut files: Vec<&str> = Vec::new();
    for r in results {
        if !files.contains(&r.file.as_str()) {
            files.push(&r.file);
        }
    }
    for file in files {
        let suite: Vec<&TestResult> = results.iter().filter(|r| r.file == file).collect();
        out.push_str(&format!(
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"0\" skipped=\"0\" time=\"{}\">\n",
            xml(file),
            suite.len(),
            suite.iter().filter(|r| !r.passed).count(),
            seconds(suite.iter().map(|r| r.ms).sum())
        ));
        for r in suite {
            out.push_str(&format!(
                "    <testcase name=\"{}\" classname=\"{}\" time=\"{}\"",
                xml(&r.name),
                xml(file),
                seconds(r.ms)
            ));
            if r.passed {
                out.push_str("/>\n");
                continue;
            }
            out.push_str(">\n");
            for f in &r.failures {
                out.push_str(&format!(
                    "      <failure message=\"{}\" type=\"expectation\">{}</failure>\n",
                    xml(&format!(
                        "{}: expected {}, actual {}",
                        f.path,
                        f.expected,
                        f.actual.as_ref().map_or("(missing)".into(), |v| v.to_string())
                    )),
                    xml(&super::expect::render(f))
                ));
            }
            if let Some(note) = &r.note {
                out.push_str(&format!("      <system-out>{}</system-out>\n", xml(note)));
            }
            out.push_str("    </testcase>\n");
        }
        out.push_str("  </testsuite>\n");
    }
    out.push_str("</testsuites>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped() {
        assert_eq!(xml("a<b & \"c\" 'd'>"), "a&lt;b &amp; &quot;c&quot; &apos;d&apos;&gt;");
        assert_eq!(xml("x\u{1b}y"), "x\\u{1b}y");
    }
}
