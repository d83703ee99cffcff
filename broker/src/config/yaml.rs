//! YAML text → a JSON tree, with the two guards a config file needs that the YAML library
//! does not give: a duplicate key is an error naming its path (a second `socket:` block
//! silently replacing the first once dropped `allowedUids`), and the tree may not expand
//! (through anchors and aliases) beyond what a plain file of the allowed size could hold.

use std::cell::{Cell, RefCell};
use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// A config for 1 000 providers with every key spelled out is about 300 KiB; a file larger
/// than this is a mistake or an attack, and is refused before it is parsed.
pub const MAX_CONFIG_BYTES: usize = 1024 * 1024;
/// How large the tree may grow once anchors and aliases are expanded, counting each value
/// as its text plus [`VALUE_COST`] bytes. Written out without aliases, a [`MAX_CONFIG_BYTES`]
/// file never gets near it, so only an alias bomb (a large anchor referenced thousands of
/// times) goes past it; it keeps parsing well under a second and a few MiB of memory.
pub const MAX_EXPANDED_BYTES: usize = 4 * MAX_CONFIG_BYTES;
/// What one value costs beyond its text: `- 1\n` is four bytes in a file.
const VALUE_COST: usize = 4;
/// How deep `[` and `{` may nest. A config nests a few levels (`providers[0].aws.allowOverrides`);
/// the YAML library stops at 128 only after scanning the whole text, and its scan of nested
/// flow mappings is quadratic in their depth (a 950 KB file of `{a: {a: …` took over 5 minutes
/// of a core, and a reload on SIGHUP with it). Checked first, in one pass.
pub const MAX_FLOW_DEPTH: usize = 64;

/// Why the text was refused: the path where it happened (empty when the YAML library
/// found it, whose message has the line and column), and what.
#[derive(Debug, PartialEq)]
pub struct TreeError {
    pub path: String,
    pub message: String,
}

/// Parses `text` into a JSON tree; an empty document is `null`.
pub fn parse(text: &str) -> Result<Value, TreeError> {
    if text.len() > MAX_CONFIG_BYTES {
        return Err(TreeError {
            path: "(file)".into(),
            message: format!(
                "the file has {} bytes; a config file may have at most {MAX_CONFIG_BYTES}",
                text.len()
            ),
        });
    }
    check_flow_depth(text)?;
    let budget = Cell::new(MAX_EXPANDED_BYTES);
    let found = RefCell::new(None);
    let seed = Tree {
        path: String::new(),
        budget: &budget,
        found: &found,
    };
    let result = seed.deserialize(serde_norway::Deserializer::from_str(text));
    if let Some(e) = found.into_inner() {
        return Err(e);
    }
    result.map_err(|e| {
        let message = e.to_string();
        // The library's own bound on alias jumps; its text alone does not say what to do.
        let message = if message.starts_with("repetition limit exceeded") {
            format!("{message}: too many YAML alias references (*name); write the values out")
        } else {
            message
        };
        TreeError {
            path: "(yaml)".into(),
            message,
        }
    })
}

