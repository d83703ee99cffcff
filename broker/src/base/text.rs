//! Text that came from outside (a caller's request, a ClusterProfile, a wrapped plugin, an
//! upstream's answer) on its way into an error message or a log line: truncated, and with
//! every control character escaped, so that it can neither forge a log line (a newline, a
//! carriage return), nor drive a terminal (ESC), nor grow a message without bound.
//!
//! JSON logs escape control characters themselves, but the text format and gRPC status
//! messages (which travel in HTTP/2 trailers with a size limit, and end up on the shim's one
//! stderr line) do not: every piece of outside text goes through [`quote`] or [`one_line`].

use std::fmt::Write as _;

/// How many characters of outside text an error or log line quotes: enough to recognise a
/// cluster name (DNS names are at most 253) or a plugin's first error line, small enough that a
/// status message stays far below HTTP/2's default 16 KiB header list limit.
pub const MAX_QUOTED_CHARS: usize = 256;

/// `s` on one line, at most `max` characters of it, control characters escaped (`\n`, `\r`,
/// `\t`, `\u{1b}` …); a cut is marked with `…(N bytes)` giving the original length.
pub fn one_line(s: &str, max: usize) -> String {
    let mut out = String::with_capacity(s.len().min(max) + 16);
    for (taken, c) in s.chars().enumerate() {
        if taken == max {
            let _ = write!(out, "…({} bytes)", s.len());
            return out;
        }
        push_escaped(&mut out, c);
    }
    out
}

/// [`one_line`] with the default bound ([`MAX_QUOTED_CHARS`]).
pub fn quote(s: &str) -> String {
    one_line(s, MAX_QUOTED_CHARS)
}

/// `s` with every control character, Unicode line separator and bidi override escaped, and
/// nothing else touched (no cut, backslashes kept): the last step before text leaves the
/// broker in a status message, an ErrorInfo value or an AdminService answer, whatever built
/// it. Text already [`quote`]d has none of these left, so it passes unchanged.
pub fn controls_escaped(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(needs_escape) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if needs_escape(c) {
            push_escaped(&mut out, c);
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// C0, DEL, C1, and the Unicode line/paragraph separators and bidi overrides that can
/// reorder or break what a reader sees.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

fn push_escaped(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        '\\' => out.push_str("\\\\"),
        c if needs_escape(c) => {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        }
        c => out.push(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(
            quote("a\nb\r\tc\u{1b}[31md\u{0}e\u{7f}"),
            "a\\nb\\r\\tc\\u{1b}[31md\\u{0}e\\u{7f}"
        );
        assert_eq!(quote("x\u{2028}y\u{202e}z"), "x\\u{2028}y\\u{202e}z");
        assert_eq!(quote("back\\slash"), "back\\\\slash");
        assert_eq!(quote("plain ünïcode ok"), "plain ünïcode ok");
    }

    #[test]
    fn long_text_is_cut_and_says_how_long_it_was() {
        let long = "x".repeat(10_000);
        let q = quote(&long);
        assert!(q.starts_with(&"x".repeat(MAX_QUOTED_CHARS)));
        assert!(q.ends_with("…(10000 bytes)"), "{q}");
        assert!(q.chars().count() < MAX_QUOTED_CHARS + 20);
        assert_eq!(one_line("abc", 3), "abc");
        assert_eq!(one_line("abcd", 3), "abc…(4 bytes)");
        assert_eq!(one_line("ééé", 1), "é…(6 bytes)");
    }

    #[test]
    fn only_what_breaks_a_line_is_escaped_at_the_last_step() {
        assert_eq!(controls_escaped("a\\b \"c\" é"), "a\\b \"c\" é");
        assert_eq!(
            controls_escaped("a\nb\u{1b}c\u{2028}d\u{202e}"),
            "a\\nb\\u{1b}c\\u{2028}d\\u{202e}"
        );
        assert_eq!(
            controls_escaped(&quote("x\ny")),
            quote("x\ny"),
            "quoted text is left alone"
        );
    }

    #[test]
    fn nothing_outside_can_break_a_line() {
        let evil = "ok\n2026-01-01T00:00:00Z  INFO forged line\r\u{1b}]0;title\u{7}";
        let q = quote(evil);
        assert!(!q.chars().any(char::is_control), "{q:?}");
    }
}
