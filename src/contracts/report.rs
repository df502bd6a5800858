//! The result of running one contract against one provider, and its
//! renderings: JSON (serde), a provider × check table for people, JUnit XML
//! for CI.

use serde::{Deserialize, Serialize};
use std::fmt::Write;

/// The four checks of a contract run, in the order they run per case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckKind {
    PromptRendering,
    Tokenizer,
    Schema,
    RoundTrip,
}

impl CheckKind {
    pub const ALL: [CheckKind; 4] = [
        CheckKind::PromptRendering,
        CheckKind::Tokenizer,
        CheckKind::Schema,
        CheckKind::RoundTrip,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CheckKind::PromptRendering => "prompt_rendering",
            CheckKind::Tokenizer => "tokenizer",
            CheckKind::Schema => "schema",
            CheckKind::RoundTrip => "round_trip",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckResult {
    pub case: String,
    pub check: CheckKind,
    pub passed: bool,
    /// Why it failed, or a note on what was checked when it passed.
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContractReport {
    pub contract: String,
    pub contract_digest: String,
    pub provider: String,
    /// True when every check of every case passed.
    pub passed: bool,
    pub checks: Vec<CheckResult>,
}

impl ContractReport {
    pub fn failures(&self) -> impl Iterator<Item = &CheckResult> {
        self.checks.iter().filter(|c| !c.passed)
    }

    /// A table with one row for this provider; see [`render_table`].
    pub fn to_table(&self) -> String {
        render_table(std::slice::from_ref(self))
    }

    /// One `<testsuite>` per report, one `<testcase>` per case and check.
    pub fn to_junit_xml(&self) -> String {
        reports_to_junit_xml(std::slice::from_ref(self))
    }
}

/// Providers × checks, grouped by contract: each cell says how many cases
/// passed that check; below each group, every failure with its reason.
pub fn render_table(reports: &[ContractReport]) -> String {
    let mut out = String::new();
    let mut contracts: Vec<(&str, &str)> = reports
        .iter()
        .map(|r| (r.contract.as_str(), r.contract_digest.as_str()))
        .collect();
    contracts.dedup();
    for (contract, digest) in contracts {
        let group: Vec<&ContractReport> = reports
            .iter()
            .filter(|r| r.contract == contract && r.contract_digest == digest)
            .collect();
        let _ = writeln!(out, "contract {contract} (digest {})", short(digest));
        let width = group
            .iter()
            .map(|r| r.provider.chars().count())
            .max()
            .unwrap_or(0)
            .max("provider".len());
        let mut header = format!("  {:<width$}", "provider");
        for check in CheckKind::ALL {
            let _ = write!(header, "  {:<16}", check.as_str());
        }
        header.push_str("  result");
        let _ = writeln!(out, "{header}");
        for report in &group {
            let mut row = format!("  {:<width$}", report.provider);
            for check in CheckKind::ALL {
                let of_kind: Vec<&CheckResult> =
                    report.checks.iter().filter(|c| c.check == check).collect();
                let passed = of_kind.iter().filter(|c| c.passed).count();
                let cell = if of_kind.is_empty() {
                    "-".to_string()
                } else {
                    format!(
                        "{passed}/{} {}",
                        of_kind.len(),
                        mark(passed == of_kind.len())
                    )
                };
                let _ = write!(row, "  {cell:<16}");
            }
            row.push_str(if report.passed { "  PASS" } else { "  FAIL" });
            let _ = writeln!(out, "{row}");
        }
        let failures: Vec<(&str, &CheckResult)> = group
            .iter()
            .flat_map(|r| r.failures().map(move |c| (r.provider.as_str(), c)))
            .collect();
        if !failures.is_empty() {
            let _ = writeln!(out, "  failures:");
            for (provider, check) in failures {
                let _ = writeln!(
                    out,
                    "    {provider} / {} / {}: {}",
                    check.case,
                    check.check.as_str(),
                    one_line(&check.message)
                );
            }
        }
    }
    out
}

fn mark(all_passed: bool) -> &'static str {
    if all_passed {
        "ok"
    } else {
        "FAIL"
    }
}

fn short(digest: &str) -> &str {
    digest.get(..12).unwrap_or(digest)
}

fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A JUnit document for several reports (one `<testsuite>` each).
pub fn reports_to_junit_xml(reports: &[ContractReport]) -> String {
    let tests: usize = reports.iter().map(|r| r.checks.len()).sum();
    let failures: usize = reports.iter().map(|r| r.failures().count()).sum();
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        out,
        "<testsuites name=\"onejob contracts\" tests=\"{tests}\" failures=\"{failures}\">"
    );
    for report in reports {
        let suite = format!("{}/{}", report.contract, report.provider);
        let classname = format!("contracts.{}.{}", report.contract, report.provider);
        let _ = writeln!(
            out,
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\">",
            xml_escape(&suite),
            report.checks.len(),
            report.failures().count()
        );
        let _ = writeln!(
            out,
            "    <properties><property name=\"contract_digest\" value=\"{}\"/></properties>",
            xml_escape(&report.contract_digest)
        );
        for check in &report.checks {
            let name = format!("{}::{}", check.case, check.check.as_str());
            let _ = write!(
                out,
                "    <testcase classname=\"{}\" name=\"{}\"",
                xml_escape(&classname),
                xml_escape(&name)
            );
            if check.passed {
                let _ = writeln!(out, "/>");
            } else {
                let _ = writeln!(
                    out,
                    ">\n      <failure message=\"{}\" type=\"{}\">{}</failure>\n    </testcase>",
                    xml_escape(&one_line(&check.message)),
                    check.check.as_str(),
                    xml_escape(&check.message)
                );
            }
        }
        let _ = writeln!(out, "  </testsuite>");
    }
    out.push_str("</testsuites>\n");
    out
}

/// Escape text for XML content and attribute values; characters XML 1.0
/// cannot carry at all (most C0 controls) become U+FFFD.
pub fn xml_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(provider: &str, failing_message: Option<&str>) -> ContractReport {
        let mut checks: Vec<CheckResult> = CheckKind::ALL
            .iter()
            .map(|&check| CheckResult {
                case: "arabic".into(),
                check,
                passed: true,
                message: String::new(),
            })
            .collect();
        if let Some(message) = failing_message {
            checks[2].passed = false;
            checks[2].message = message.into();
        }
        ContractReport {
            contract: "ticket-triage".into(),
            contract_digest: "0123456789abcdef".repeat(4),
            provider: provider.into(),
            passed: failing_message.is_none(),
            checks,
        }
    }