/// Refuses `[`/`{` nested deeper than [`MAX_FLOW_DEPTH`], in one pass over the text: outside
/// quotes and comments, a bracket that starts a value (at a line's start, after a space, after
/// a bracket that opened, or after a `,` inside brackets) opens, and a closing one closes. A
/// bracket inside a plain word (`a[0]`, `x[[`) is text, as YAML reads it.
fn check_flow_depth(text: &str) -> Result<(), TreeError> {
    enum In {
        Text,
        Single,
        Double,
        Comment,
    }
    // Whether the next character starts a value.
    let (mut depth, mut state, mut boundary) = (0usize, In::Text, true);
    let (mut line, mut column) = (1usize, 0usize);
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        column += 1;
        if c == '\n' {
            (line, column) = (line + 1, 0);
        }
        let was_boundary = boundary;
        boundary = c.is_whitespace();
        match state {
            In::Comment if c == '\n' => state = In::Text,
            In::Comment => {}
            In::Single if c == '\'' => {
                // '' is a quote inside the string.
                if chars.peek() == Some(&'\'') {
                    chars.next();
                    column += 1;
                } else {
                    state = In::Text;
                }
            }
            In::Single => {}
            In::Double if c == '\\' => {
                chars.next();
                column += 1;
            }
            In::Double if c == '"' => state = In::Text,
            In::Double => {}
            In::Text => match c {
                '#' if was_boundary => state = In::Comment,
                '\'' if was_boundary => state = In::Single,
                '"' if was_boundary => state = In::Double,
                ',' if depth > 0 => boundary = true,
                '[' | '{' if was_boundary => {
                    boundary = true;
                    depth += 1;
                    if depth > MAX_FLOW_DEPTH {
                        return Err(TreeError {
                            path: "(yaml)".into(),
                            message: format!(
                                "line {line} column {column}: `{c}` nests more than {MAX_FLOW_DEPTH} levels of [ ] and {{ }}; a config needs a few"
                            ),
                        });
                    }
                }
                ']' | '}' => depth = depth.saturating_sub(1),
                _ => {}
            },
        }
    }
    Ok(())
}

/// One node of the tree being read, knowing where it stands.
struct Tree<'a> {
    path: String,
    budget: &'a Cell<usize>,
    found: &'a RefCell<Option<TreeError>>,
}

impl Tree<'_> {
    fn child(&self, path: String) -> Self {
        Tree {
            path,
            budget: self.budget,
            found: self.found,
        }
    }

    /// Records why parsing stopped (the YAML library's error would lose our path) and
    /// returns an error that stops it.
    fn refuse<E: de::Error>(&self, path: String, message: String) -> E {
        let error = E::custom(&message);
        *self.found.borrow_mut() = Some(TreeError { path, message });
        error
    }

    /// Charges one value with `text` bytes of text to the expansion budget.
    fn count<E: de::Error>(&self, text: usize) -> Result<(), E> {
        match self.budget.get().checked_sub(VALUE_COST + text) {
            Some(left) => {
                self.budget.set(left);
                Ok(())
            }
            None => Err(self.refuse(
                self.shown_path(),
                format!(
                    "the config expands to more than {MAX_EXPANDED_BYTES} bytes; \
                     YAML aliases (*name) may not multiply it beyond that"
                ),
            )),
        }
    }

    fn shown_path(&self) -> String {
        if self.path.is_empty() {
            "(top level)".into()
        } else {
            self.path.clone()
        }
    }
}

