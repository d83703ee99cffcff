//! Kubernetes' label selector syntax, as the API server reads the `labelSelector` the provider
//! lists and watches with: a port of apimachinery v0.36.3's `labels.Parse`
//! (k8s.io/apimachinery/pkg/labels/selector.go: its lexer, its parser and `NewRequirement`'s
//! checks, with `IsLabelKey` and `IsLabelValue` from pkg/api/validate/content), so
//! `check-config` decides what a selector selects with the same grammar Kubernetes uses. A
//! guess at the syntax passed `credbroker notin(x)`, which Kubernetes reads as
//! `credbroker notin (x)`: every Secret without that label.
//!
//! Faithful to the byte: identifiers end at whitespace (space, tab, CR, LF) or one of
//! `=!(),<>`; `in` and `notin` are operators after a key and values inside parentheses; a NUL
//! byte ends the token it is in and, between tokens, the selector. The table test's answers
//! come from the real parser.

use std::collections::BTreeSet;

/// A requirement's operator (`selection.Operator`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operator {
    Equals,
    DoubleEquals,
    NotEquals,
    In,
    NotIn,
    Exists,
    DoesNotExist,
    GreaterThan,
    LessThan,
}

impl Operator {
    /// Go's name of the operator (`selection.Operator`'s string).
    fn as_str(self) -> &'static str {
        match self {
            Self::Equals => "=",
            Self::DoubleEquals => "==",
            Self::NotEquals => "!=",
            Self::In => "in",
            Self::NotIn => "notin",
            Self::Exists => "exists",
            Self::DoesNotExist => "!",
            Self::GreaterThan => "gt",
            Self::LessThan => "lt",
        }
    }
}

/// One requirement of a selector; `values` sorted and without repeats, as Go's `sets.String`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    pub operator: Operator,
    pub values: Vec<String>,
}

impl Requirement {
    /// Whether an object with no labels meets it (`Requirement.Matches` on an empty set): the
    /// operators a label's absence satisfies.
    pub fn matches_unlabelled(&self) -> bool {
        matches!(
            self.operator,
            Operator::NotIn | Operator::NotEquals | Operator::DoesNotExist
        )
    }
}

/// How Kubernetes reads the requirement, in its own syntax (`Requirement.String`).
impl std::fmt::Display for Requirement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let values = self.values.join(",");
        match self.operator {
            Operator::Exists => write!(f, "{}", self.key),
            Operator::DoesNotExist => write!(f, "!{}", self.key),
            Operator::In | Operator::NotIn => {
                write!(f, "{} {} ({values})", self.key, self.operator.as_str())
            }
            Operator::GreaterThan => write!(f, "{}>{values}", self.key),
            Operator::LessThan => write!(f, "{}<{values}", self.key),
            op => write!(f, "{}{}{values}", self.key, op.as_str()),
        }
    }
}

/// Whether a selector of these requirements selects an object with no labels: every
/// requirement must (no requirement selects everything).
pub fn matches_unlabelled(requirements: &[Requirement]) -> bool {
    requirements.iter().all(Requirement::matches_unlabelled)
}

/// `labels.Parse`: the requirements, sorted by key, or why Kubernetes refuses the text (its
/// wording).
pub fn parse(selector: &str) -> Result<Vec<Requirement>, String> {
    let mut lexer = Lexer {
        s: selector.as_bytes(),
        pos: 0,
    };
    let mut items = Vec::new();
    loop {
        let item = lexer.lex();
        let end = item.0 == Tok::EndOfString;
        items.push(item);
        if end {
            break;
        }
    }
    let mut parser = Parser { items, position: 0 };
    let mut requirements = parser.parse()?;
    requirements.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(requirements)
}

/// The lexer's tokens (`Token`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tok {
    Error,
    EndOfString,
    ClosedPar,
    Comma,
    DoesNotExist,
    DoubleEquals,
    Equals,
    GreaterThan,
    Identifier,
    In,
    LessThan,
    NotEquals,
    NotIn,
    OpenPar,
}