    #[test]
    fn junit_escapes_angle_brackets_and_ampersands() {
        let xml =
            report("sim", Some("output is not JSON: <html> & \"quotes\"\u{0}")).to_junit_xml();
        assert!(
            xml.contains("&lt;html&gt; &amp; &quot;quotes&quot;\u{FFFD}"),
            "{xml}"
        );
        assert!(!xml.contains("<html>"), "{xml}");
        assert!(xml.contains("failures=\"1\""), "{xml}");
        assert!(xml.contains("name=\"arabic::schema\""), "{xml}");
    }

    #[test]
    fn table_shows_each_provider_and_failure_reasons() {
        let reports = [
            report("openai-main", None),
            report("sim", Some("at /sentiment: invented top-level key")),
        ];
        let table = render_table(&reports);
        assert!(
            table.contains("contract ticket-triage (digest 0123456789ab)"),
            "{table}"
        );
        assert!(
            table
                .lines()
                .any(|l| l.contains("openai-main") && l.ends_with("PASS")),
            "{table}"
        );
        assert!(
            table
                .lines()
                .any(|l| l.contains("sim") && l.contains("0/1 FAIL") && l.ends_with("FAIL")),
            "{table}"
        );
        assert!(
            table.contains("sim / arabic / schema: at /sentiment: invented top-level key"),
            "{table}"
        );
    }

    #[test]
    fn report_serializes_checks_by_name() {
        let json = serde_json::to_value(report("sim", None)).unwrap();
        assert_eq!(json["checks"][0]["check"], "prompt_rendering");
        assert_eq!(json["checks"][3]["check"], "round_trip");
        let back: ContractReport = serde_json::from_value(json).unwrap();
        assert_eq!(back, report("sim", None));
    }
}
