//! Text that came from outside (a caller's request, a ClusterProfile, a wrapped plugin, an
//! upstream's answer, a peer's `grpc-message`) on its way into an error message or a log
//! line: truncated, and with every control character escaped, so that it can neither forge a
//! log line (a newline, a carriage return), nor drive a terminal (ESC), nor grow a message
//! without bound.
//!
//! The one escaping rule of both ends of the socket: the broker quotes what goes into its
//! status messages and logs with it, and the shim escapes what it prints on the one stderr
//! line client-go copies into its log (the broker's messages included) with it. Here, in the
//! crate both link without its `transport` feature, because the shim must stay small and
//! free of the broker's code. No dependency: `std` only.

use std::borrow::Cow;
use std::fmt::Write as _;

/// How many characters of outside text an error or log line quotes: enough to recognise a
/// cluster name (DNS names are at most 253) or a plugin's first error line, small enough that a
/// status message stays far below HTTP/2's default 16 KiB header list limit.
pub const MAX_QUOTED_CHARS: usize = 256;

/// `s` on one line, at most `max` characters of it, control characters escaped (`\n`, `\r`,
/// `\t`, `\u{1b}` …) and backslashes doubled; a cut is marked with `…(N bytes)` giving the
/// original length.
pub fn one_line(s: &str, max: usize) -> String {
    let mut out = String::with_capacity(s.len().min(max) + 16);
    for (taken, c) in s.chars().enumerate() {
        if taken == max {
            let _ = write!(out, "…({} bytes)", s.len());
            return out;
        }
        if c == '\\' {
            out.push_str("\\\\");
        } else {
            push_escaped(&mut out, c);
        }
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
/// it, and the shim's whole error line. Text already [`quote`]d has none of these left, so it
/// passes unchanged.
pub fn controls_escaped(s: &str) -> Cow<'_, str> {
    if !s.chars().any(needs_escape) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        push_escaped(&mut out, c);
    }
    Cow::Owned(out)
}

/// [`controls_escaped`] cut to at most `max` bytes of escaped text (never inside an escape or
/// a character), a cut marked with `…(N bytes)` giving the original length: how the shim
/// shows a peer's text, which another server on the socket could make 60 KB long.
pub fn controls_escaped_cut(s: &str, max: usize) -> String {
    let mut out = String::with_capacity(s.len().min(max) + 16);
    let mut one = String::with_capacity(12);
    for c in s.chars() {
        one.clear();
        push_escaped(&mut one, c);
        if out.len() + one.len() > max {
            let _ = write!(out, "…({} bytes)", s.len());
            return out;
        }
        out.push_str(&one);
    }
    out
}

/// C0, DEL, C1, and the Unicode line/paragraph separators and bidi overrides that can
/// reorder or break what a reader sees.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `c`, escaped if it [`needs_escape`]: `\n`, `\r` and `\t` by name, the rest as `\u{..}`.
fn push_escaped(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
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
        assert!(matches!(controls_escaped("plain"), Cow::Borrowed("plain")));
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
    fn a_cut_counts_escaped_bytes_and_never_splits_an_escape_or_a_character() {
        assert_eq!(controls_escaped_cut("a\nb", 4), "a\\nb");
        assert_eq!(controls_escaped_cut("a\nb", 3), "a\\n…(3 bytes)");
        assert_eq!(controls_escaped_cut("a\u{1b}b", 5), "a…(3 bytes)");
        assert_eq!(controls_escaped_cut("éé", 3), "é…(4 bytes)");
        assert_eq!(controls_escaped_cut("back\\slash", 64), "back\\slash");
        let long = format!("{}\n", "m".repeat(60_000));
        let cut = controls_escaped_cut(&long, 2048);
        assert_eq!(cut, format!("{}…(60001 bytes)", "m".repeat(2048)));
    }

    #[test]
    fn nothing_outside_can_break_a_line() {
        let evil = "ok\n2026-01-01T00:00:00Z  INFO forged line\r\u{1b}]0;title\u{7}";
        for shown in [
            quote(evil),
            controls_escaped(evil).into_owned(),
            controls_escaped_cut(evil, 20),
        ] {
            assert!(!shown.chars().any(char::is_control), "{shown:?}");
        }
    }
}
