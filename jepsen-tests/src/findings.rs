//! The text of a checker's named checks (`check.txt`), shared by the checkers that report
//! several named checks (election, lifecycle): a title line with the verdict, then per check
//! `ok` or `INVALID`, its summary lines and at most `shown_max` of its anomalies.

use std::fmt::{Display, Write as _};

/// One named check as the report shows it.
pub struct CheckText<'a, A: Display> {
    pub name: &'a str,
    pub summary: &'a [String],
    pub anomalies: &'a [A],
}

/// The report: `title` (e.g. `"election checker: Valid"`), then each check, its name after
/// `name_prefix` (`""` or `"check "`).
pub fn describe_checks<'a, A: Display + 'a>(
    title: &str,
    name_prefix: &str,
    checks: impl IntoIterator<Item = CheckText<'a, A>>,
    shown_max: usize,
) -> String {
    let mut text = String::new();
    let _ = writeln!(text, "{title}");
    for check in checks {
        let verdict = match check.anomalies.is_empty() {
            true => "ok",
            false => "INVALID",
        };
        let _ = writeln!(text, "  {name_prefix}{}: {verdict}", check.name);
        for line in check.summary {
            let _ = writeln!(text, "    {line}");
        }
        for anomaly in check.anomalies.iter().take(shown_max) {
            let _ = writeln!(text, "    {anomaly}");
        }
        if check.anomalies.len() > shown_max {
            let _ = writeln!(
                text,
                "    ... and {} more",
                check.anomalies.len() - shown_max
            );
        }
    }
    text
}
