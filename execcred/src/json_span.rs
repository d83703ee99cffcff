//! Finds where a member's value sits in JSON text serde_json has already accepted, so that
//! the value can be passed on as written (serde_json's `Value` sorts keys and turns integers
//! past 64 bits into floats; its `RawValue` would need a feature that rebuilds every crate
//! depending on serde_json).

use std::ops::Range;

/// The byte range, within `text[within]`, of the value of member `key` of the JSON object
/// that `text[within]` is. The last occurrence wins, as in serde_json (and Go's
/// encoding/json). `None` when the key is absent or `text[within]` is not an object.
///
/// `text` must be valid JSON (checked by the caller): this only skips over it.
pub(crate) fn member(text: &str, within: Range<usize>, key: &str) -> Option<Range<usize>> {
    let bytes = text.as_bytes();
    let mut pos = skip_ws(bytes, within.start);
    if bytes.get(pos) != Some(&b'{') {
        return None;
    }
    pos += 1;
    let mut found = None;
    loop {
        pos = skip_ws(bytes, pos);
        match bytes.get(pos) {
            Some(b'"') => {}
            _ => return found, // `}` (an empty object or after the last member)
        }
        let key_end = skip_string(bytes, pos);
        let name: Option<String> = serde_json::from_str(text.get(pos..key_end)?).ok();
        pos = skip_ws(bytes, key_end);
        pos = skip_ws(bytes, pos + 1); // the `:`
        let value_end = skip_value(bytes, pos);
        if name.as_deref() == Some(key) {
            found = Some(pos..value_end);
        }
        pos = skip_ws(bytes, value_end);
        match bytes.get(pos) {
            Some(b',') => pos += 1,
            _ => return found,
        }
        if pos >= within.end {
            return found;
        }
    }
}

fn skip_ws(bytes: &[u8], mut pos: usize) -> usize {
    while matches!(bytes.get(pos), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        pos += 1;
    }
    pos
}

/// `bytes[pos]` is the opening quote; returns the position after the closing one.
fn skip_string(bytes: &[u8], mut pos: usize) -> usize {
    pos += 1;
    while let Some(&b) = bytes.get(pos) {
        pos += match b {
            b'\\' => 2,
            b'"' => return pos + 1,
            _ => 1,
        };
    }
    pos
}

/// Returns the position just after the value starting at `pos`.
fn skip_value(bytes: &[u8], mut pos: usize) -> usize {
    match bytes.get(pos) {
        Some(b'"') => skip_string(bytes, pos),
        Some(b'{' | b'[') => {
            // Valid JSON: brackets balance outside strings, so a depth count finds the end.
            let mut depth = 0usize;
            while let Some(&b) = bytes.get(pos) {
                match b {
                    b'"' => {
                        pos = skip_string(bytes, pos);
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return pos + 1;
                        }
                    }
                    _ => {}
                }
                pos += 1;
            }
            pos
        }
        _ => {
            // A number, true, false or null: up to the next delimiter.
            while !matches!(
                bytes.get(pos),
                None | Some(b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
            ) {
                pos += 1;
            }
            pos
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    fn get<'a>(text: &'a str, key: &str) -> Option<&'a str> {
        member(text, 0..text.len(), key).map(|r| &text[r])
    }

    #[test]
    fn finds_members_as_written() {
        let text = r#" { "a" : 1 , "b":{"x":[1,"]}",{"y":"\"}"}]} ,"c":18446744073709551616000,
            "d\u0065":"e", "n": null, "t":true } "#;
        assert_eq!(get(text, "a"), Some("1"));
        assert_eq!(get(text, "b"), Some(r#"{"x":[1,"]}",{"y":"\"}"}]}"#));
        assert_eq!(get(text, "c"), Some("18446744073709551616000"));
        assert_eq!(get(text, "de"), Some(r#""e""#));
        assert_eq!(get(text, "n"), Some("null"));
        assert_eq!(get(text, "t"), Some("true"));
        assert_eq!(get(text, "x"), None);
        assert_eq!(get("{}", "a"), None);
        assert_eq!(get("[1]", "a"), None);
        // The last duplicate wins, as serde_json's Value has it.
        assert_eq!(get(r#"{"a":1,"a":2}"#, "a"), Some("2"));
        // Nested lookups compose.
        let b = member(text, 0..text.len(), "b").unwrap();
        assert_eq!(
            member(text, b, "x").map(|r| &text[r]),
            Some(r#"[1,"]}",{"y":"\"}"}]"#)
        );
    }

    proptest! {
        /// For any object serde_json accepts, each member's span parses to the member's value.
        #[test]
        fn spans_agree_with_serde_json(doc in json_object()) {
            let text = serde_json::to_string_pretty(&doc).unwrap();
            for (key, value) in doc.as_object().unwrap() {
                let span = member(&text, 0..text.len(), key).unwrap();
                let parsed: Value = serde_json::from_str(&text[span]).unwrap();
                prop_assert_eq!(&parsed, value);
            }
        }
    }

    fn json_object() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            "[ -~\\n\"\\\\{}\\[\\]é]{0,12}".prop_map(Value::from),
        ];
        let value = leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::from),
                prop::collection::btree_map("[ -~\"\\\\]{0,6}", inner, 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        });
        prop::collection::btree_map("[ -~\"\\\\é]{0,6}", value, 0..6)
            .prop_map(|m| Value::Object(m.into_iter().collect()))
    }
}