/// `string2token`.
fn token_of(text: &[u8]) -> Option<Tok> {
    Some(match text {
        b")" => Tok::ClosedPar,
        b"," => Tok::Comma,
        b"!" => Tok::DoesNotExist,
        b"==" => Tok::DoubleEquals,
        b"=" => Tok::Equals,
        b">" => Tok::GreaterThan,
        b"in" => Tok::In,
        b"<" => Tok::LessThan,
        b"!=" => Tok::NotEquals,
        b"notin" => Tok::NotIn,
        b"(" => Tok::OpenPar,
        _ => return None,
    })
}

fn is_whitespace(ch: u8) -> bool {
    matches!(ch, b' ' | b'\t' | b'\r' | b'\n')
}

fn is_special_symbol(ch: u8) -> bool {
    matches!(ch, b'=' | b'!' | b'(' | b')' | b',' | b'>' | b'<')
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

struct Lexer<'a> {
    s: &'a [u8],
    pos: usize,
}

impl Lexer<'_> {
    /// The next byte, 0 at the end (a NUL byte reads as 0 too, and is consumed).
    fn read(&mut self) -> u8 {
        match self.s.get(self.pos) {
            Some(&b) => {
                self.pos += 1;
                b
            }
            None => 0,
        }
    }

    fn unread(&mut self) {
        self.pos = self.pos.saturating_sub(1);
    }

    fn scan_id_or_keyword(&mut self) -> (Tok, String) {
        let mut buffer = Vec::new();
        loop {
            match self.read() {
                0 => break,
                ch if is_special_symbol(ch) || is_whitespace(ch) => {
                    self.unread();
                    break;
                }
                ch => buffer.push(ch),
            }
        }
        match token_of(&buffer) {
            Some(tok) => (tok, text(&buffer)),
            None => (Tok::Identifier, text(&buffer)),
        }
    }

    fn scan_special_symbol(&mut self) -> (Tok, String) {
        let mut last: Option<(Tok, String)> = None;
        let mut buffer = Vec::new();
        loop {
            match self.read() {
                0 => break,
                ch if is_special_symbol(ch) => {
                    buffer.push(ch);
                    if let Some(tok) = token_of(&buffer) {
                        last = Some((tok, text(&buffer)));
                    } else if last.is_some() {
                        self.unread();
                        break;
                    }
                }
                _ => {
                    self.unread();
                    break;
                }
            }
        }
        last.unwrap_or_else(|| {
            (
                Tok::Error,
                format!("error expected: keyword found '{}'", text(&buffer)),
            )
        })
    }

    fn lex(&mut self) -> (Tok, String) {
        let mut ch = self.read();
        while is_whitespace(ch) {
            ch = self.read();
        }
        match ch {
            0 => (Tok::EndOfString, String::new()),
            ch if is_special_symbol(ch) => {
                self.unread();
                self.scan_special_symbol()
            }
            _ => {
                self.unread();
                self.scan_id_or_keyword()
            }
        }
    }
}

/// Where the parser is: after a key `in`/`notin` are operators, among values identifiers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Context {
    KeyAndOperator,
    Values,
}

struct Parser {
    items: Vec<(Tok, String)>,
    position: usize,
}

impl Parser {
    fn item(&self, at: usize, context: Context) -> (Tok, String) {
        let (tok, lit) = self
            .items
            .get(at)
            .cloned()
            .unwrap_or((Tok::EndOfString, String::new()));
        match tok {
            Tok::In | Tok::NotIn if context == Context::Values => (Tok::Identifier, lit),
            _ => (tok, lit),
        }
    }

    fn lookahead(&self, context: Context) -> (Tok, String) {
        self.item(self.position, context)
    }

    fn consume(&mut self, context: Context) -> (Tok, String) {
        self.position += 1;
        self.item(self.position - 1, context)
    }

