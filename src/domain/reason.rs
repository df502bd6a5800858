//! The reason a human gives for an audited change (a provider switched off,
//! a job resolved, a key's or an owner's limits set): one rule, checked the
//! same way by the HTTP API, the console and the CLI.

/// Longest accepted reason, in characters.
pub const MAX_REASON_CHARS: usize = 500;

/// Why a reason was refused. Its text names no field: the caller puts the
/// field it read the reason from in front (`reason: …`, `--reason: …`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReasonError {
    #[error("required, 1-{MAX_REASON_CHARS} characters")]
    Missing,
    #[error("{0} characters; at most {MAX_REASON_CHARS}")]
    TooLong(usize),
    #[error("{}", super::text::control_refusal(*.0))]
    Control(char),
}

/// The reason, trimmed, if it has 1 to [`MAX_REASON_CHARS`] characters and
/// no control character but line breaks and tabs.
pub fn check_reason(reason: &str) -> Result<&str, ReasonError> {
    let reason = reason.trim();
    if reason.is_empty() {
        return Err(ReasonError::Missing);
    }
    let chars = reason.chars().count();
    if chars > MAX_REASON_CHARS {
        return Err(ReasonError::TooLong(chars));
    }
    if let Some(c) = super::text::control_character(reason) {
        return Err(ReasonError::Control(c));
    }
    Ok(reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_must_say_something_and_not_too_much() {
        assert_eq!(check_reason(""), Err(ReasonError::Missing));
        assert_eq!(check_reason(" \n "), Err(ReasonError::Missing));
        assert_eq!(check_reason(" flaky "), Ok("flaky"));
        // Characters, not bytes; and the count is of the trimmed text.
        assert!(check_reason(&"é".repeat(500)).is_ok());
        assert!(check_reason(&format!("  {}  ", "x".repeat(500))).is_ok());
        // Lines, yes; NUL (which PostgreSQL cannot store) or ESC, no.
        assert_eq!(check_reason("step 1\nstep 2"), Ok("step 1\nstep 2"));
        assert_eq!(check_reason("a\0b"), Err(ReasonError::Control('\0')));
        // Nor a mark that shows the words in another order than stored.
        assert_eq!(
            check_reason("ok \u{202E}evil"),
            Err(ReasonError::Control('\u{202E}'))
        );
        assert_eq!(
            check_reason("a\u{2067}b"),
            Err(ReasonError::Control('\u{2067}'))
        );
        assert!(check_reason("family \u{1F468}\u{200D}\u{1F469}").is_ok());
        assert_eq!(
            check_reason("\u{1b}[2J").unwrap_err().to_string(),
            "must not hold control characters (found U+001B)"
        );
        assert_eq!(
            check_reason(&"x".repeat(501)),
            Err(ReasonError::TooLong(501))
        );
        assert_eq!(
            ReasonError::Missing.to_string(),
            "required, 1-500 characters"
        );
    }
}
