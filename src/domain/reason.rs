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
}

/// The reason, trimmed, if it has 1 to [`MAX_REASON_CHARS`] characters.
pub fn check_reason(reason: &str) -> Result<&str, ReasonError> {
    let reason = reason.trim();
    if reason.is_empty() {
        return Err(ReasonError::Missing);
    }
    let chars = reason.chars().count();
    if chars > MAX_REASON_CHARS {
        return Err(ReasonError::TooLong(chars));
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