    fn parse(&mut self) -> Result<Vec<Requirement>, String> {
        let mut requirements = Vec::new();
        loop {
            let (tok, lit) = self.lookahead(Context::Values);
            match tok {
                Tok::Identifier | Tok::DoesNotExist => {
                    let r = self
                        .parse_requirement()
                        .map_err(|e| format!("unable to parse requirement: {e}"))?;
                    requirements.push(r);
                    let (t, l) = self.consume(Context::Values);
                    match t {
                        Tok::EndOfString => return Ok(requirements),
                        Tok::Comma => {
                            let (t2, l2) = self.lookahead(Context::Values);
                            if t2 != Tok::Identifier && t2 != Tok::DoesNotExist {
                                return Err(format!(
                                    "found '{l2}', expected: identifier after ','"
                                ));
                            }
                        }
                        _ => return Err(format!("found '{l}', expected: ',' or 'end of string'")),
                    }
                }
                Tok::EndOfString => return Ok(requirements),
                _ => {
                    return Err(format!(
                        "found '{lit}', expected: !, identifier, or 'end of string'"
                    ));
                }
            }
        }
    }

    fn parse_requirement(&mut self) -> Result<Requirement, String> {
        let (key, operator) = self.parse_key_and_infer_operator()?;
        if let Some(op @ (Operator::Exists | Operator::DoesNotExist)) = operator {
            return new_requirement(key, op, BTreeSet::new());
        }
        let operator = self.parse_operator()?;
        let values = match operator {
            Operator::In | Operator::NotIn => self.parse_values()?,
            _ => self.parse_exact_value()?,
        };
        new_requirement(key, operator, values)
    }

    fn parse_key_and_infer_operator(&mut self) -> Result<(String, Option<Operator>), String> {
        let mut operator = None;
        let (mut tok, mut literal) = self.consume(Context::Values);
        if tok == Tok::DoesNotExist {
            operator = Some(Operator::DoesNotExist);
            (tok, literal) = self.consume(Context::Values);
        }
        if tok != Tok::Identifier {
            return Err(format!("found '{literal}', expected: identifier"));
        }
        label_key(&literal)?;
        let (t, _) = self.lookahead(Context::Values);
        if matches!(t, Tok::EndOfString | Tok::Comma) && operator != Some(Operator::DoesNotExist) {
            operator = Some(Operator::Exists);
        }
        Ok((literal, operator))
    }

    fn parse_operator(&mut self) -> Result<Operator, String> {
        let (tok, lit) = self.consume(Context::KeyAndOperator);
        Ok(match tok {
            Tok::In => Operator::In,
            Tok::Equals => Operator::Equals,
            Tok::DoubleEquals => Operator::DoubleEquals,
            Tok::GreaterThan => Operator::GreaterThan,
            Tok::LessThan => Operator::LessThan,
            Tok::NotIn => Operator::NotIn,
            Tok::NotEquals => Operator::NotEquals,
            _ => {
                return Err(format!(
                    "found '{lit}', expected: in, notin, =, ==, !=, gt, lt"
                ));
            }
        })
    }

    fn parse_values(&mut self) -> Result<BTreeSet<String>, String> {
        let (tok, lit) = self.consume(Context::Values);
        if tok != Tok::OpenPar {
            return Err(format!("found '{lit}' expected: '('"));
        }
        let (tok, lit) = self.lookahead(Context::Values);
        match tok {
            Tok::Identifier | Tok::Comma => {
                let s = self.parse_identifiers_list()?;
                if self.consume(Context::Values).0 != Tok::ClosedPar {
                    return Err(format!("found '{lit}', expected: ')'"));
                }
                Ok(s)
            }
            Tok::ClosedPar => {
                self.consume(Context::Values);
                Ok(BTreeSet::from([String::new()]))
            }
            _ => Err(format!("found '{lit}', expected: ',', ')' or identifier")),
        }
    }

    fn parse_identifiers_list(&mut self) -> Result<BTreeSet<String>, String> {
        let mut s = BTreeSet::new();
        loop {
            let (tok, lit) = self.consume(Context::Values);
            match tok {
                Tok::Identifier => {
                    s.insert(lit);
                    let (tok2, lit2) = self.lookahead(Context::Values);
                    match tok2 {
                        Tok::Comma => {}
                        Tok::ClosedPar => return Ok(s),
                        _ => return Err(format!("found '{lit2}', expected: ',' or ')'")),
                    }
                }
                Tok::Comma => {
                    if s.is_empty() {
                        s.insert(String::new());
                    }
                    let (tok2, _) = self.lookahead(Context::Values);
                    if tok2 == Tok::ClosedPar {
                        s.insert(String::new());
                        return Ok(s);
                    }
                    if tok2 == Tok::Comma {
                        s.insert(String::new());
                    }
                }
                _ => return Err(format!("found '{lit}', expected: ',', or identifier")),
            }
        }
    }