impl<'de> DeserializeSeed<'de> for Tree<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Tree<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        self.count(0)?;
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        self.count(0)?;
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        self.count(0)?;
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        self.count(0)?;
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        self.count(v.len())?;
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        self.count(v.len())?;
        Ok(Value::String(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        self.count(0)?;
        Ok(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        self.visit_unit()
    }

    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        self.count(0)?;
        let mut items = Vec::new();
        while let Some(item) =
            seq.next_element_seed(self.child(format!("{}[{}]", self.path, items.len())))?
        {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        self.count(0)?;
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let path = if self.path.is_empty() {
                key.clone()
            } else {
                format!("{}.{key}", self.path)
            };
            if out.contains_key(&key) {
                return Err(self.refuse(
                    path,
                    format!(
                        "duplicate key {key:?}: a second value would silently replace the first"
                    ),
                ));
            }
            let value = map.next_value_seed(self.child(path))?;
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(text: &str) -> TreeError {
        parse(text).unwrap_err()
    }

    /// Red-team finding (issue 20, item 9): a file of nested brackets under the size cap
    /// burned a core for minutes (on SIGHUP too); it is refused in one pass.
    #[test]
    fn deep_flow_nesting_is_refused_before_the_parser_sees_it() {
        let started = std::time::Instant::now();
        for text in [
            format!("{}1{}", "{a: ".repeat(190_000), "}".repeat(190_000)),
            format!("{}{}", "[".repeat(480_000), "]".repeat(480_000)),
            format!("providers:\n  - x: {}", "[ ".repeat(65)),
        ] {
            let e = refused(&text);
            assert_eq!(e.path, "(yaml)");
            assert!(e.message.contains("more than 64 levels"), "{}", e.message);
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        let e = refused(&format!("a: 1\nb: {}", "[".repeat(65)));
        assert!(e.message.starts_with("line 2 column 68:"), "{}", e.message);
        // 64 levels are fine; brackets in quotes, comments and words are text.
        let ok = format!("a: {}1{}\n", "[".repeat(64), "]".repeat(64));
        assert!(parse(&ok).is_ok());
        let brackets = "[".repeat(100);
        let text = format!(
            "a: \"{brackets}\"\nb: '{brackets}''{brackets}'\nc: x{brackets}\n# {brackets}\nd: \"\\\"{brackets}\"\n"
        );
        let tree = parse(&text).unwrap();
        assert_eq!(tree["c"], Value::String(format!("x{brackets}")));
        assert_eq!(tree["b"], Value::String(format!("{brackets}'{brackets}")));
    }

    #[test]
    fn plain_yaml_parses_as_before() {
        let text = "socket: {path: /a, mode: \"0660\"}\nproviders:\n  - name: x\n    n: 1\n    f: 1.5\n    b: true\n    z: null\n";
        let want: Value = serde_norway::from_str(text).unwrap();
        assert_eq!(parse(text).unwrap(), want);
        assert_eq!(parse("").unwrap(), Value::Null);
    }

    #[test]
    fn duplicate_keys_are_refused_with_their_path() {
        let e = refused("socket: {allowedUids: [1]}\nsocket: {path: /x}\n");
        assert_eq!(e.path, "socket");
        assert!(e.message.contains("duplicate key \"socket\""), "{e:?}");
        let e = refused("providers:\n  - name: a\n    type: file\n    name: b\n");
        assert_eq!(e.path, "providers[0].name");
        let e = refused("socket:\n  allowedUids: [1]\n  path: /x\n  allowedUids: [2]\n");
        assert_eq!(e.path, "socket.allowedUids");
    }

    #[test]
    fn alias_bombs_are_refused_quickly() {
        // One large anchor referenced a few dozen times: the YAML library's own limit counts
        // alias jumps (100 per event), not the bytes they replay, so this one is ours to stop.
        let mut text = format!("big: &big {}\ncopies: [", "x".repeat(500_000));
        text.push_str(&"*big,".repeat(20));
        text.push_str("*big]\n");
        assert!(text.len() < MAX_CONFIG_BYTES);
        let started = std::time::Instant::now();
        let e = refused(&text);
        assert!(e.message.contains("more than 4194304 bytes"), "{e:?}");
        assert!(e.path.starts_with("copies["), "{e:?}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        // A large list referenced thousands of times, and nested ten-fold aliases, trip the
        // library's own limit on alias jumps: refused either way.
        let mut list = String::from("big: &big [");
        list.push_str(&"1,".repeat(50_000));
        list.push_str("1]\ncopies: [");
        list.push_str(&"*big,".repeat(2_000));
        list.push_str("*big]\n");
        assert!(refused(&list).message.contains("alias"));
        let mut nested = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..10 {
            let p = i - 1;
            nested.push_str(&format!(
                "a{i}: &a{i} [{}]\n",
                vec![format!("*a{p}"); 10].join(", ")
            ));
        }
        assert!(refused(&nested).message.contains("alias"));
        // A modest use of an alias is fine.
        assert!(parse("a: &x {k: v}\nb: *x\n").is_ok());
    }

    #[test]
    fn oversized_files_are_refused_before_parsing() {
        let text = format!("# {}\n", "x".repeat(MAX_CONFIG_BYTES));
        let e = refused(&text);
        assert_eq!(e.path, "(file)");
        assert!(e.message.contains("at most 1048576"), "{e:?}");
    }

    #[test]
    fn syntax_errors_keep_the_librarys_location() {
        let e = refused("providers: [\n");
        assert_eq!(e.path, "(yaml)");
        assert!(e.message.contains("line"), "{e:?}");
    }
}
