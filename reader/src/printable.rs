//! Error text made safe for a terminal or a log: the one escaping that
//! esdump (every stderr line), the Python `Reader.errors` and esdump-go (the
//! same rule, docs/FORMAT.md table `printable`) use (a hostile file name is
//! quoted in its error). The C ABI (`capi`) hands its messages over raw, as
//! data (they may quote a hostile file name): a C caller that prints one to
//! a terminal escapes it first.

use std::borrow::Cow;

/// `text` (an error message, which may quote a hostile name) with control
/// characters and bidirectional-text overrides escaped (`\u{1b}`, `\n`,
/// `\u{202e}`); everything else as it is.
pub fn printable(text: &str) -> Cow<'_, str> {
    let hostile = |c: char| {
        c.is_control()
            || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !text.chars().any(hostile) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_debug()); // \n, \t, \u{1b}
        } else if hostile(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_and_bidirectional_characters_are_escaped() {
        assert_eq!(printable("plain text"), "plain text");
        assert!(matches!(printable("plain"), Cow::Borrowed(_)));
        assert_eq!(
            printable("/d/x\u{1b}[2J\ny \u{202e}z"),
            "/d/x\\u{1b}[2J\\ny \\u{202e}z"
        );
        assert_eq!(printable("a\u{1b}[31mb\nc"), "a\\u{1b}[31mb\\nc");
    }
}