    fn parse_exact_value(&mut self) -> Result<BTreeSet<String>, String> {
        let (tok, _) = self.lookahead(Context::Values);
        if matches!(tok, Tok::EndOfString | Tok::Comma) {
            return Ok(BTreeSet::from([String::new()]));
        }
        let (tok, lit) = self.consume(Context::Values);
        if tok == Tok::Identifier {
            return Ok(BTreeSet::from([lit]));
        }
        Err(format!("found '{lit}', expected: identifier"))
    }
}

/// `NewRequirement`'s checks.
fn new_requirement(
    key: String,
    operator: Operator,
    values: BTreeSet<String>,
) -> Result<Requirement, String> {
    label_key(&key)?;
    let count_ok = match operator {
        Operator::In | Operator::NotIn => !values.is_empty(),
        Operator::Exists | Operator::DoesNotExist => values.is_empty(),
        _ => values.len() == 1,
    };
    if !count_ok {
        return Err(format!(
            "{key}: the wrong number of values for '{}'",
            operator.as_str()
        ));
    }
    if matches!(operator, Operator::GreaterThan | Operator::LessThan) {
        for value in &values {
            if value.parse::<i64>().is_err() {
                return Err(format!(
                    "values[0]: Invalid value: {value:?}: for 'Gt', 'Lt' operators, the value must be an integer"
                ));
            }
        }
    }
    for value in &values {
        if value.len() > MAX_NAME_BYTES {
            return Err(format!(
                "values[0][{key}]: Invalid value: {value:?}: must be no more than {MAX_NAME_BYTES} bytes"
            ));
        }
        if !value.is_empty() && !is_label_name(value) {
            return Err(format!(
                "values[0][{key}]: Invalid value: {value:?}: {LABEL_VALUE_RULE}"
            ));
        }
    }
    Ok(Requirement {
        key,
        operator,
        values: values.into_iter().collect(),
    })
}

/// The most bytes of a label key's name part, or of a label value (`labelKeyMaxLength`,
/// `LabelValueMaxLength`).
const MAX_NAME_BYTES: usize = 63;
/// The most bytes of a label key's prefix (`DNS1123SubdomainMaxLength`).
const MAX_PREFIX_BYTES: usize = 253;

const LABEL_NAME_RULE: &str = "must consist of alphanumeric characters, '-', '_' or '.', and \
     must start and end with an alphanumeric character";
const LABEL_VALUE_RULE: &str = "a valid label must be an empty string or consist of \
     alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric \
     character";

