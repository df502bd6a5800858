//! Text from outside (a provider's answer, a person's reason or label)
//! that onejob stores in a text column and shows on a console or a
//! terminal.
//!
//! PostgreSQL's `text` cannot hold NUL, where SQLite's can: left alone, a
//! NUL is a 500 on one backend and a raw byte on a terminal on the other.
//! What a provider said is kept, its NULs made U+FFFD; what a person typed
//! is refused with the character named.

/// `text` with each NUL made U+FFFD (the replacement character), so both
/// databases store it and store the same.
pub fn storable(text: &mut String) {
    if text.contains('\0') {
        *text = text.replace('\0', "\u{FFFD}");
    }
}

/// The control character that makes `text`, typed by a person as one
/// line or a few (a reason, a label), refused: any but a line break or a
/// tab. Such a character shows nothing on a page and can rewrite an
/// operator's terminal (`ESC`), and PostgreSQL cannot store NUL.
///
/// Also the marks that reorder how the text around them is shown (bidi
/// embeddings, overrides and isolates, and the direction marks): an audit
/// line holding U+202E shows its words in another order than they were
/// stored ("Trojan Source"). The joiners emoji need are not refused.
pub fn control_character(text: &str) -> Option<char> {
    text.chars().find(|c| {
        (c.is_control() && !matches!(c, '\n' | '\r' | '\t'))
            || matches!(c, '\u{200E}' | '\u{200F}' | '\u{061C}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
    })
}

/// Why `text` is refused by [`control_character`], in words.
pub fn typed_text_problem(text: &str) -> Option<String> {
    control_character(text).map(control_refusal)
}

/// "must not hold control characters (found U+001B)".
pub fn control_refusal(found: char) -> String {
    format!(
        "must not hold control characters (found U+{:04X})",
        u32::from(found)
    )
}

/// Text from outside, shown on one line of the log: a control character
/// (a line break among them) is written escaped, as `\n` or `\u{1b}`, so
/// a reason or a provider's message cannot forge a log line of its own or
/// send escapes to the terminal that follows the log.
pub struct OneLine<'a>(pub &'a str);

impl std::fmt::Display for OneLine<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::fmt::Write;
        let mut rest = self.0;
        while let Some(at) = rest.find(char::is_control) {
            f.write_str(&rest[..at])?;
            let c = rest[at..].chars().next().unwrap_or_default();
            for e in c.escape_debug() {
                f.write_char(e)?;
            }
            rest = &rest[at + c.len_utf8()..];
        }
        f.write_str(rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_escapes_what_would_break_the_line() {
        assert_eq!(
            OneLine("ok\n2026 ERROR forged\u{1b}[2J\0é").to_string(),
            "ok\\n2026 ERROR forged\\u{1b}[2J\\0é"
        );
        assert_eq!(OneLine("plain").to_string(), "plain");
    }

    #[test]
    fn nul_becomes_the_replacement_character() {
        let mut text = "chatcmpl-\0x\0".to_string();
        storable(&mut text);
        assert_eq!(text, "chatcmpl-\u{FFFD}x\u{FFFD}");
        let mut clean = "req_1".to_string();
        storable(&mut clean);
        assert_eq!(clean, "req_1");
    }

    #[test]
    fn typed_text_may_break_lines_but_not_hold_controls() {
        assert_eq!(typed_text_problem("rollout\n\tstep 2\r\n"), None);
        assert_eq!(typed_text_problem("café ✓"), None);
        assert_eq!(
            typed_text_problem("a\0b").as_deref(),
            Some("must not hold control characters (found U+0000)")
        );
        assert_eq!(
            typed_text_problem("\u{1b}]0;pwned\u{7}").as_deref(),
            Some("must not hold control characters (found U+001B)")
        );
        assert!(typed_text_problem("x\u{7f}").is_some());
        assert!(typed_text_problem("x\u{85}").is_some());
    }
}