/// `^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$`.
fn is_label_name(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

/// `^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$` (no per-label length).
fn is_dns1123_subdomain(s: &str) -> bool {
    let lower_alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    s.split('.').all(|label| {
        let b = label.as_bytes();
        match (b.first(), b.last()) {
            (Some(first), Some(last)) => {
                lower_alnum(first)
                    && lower_alnum(last)
                    && b.iter().all(|c| lower_alnum(c) || *c == b'-')
            }
            _ => false,
        }
    })
}

/// `IsLabelKey`: an optional DNS-1123 subdomain prefix and '/', then a name.
fn label_key(key: &str) -> Result<(), String> {
    let invalid = |why: String| format!("Invalid value: {key:?}: {why}");
    let parts: Vec<&str> = key.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                return Err(invalid("prefix part must be non-empty".into()));
            }
            if prefix.len() > MAX_PREFIX_BYTES {
                return Err(invalid(format!(
                    "prefix part must be no more than {MAX_PREFIX_BYTES} bytes"
                )));
            }
            if !is_dns1123_subdomain(prefix) {
                return Err(invalid(
                    "prefix part a lowercase RFC 1123 subdomain must consist of lower case \
                     alphanumeric characters, '-' or '.', and must start and end with an \
                     alphanumeric character"
                        .into(),
                ));
            }
            name
        }
        _ => {
            return Err(invalid(format!(
                "a valid label key {LABEL_NAME_RULE} with an optional DNS subdomain prefix \
                 and '/' (e.g. 'example.com/MyName')"
            )));
        }
    };
    if name.is_empty() {
        return Err(invalid("name part must be non-empty".into()));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(invalid(format!(
            "name part must be no more than {MAX_NAME_BYTES} bytes"
        )));
    }
    if !is_label_name(name) {
        return Err(invalid(format!("name part {LABEL_NAME_RULE}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the real parser answers: `labels.Parse` of apimachinery v0.36.3, each selector's
    /// requirements (key, operator, sorted values, sorted by text) and whether it matches an
    /// empty label set (`Selector.Matches(labels.Set{})`), or `ERR` when it refuses the text.
    /// Printed by a throwaway Go program over this table's inputs; the rows are its output.
    const TABLE: &[(&str, &str)] = &[
        (
            "credbroker.dev/credential=true",
            "credbroker.dev/credential = [\"true\"] => false",
        ),
        ("credbroker notin(x)", "credbroker notin [\"x\"] => true"),
        ("credbroker notin (x)", "credbroker notin [\"x\"] => true"),
        (
            "credbroker notin(x),app=kueue",
            "app = [\"kueue\"]; credbroker notin [\"x\"] => false",
        ),
        ("tier notin(a,b)", "tier notin [\"a\",\"b\"] => true"),
        ("x in(a)", "x in [\"a\"] => false"),
        ("x in (a)", "x in [\"a\"] => false"),
        (
            "x in(a),y notin(b)",
            "x in [\"a\"]; y notin [\"b\"] => false",
        ),
        ("!app", "app ! [] => true"),
        ("! app", "app ! [] => true"),
        (
            "!app, tier notin (a, b), env!=prod",
            "app ! []; env != [\"prod\"]; tier notin [\"a\",\"b\"] => true",
        ),
        ("env!=prod", "env != [\"prod\"] => true"),
        ("env==prod", "env == [\"prod\"] => false"),
        ("env=prod", "env = [\"prod\"] => false"),
        ("env = prod", "env = [\"prod\"] => false"),
        ("env= ", "env = [\"\"] => false"),
        ("env=", "env = [\"\"] => false"),
        ("env", "env exists [] => false"),
        ("env,!other", "env exists []; other ! [] => false"),
        ("a>1", "a gt [\"1\"] => false"),
        ("a<1", "a lt [\"1\"] => false"),
        ("a>b", "ERR"),
        ("a>-1", "ERR"),
        ("a > 1", "a gt [\"1\"] => false"),
        ("x in ()", "x in [\"\"] => false"),
        ("x notin ()", "x notin [\"\"] => true"),
        ("x in (,)", "x in [\"\"] => false"),
        ("x in (a,,b)", "x in [\"\",\"a\",\"b\"] => false"),
        ("x in (a b)", "ERR"),
        ("x in a", "ERR"),
        ("x notin", "ERR"),
        ("x in", "ERR"),
        ("x in(in)", "x in [\"in\"] => false"),
        ("x in (notin)", "x in [\"notin\"] => false"),
        ("in in (a)", "in in [\"a\"] => false"),
        ("notin=x", "notin = [\"x\"] => false"),
        ("notin notin (x)", "notin notin [\"x\"] => true"),
        ("notin", "notin exists [] => false"),
        ("in", "in exists [] => false"),
        ("in=x", "in = [\"x\"] => false"),
        ("a=b=c", "ERR"),
        ("a==b", "a == [\"b\"] => false"),
        ("a!b", "ERR"),
        ("a=!b", "ERR"),
        ("a!=b", "a != [\"b\"] => true"),
        ("a=(b)", "ERR"),
        ("a,", "ERR"),
        (",a", "ERR"),
        ("a,,b", "ERR"),
        ("a b", "ERR"),
        ("a=b c", "ERR"),
        (" a=b ", "a = [\"b\"] => false"),
        ("\ta=b\t", "a = [\"b\"] => false"),
        ("a=b,", "ERR"),
        ("(a)", "ERR"),
        ("a=b)", "ERR"),
        ("example.com/key=v", "example.com/key = [\"v\"] => false"),
        ("Example.com/key=v", "ERR"),
        ("/key=v", "ERR"),
        ("a/b/c=v", "ERR"),
        ("key/=v", "ERR"),
        ("-a=v", "ERR"),
        ("a-=v", "ERR"),
        ("a_b.c-d=v", "a_b.c-d = [\"v\"] => false"),
        (
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa=v",
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa = [\"v\"] => false",
        ),
        (
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa=v",
            "ERR",
        ),
        (
            "a=vvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvv",
            "a = [\"vvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvv\"] => false",
        ),
        (
            "a=vvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvv",
            "ERR",
        ),
        ("a=-v", "ERR"),
        ("a=v_", "ERR"),
        ("a=ünï", "ERR"),
        ("ünï=a", "ERR"),
        (
            "a>9223372036854775807",
            "a gt [\"9223372036854775807\"] => false",
        ),
        ("a>9223372036854775808", "ERR"),
        ("a>+1", "ERR"),
        ("a>01", "a gt [\"01\"] => false"),
        ("x notin(a),!y", "x notin [\"a\"]; y ! [] => true"),
        ("x notin(a),y", "x notin [\"a\"]; y exists [] => false"),
        ("!x,y in (a)", "x ! []; y in [\"a\"] => false"),
        ("a<=1", "ERR"),
        ("a>=1", "ERR"),
        ("a=>1", "ERR"),
        ("a!==b", "ERR"),
        ("a===b", "ERR"),
        ("a!=", "a != [\"\"] => true"),
        ("a!", "ERR"),
        ("a=b\x00garbage", "ERR"),
        ("a\x00=b", "a = [\"b\"] => false"),
        ("a=b\x00", "a = [\"b\"] => false"),
        ("\x00", " => true"),
        ("a b=c", "ERR"),
        ("a\rb", "ERR"),
        (" a=b", "a = [\"b\"] => false"),
        ("\x0ba=b", "ERR"),
        (
            "x in (a,b),x notin (c)",
            "x in [\"a\",\"b\"]; x notin [\"c\"] => false",
        ),
        ("x in (  a , b  )", "x in [\"a\",\"b\"] => false"),
        ("x in (a,)", "x in [\"\",\"a\"] => false"),
        ("!", "ERR"),
        ("!!a", "ERR"),
        ("!a=b", "ERR"),
        ("!a in (b)", "ERR"),
        ("a in (b),", "ERR"),
    ];

    fn ours(selector: &str) -> String {
        match parse(selector) {
            Err(_) => "ERR".to_owned(),
            Ok(requirements) => {
                let mut parts: Vec<String> = requirements
                    .iter()
                    .map(|r| {
                        let values: Vec<String> =
                            r.values.iter().map(|v| format!("{v:?}")).collect();
                        format!("{} {} [{}]", r.key, r.operator.as_str(), values.join(","))
                    })
                    .collect();
                parts.sort();
                format!(
                    "{} => {}",
                    parts.join("; "),
                    matches_unlabelled(&requirements)
                )
            }
        }
    }

    #[test]
    fn parses_as_kubernetes_does() {
        let wrong: Vec<String> = TABLE
            .iter()
            .filter(|(selector, want)| ours(selector) != *want)
            .map(|(selector, want)| {
                format!(
                    "{selector:?}: ours {:?}, Kubernetes {want:?}",
                    ours(selector)
                )
            })
            .collect();
        assert!(wrong.is_empty(), "{wrong:#?}");
    }

    #[test]
    fn requirements_print_as_kubernetes_reads_them() {
        let shown: Vec<String> = parse("credbroker notin(x),!b, c!=d,e in (f,g), h, i>1")
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            shown,
            [
                "!b",
                "c!=d",
                "credbroker notin (x)",
                "e in (f,g)",
                "h",
                "i>1"
            ]
        );
        let e = parse("a b").unwrap_err();
        assert_eq!(
            e,
            "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt"
        );
    }
}
