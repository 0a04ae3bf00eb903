//! Label selectors: Kubernetes' selector syntax over a resource's metadata.
//!
//! A [`Selector`] is a conjunction of [`Requirement`]s, each on one metadata
//! key; a resource matches when it meets every requirement (so the empty
//! selector matches everything). Pure: no I/O, no allocation when matching.
//!
//! ## Grammar
//!
//! ```text
//! selector    = [ requirement { "," requirement } ]      (empty or blank: match all)
//! requirement = key ( "=" | "==" ) [ value ]             equals (the value may be empty)
//!             | key "!=" [ value ]                       not equals; matches an absent key
//!             | key "in" "(" values ")"                  value in the set
//!             | key "notin" "(" values ")"               value not in the set, or absent
//!             | key                                      the key exists
//!             | "!" key                                  the key does not exist
//! values      = value { "," value }                      at least one; duplicates merge
//! ```
//!
//! Whitespace (any Unicode white space) may surround every token and must
//! separate a key from `in` / `notin`. `in` and `notin` are operators only
//! after a key, so they are also valid keys and values. A key is 1 to
//! [`SELECTOR_KEY_BYTES_MAX`] bytes, a value 0 to [`SELECTOR_VALUE_BYTES_MAX`]
//! bytes (non-empty inside `(...)`); neither holds a control character, white
//! space or any of `=!(),`. (The store allows any metadata key without a
//! control character, so a key holding those characters cannot be selected.)
//! A selector text is at most [`SELECTOR_BYTES_MAX`] bytes and holds at most
//! [`SELECTOR_REQUIREMENTS_MAX`] requirements; a trailing or doubled `,` is
//! an error.
//!
//! ## Invariants
//! - [`Selector::parse`] never panics, whatever its input (it comes from the
//!   network), and its work is bounded by the input's length. An error names the
//!   byte offset where the input went wrong (always a char boundary at most
//!   the input's length) and what was expected there.
//! - [`Display`](std::fmt::Display) writes the canonical form, which parses
//!   back to the same selector: `Selector::parse(&s.to_string()) == Ok(s)` for
//!   every parsed `s`. The canonical form keeps the requirements in their
//!   order (duplicates included), writes `a=b`, `a!=b`, `a in (x,y)`,
//!   `a notin (x,y)` (values sorted, without duplicates), `a`, `!a`, joined
//!   by `,` without spaces. A selector whose canonical form would exceed
//!   [`SELECTOR_BYTES_MAX`] (only possible by writing `in(` without a space)
//!   is refused, so that the round trip always holds.
//! - Semantics are Kubernetes': `!=` and `notin` match a resource without the
//!   key; `=`, `in` and the existence test do not. An empty value is a value:
//!   `a=` matches only a present `a` whose value is empty.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// The longest selector text accepted, in bytes.
pub const SELECTOR_BYTES_MAX: usize = 4096;
/// The most requirements in one selector.
pub const SELECTOR_REQUIREMENTS_MAX: usize = 64;
/// The longest key in a requirement, in bytes.
pub const SELECTOR_KEY_BYTES_MAX: usize = 256;
/// The longest value in a requirement, in bytes.
pub const SELECTOR_VALUE_BYTES_MAX: usize = 256;

/// A parsed label selector: every requirement must hold. Empty matches
/// everything. Made by [`Selector::parse`] (or `str::parse`), so every
/// selector satisfies the grammar's rules and round-trips through `Display`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

/// One requirement on one metadata key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    /// `key=value` (or `key==value`): the key is present with this value.
    Equals { key: String, value: String },
    /// `key!=value`: the key is absent or has another value.
    NotEquals { key: String, value: String },
    /// `key in (v1,v2)`: the key is present with one of these (at least one) values.
    In {
        key: String,
        values: BTreeSet<String>,
    },
    /// `key notin (v1,v2)`: the key is absent or has none of these values.
    NotIn {
        key: String,
        values: BTreeSet<String>,
    },
    /// `key`: the key is present, whatever its value.
    Exists { key: String },
    /// `!key`: the key is absent.
    NotExists { key: String },
}

/// Why a selector text was refused: where (a byte offset into the text, on a
/// char boundary) and what was wrong there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("at byte {position}: {message}")]
pub struct SelectorError {
    pub position: usize,
    pub message: String,
}

fn error(position: usize, message: impl Into<String>) -> SelectorError {
    SelectorError {
        position,
        message: message.into(),
    }
}

impl Selector {
    /// Parses a selector text (see the module documentation for the
    /// grammar). Empty or blank text is the empty selector. Never panics.
    pub fn parse(text: &str) -> Result<Selector, SelectorError> {
        if text.len() > SELECTOR_BYTES_MAX {
            return Err(error(
                0,
                format!(
                    "the selector is {} bytes, more than the limit SELECTOR_BYTES_MAX = {SELECTOR_BYTES_MAX}",
                    text.len()
                ),
            ));
        }
        let mut parser = Parser::new(text);
        let mut requirements = Vec::new();
        if parser.peek().kind == Kind::End {
            return Ok(Selector { requirements });
        }
        let mut canonical_bytes = 0usize;
        loop {
            let start = parser.peek().pos;
            if requirements.len() == SELECTOR_REQUIREMENTS_MAX {
                return Err(error(
                    start,
                    format!(
                        "more than the limit SELECTOR_REQUIREMENTS_MAX = {SELECTOR_REQUIREMENTS_MAX} requirements"
                    ),
                ));
            }
            let requirement = parser.requirement()?;
            canonical_bytes += requirement.canonical_len() + usize::from(!requirements.is_empty());
            if canonical_bytes > SELECTOR_BYTES_MAX {
                return Err(error(
                    start,
                    format!(
                        "the selector's canonical form (which writes \" in (\" with a space) would be \
                         more than the limit SELECTOR_BYTES_MAX = {SELECTOR_BYTES_MAX} bytes"
                    ),
                ));
            }
            let after = parser.bump();
            if !matches!(after.kind, Kind::End | Kind::Comma) {
                return Err(error(
                    after.pos,
                    format!(
                        "expected \",\" or the end of the selector after requirement {}, found {}",
                        quote(&requirement.to_string()),
                        describe(after)
                    ),
                ));
            }
            requirements.push(requirement);
            if after.kind == Kind::End {
                break;
            }
            if parser.peek().kind == Kind::End {
                return Err(error(
                    after.pos,
                    "trailing \",\" (expected a requirement after it)",
                ));
            }
        }
        Ok(Selector { requirements })
    }

    /// Whether this selector has no requirements (and so matches everything).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The requirements, in the order written.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// Whether a resource with this metadata (`Resource::metadata`) meets
    /// every requirement.
    /// Whether the stored resource's metadata matches: the one rule lists and watches
    /// use. The empty selector matches without decoding the resource.
    pub fn selects(&self, resource: &crate::StoredResource) -> bool {
        self.is_empty() || self.matches(&resource.resource().metadata)
    }

    pub fn matches(&self, metadata: &BTreeMap<String, String>) -> bool {
        self.matches_lookup(|key| metadata.get(key).map(String::as_str))
    }

    /// [`Selector::matches`] over any metadata: `lookup` answers a key's
    /// value, `None` when the key is absent.
    pub fn matches_lookup<'m>(&self, mut lookup: impl FnMut(&str) -> Option<&'m str>) -> bool {
        self.requirements
            .iter()
            .all(|requirement| requirement.matches_value(lookup(requirement.key())))
    }
}

impl std::str::FromStr for Selector {
    type Err = SelectorError;

    fn from_str(text: &str) -> Result<Selector, SelectorError> {
        Selector::parse(text)
    }
}

impl Requirement {
    /// The metadata key this requirement is on.
    pub fn key(&self) -> &str {
        match self {
            Requirement::Equals { key, .. }
            | Requirement::NotEquals { key, .. }
            | Requirement::In { key, .. }
            | Requirement::NotIn { key, .. }
            | Requirement::Exists { key }
            | Requirement::NotExists { key } => key,
        }
    }

    /// Whether a resource whose value at [`Requirement::key`] is `value`
    /// (`None`: the key is absent) meets this requirement.
    pub fn matches_value(&self, value: Option<&str>) -> bool {
        match self {
            Requirement::Equals { value: wanted, .. } => value == Some(wanted.as_str()),
            Requirement::NotEquals { value: refused, .. } => value != Some(refused.as_str()),
            Requirement::In { values, .. } => value.is_some_and(|v| values.contains(v)),
            Requirement::NotIn { values, .. } => !value.is_some_and(|v| values.contains(v)),
            Requirement::Exists { .. } => value.is_some(),
            Requirement::NotExists { .. } => value.is_none(),
        }
    }

    /// The length of this requirement's canonical form (its `Display`).
    fn canonical_len(&self) -> usize {
        fn set_len(values: &BTreeSet<String>) -> usize {
            values.iter().map(String::len).sum::<usize>() + values.len().saturating_sub(1)
        }
        match self {
            Requirement::Equals { key, value } => key.len() + 1 + value.len(),
            Requirement::NotEquals { key, value } => key.len() + 2 + value.len(),
            Requirement::In { key, values } => key.len() + " in (".len() + set_len(values) + 1,
            Requirement::NotIn { key, values } => {
                key.len() + " notin (".len() + set_len(values) + 1
            }
            Requirement::Exists { key } => key.len(),
            Requirement::NotExists { key } => 1 + key.len(),
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn set(f: &mut fmt::Formatter<'_>, values: &BTreeSet<String>) -> fmt::Result {
            f.write_str("(")?;
            for (i, value) in values.iter().enumerate() {
                if i > 0 {
                    f.write_str(",")?;
                }
                f.write_str(value)?;
            }
            f.write_str(")")
        }
        match self {
            Requirement::Equals { key, value } => write!(f, "{key}={value}"),
            Requirement::NotEquals { key, value } => write!(f, "{key}!={value}"),
            Requirement::In { key, values } => {
                write!(f, "{key} in ")?;
                set(f, values)
            }
            Requirement::NotIn { key, values } => {
                write!(f, "{key} notin ")?;
                set(f, values)
            }
            Requirement::Exists { key } => f.write_str(key),
            Requirement::NotExists { key } => write!(f, "!{key}"),
        }
    }
}

impl fmt::Display for Selector {
    /// The canonical form; see the module documentation.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, requirement) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            requirement.fmt(f)?;
        }
        Ok(())
    }
}

/// A token's kind. A word is a maximal run of characters that are neither
/// white space nor one of `=!(),`; it may hold control characters, which the
/// parser refuses with their position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind<'a> {
    Word(&'a str),
    Equals,
    DoubleEquals,
    NotEquals,
    Bang,
    Open,
    Close,
    Comma,
    End,
}

#[derive(Debug, Clone, Copy)]
struct Token<'a> {
    kind: Kind<'a>,
    /// The byte offset of its first character (the text's length for `End`).
    pos: usize,
}

fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',')
}

/// Splits the text into tokens, always ending with one `End`. Every offset
/// comes from `char_indices`, so every slice is on char boundaries.
fn lex(text: &str) -> Vec<Token<'_>> {
    let mut tokens = Vec::new();
    let mut chars = text.char_indices().peekable();
    while let Some((pos, c)) = chars.next() {
        let kind = match c {
            c if c.is_whitespace() => continue,
            '=' | '!' => {
                let followed_by_equals = chars.next_if(|&(_, next)| next == '=').is_some();
                match (c, followed_by_equals) {
                    ('=', false) => Kind::Equals,
                    ('=', true) => Kind::DoubleEquals,
                    (_, false) => Kind::Bang,
                    (_, true) => Kind::NotEquals,
                }
            }
            '(' => Kind::Open,
            ')' => Kind::Close,
            ',' => Kind::Comma,
            _ => {
                let mut end = pos + c.len_utf8();
                while let Some((i, next)) =
                    chars.next_if(|&(_, next)| !next.is_whitespace() && !is_special(next))
                {
                    end = i + next.len_utf8();
                }
                Kind::Word(&text[pos..end])
            }
        };
        tokens.push(Token { kind, pos });
    }
    tokens.push(Token {
        kind: Kind::End,
        pos: text.len(),
    });
    tokens
}

/// How an error names what it found.
fn describe(token: Token<'_>) -> String {
    match token.kind {
        Kind::Word(word) => quote(word),
        Kind::Equals => "\"=\"".into(),
        Kind::DoubleEquals => "\"==\"".into(),
        Kind::NotEquals => "\"!=\"".into(),
        Kind::Bang => "\"!\"".into(),
        Kind::Open => "\"(\"".into(),
        Kind::Close => "\")\"".into(),
        Kind::Comma => "\",\"".into(),
        Kind::End => "the end of the selector".into(),
    }
}

/// Quotes text from the input for an error, escaped and cut short.
fn quote(text: &str) -> String {
    const CHARS_SHOWN: usize = 40;
    match text.char_indices().nth(CHARS_SHOWN) {
        Some((cut, _)) => format!("{:?}…", &text[..cut]),
        None => format!("{text:?}"),
    }
}

/// Checks a key or value token (`what` names which) that starts at `pos`.
fn checked(what: &str, text: &str, pos: usize, bytes_max: usize) -> Result<String, SelectorError> {
    if text.len() > bytes_max {
        return Err(error(
            pos,
            format!(
                "{what} {} is {} bytes, more than the limit of {bytes_max}",
                quote(text),
                text.len()
            ),
        ));
    }
    if let Some((i, c)) = text.char_indices().find(|(_, c)| c.is_control()) {
        return Err(error(
            pos + i,
            format!(
                "{what} {} holds the control character U+{:04X}",
                quote(text),
                u32::from(c)
            ),
        ));
    }
    Ok(text.to_string())
}

fn key(token: Token<'_>, word: &str) -> Result<String, SelectorError> {
    checked("key", word, token.pos, SELECTOR_KEY_BYTES_MAX)
}

fn value(token: Token<'_>, word: &str) -> Result<String, SelectorError> {
    checked("value", word, token.pos, SELECTOR_VALUE_BYTES_MAX)
}

struct Parser<'a> {
    tokens: Vec<Token<'a>>,
    /// The next token; never past the final `End`.
    at: usize,
}

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Parser<'a> {
        Parser {
            tokens: lex(text),
            at: 0,
        }
    }

    fn peek(&self) -> Token<'a> {
        // `lex` always ends with `End` and `bump` never moves past it.
        self.tokens.get(self.at).copied().unwrap_or(Token {
            kind: Kind::End,
            pos: 0,
        })
    }

    /// Takes the next token; at the end, keeps answering `End`.
    fn bump(&mut self) -> Token<'a> {
        let token = self.peek();
        if token.kind != Kind::End {
            self.at += 1;
        }
        token
    }

    fn requirement(&mut self) -> Result<Requirement, SelectorError> {
        let first = self.bump();
        match first.kind {
            Kind::Bang => {
                let token = self.bump();
                match token.kind {
                    Kind::Word(word) => Ok(Requirement::NotExists {
                        key: key(token, word)?,
                    }),
                    _ => Err(error(
                        token.pos,
                        format!("expected a key after \"!\", found {}", describe(token)),
                    )),
                }
            }
            Kind::Word(word) => {
                let key = key(first, word)?;
                self.after_key(key)
            }
            Kind::Comma | Kind::End => Err(error(first.pos, "empty requirement")),
            _ => Err(error(
                first.pos,
                format!(
                    "expected a key or \"!\" and a key to start a requirement, found {}",
                    describe(first)
                ),
            )),
        }
    }

    fn after_key(&mut self, key: String) -> Result<Requirement, SelectorError> {
        let operator = self.peek();
        match operator.kind {
            Kind::Comma | Kind::End => Ok(Requirement::Exists { key }),
            Kind::Equals | Kind::DoubleEquals | Kind::NotEquals => {
                self.bump();
                let token = self.peek();
                let value = match token.kind {
                    Kind::Word(word) => {
                        self.bump();
                        value(token, word)?
                    }
                    Kind::Comma | Kind::End => String::new(),
                    _ => {
                        return Err(error(
                            token.pos,
                            format!(
                                "expected a value after {}, found {}",
                                describe(operator),
                                describe(token)
                            ),
                        ))
                    }
                };
                Ok(if operator.kind == Kind::NotEquals {
                    Requirement::NotEquals { key, value }
                } else {
                    Requirement::Equals { key, value }
                })
            }
            Kind::Word(word @ ("in" | "notin")) => {
                self.bump();
                let values = self.values(word)?;
                Ok(if word == "in" {
                    Requirement::In { key, values }
                } else {
                    Requirement::NotIn { key, values }
                })
            }
            _ => Err(error(
                operator.pos,
                format!(
                    "expected an operator (\"=\", \"==\", \"!=\", \"in\" or \"notin\"), \",\" or the end \
                     of the selector after key {}, found {}",
                    quote(&key),
                    describe(operator)
                ),
            )),
        }
    }

    /// The `(v1, v2)` after `in` or `notin` (`operator`).
    fn values(&mut self, operator: &str) -> Result<BTreeSet<String>, SelectorError> {
        let open = self.bump();
        if open.kind != Kind::Open {
            return Err(error(
                open.pos,
                format!(
                    "expected \"(\" after \"{operator}\", found {}",
                    describe(open)
                ),
            ));
        }
        let mut values = BTreeSet::new();
        // The token before the next one: "(" or "," (a value is due) or a value.
        let mut previous = open;
        loop {
            let token = self.bump();
            let value_due = matches!(previous.kind, Kind::Open | Kind::Comma);
            match token.kind {
                Kind::End => {
                    return Err(error(token.pos, "unclosed \"(\" (expected \")\")"));
                }
                Kind::Word(word) if value_due => {
                    values.insert(value(token, word)?);
                }
                Kind::Close if previous.kind == Kind::Open => {
                    return Err(error(
                        token.pos,
                        format!("\"{operator}\" needs at least one value, found \"()\""),
                    ));
                }
                _ if value_due => {
                    return Err(error(
                        token.pos,
                        format!(
                            "expected a value after {}, found {}",
                            describe(previous),
                            describe(token)
                        ),
                    ));
                }
                Kind::Comma => {}
                Kind::Close => return Ok(values),
                _ => {
                    return Err(error(
                        token.pos,
                        format!(
                            "expected \",\" or \")\" after value {}, found {}",
                            describe(previous),
                            describe(token)
                        ),
                    ));
                }
            }
            previous = token;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    /// (input, Ok(canonical form) or Err(a substring of the error's Display)).
    const PARSES: &[(&str, Result<&str, &str>)] = &[
        // Empty and blank: the empty selector.
        ("", Ok("")),
        (" \t\r\n ", Ok("")),
        // The example, canonical and spaced out.
        (
            "app=web,tier!=db,env in (prod,staging),!canary",
            Ok("app=web,tier!=db,env in (prod,staging),!canary"),
        ),
        (
            "  app = web ,\ttier != db , env in ( staging , prod ) , ! canary  ",
            Ok("app=web,tier!=db,env in (prod,staging),!canary"),
        ),
        // Each operator.
        ("a=b", Ok("a=b")),
        ("a==b", Ok("a=b")),
        ("a!=b", Ok("a!=b")),
        ("a in (x)", Ok("a in (x)")),
        ("a in(x)", Ok("a in (x)")),
        ("a\nin\n(\nx\n)", Ok("a in (x)")),
        ("a notin (y, x, y)", Ok("a notin (x,y)")),
        ("a in (b,a,c,a)", Ok("a in (a,b,c)")),
        ("a", Ok("a")),
        ("!a", Ok("!a")),
        ("! a", Ok("!a")),
        // Empty values for = and !=.
        ("a=", Ok("a=")),
        ("a==", Ok("a=")),
        ("a!=", Ok("a!=")),
        ("a=,b!=,c", Ok("a=,b!=,c")),
        ("a = , b", Ok("a=,b")),
        // Requirements keep their order, duplicates included.
        ("b,a=1,a=1", Ok("b,a=1,a=1")),
        // "in" and "notin" are keys and values too.
        ("in=notin", Ok("in=notin")),
        ("in in (in,notin)", Ok("in in (in,notin)")),
        ("notin notin (in)", Ok("notin notin (in)")),
        ("!in,notin", Ok("!in,notin")),
        // Key and value characters.
        ("example.com/app=v1.2_3-x", Ok("example.com/app=v1.2_3-x")),
        ("café=thé,日本 in (語)", Ok("café=thé,日本 in (語)")),
        ("a=*:;@#$%^&*[]{}<>?/\\|\"'`~+", Ok("a=*:;@#$%^&*[]{}<>?/\\|\"'`~+")),
        // Empty requirements and trailing commas.
        (",", Err("at byte 0: empty requirement")),
        (",a", Err("at byte 0: empty requirement")),
        ("a,,b", Err("at byte 2: empty requirement")),
        ("a, ,b", Err("at byte 3: empty requirement")),
        ("a,", Err("at byte 1: trailing \",\"")),
        ("a=b, ", Err("at byte 3: trailing \",\"")),
        ("a in (x),", Err("at byte 8: trailing \",\"")),
        // Missing or misplaced values.
        ("app=(x)", Err("at byte 4: expected a value after \"=\", found \"(\"")),
        ("a=!b", Err("at byte 2: expected a value after \"=\", found \"!\"")),
        ("a= =b", Err("at byte 3: expected a value after \"=\", found \"=\"")),
        ("a!=)", Err("at byte 3: expected a value after \"!=\", found \")\"")),
        ("a=b=c", Err("at byte 3: expected \",\" or the end of the selector after requirement \"a=b\", found \"=\"")),
        ("a=b c", Err("at byte 4: expected \",\" or the end of the selector after requirement \"a=b\", found \"c\"")),
        ("!a=b", Err("at byte 2: expected \",\" or the end of the selector after requirement \"!a\"")),
        ("a in (x) y", Err("at byte 9: expected \",\" or the end of the selector")),
        // Missing keys and operators.
        ("!", Err("at byte 1: expected a key after \"!\", found the end of the selector")),
        ("!!a", Err("at byte 1: expected a key after \"!\", found \"!\"")),
        ("!=a", Err("at byte 0: expected a key or \"!\" and a key to start a requirement, found \"!=\"")),
        ("=a", Err("at byte 0: expected a key")),
        ("(a)", Err("at byte 0: expected a key")),
        ("a b", Err("at byte 2: expected an operator (\"=\", \"==\", \"!=\", \"in\" or \"notin\"), \",\" or the end of the selector after key \"a\", found \"b\"")),
        ("a IN (x)", Err("at byte 2: expected an operator")),
        ("a (x)", Err("at byte 2: expected an operator")),
        ("a!b", Err("at byte 1: expected an operator")),
        // Value sets.
        ("env in prod", Err("at byte 7: expected \"(\" after \"in\", found \"prod\"")),
        ("env notin", Err("at byte 9: expected \"(\" after \"notin\", found the end of the selector")),
        ("a in (x,y", Err("at byte 9: unclosed \"(\" (expected \")\")")),
        ("a in (", Err("at byte 6: unclosed \"(\"")),
        ("a in (x,", Err("at byte 8: unclosed \"(\"")),
        ("a in ()", Err("at byte 6: \"in\" needs at least one value")),
        ("a notin ( )", Err("at byte 10: \"notin\" needs at least one value")),
        ("a in (x,)", Err("at byte 8: expected a value after \",\", found \")\"")),
        ("a in (,x)", Err("at byte 6: expected a value after \"(\", found \",\"")),
        ("a in (x,,y)", Err("at byte 8: expected a value after \",\", found \",\"")),
        ("a in (x y)", Err("at byte 8: expected \",\" or \")\" after value \"x\", found \"y\"")),
        ("a in (x=y)", Err("at byte 7: expected \",\" or \")\" after value \"x\", found \"=\"")),
        ("a in ((x))", Err("at byte 6: expected a value after \"(\", found \"(\"")),
        // Control characters, at their own offset.
        ("a\u{0}=b", Err("at byte 1: key \"a\\0\" holds the control character U+0000")),
        ("a=b\u{7}", Err("at byte 3: value \"b\\u{7}\" holds the control character U+0007")),
        ("é in (x\u{1b})", Err("at byte 8: value \"x\\u{1b}\" holds the control character U+001B")),
        ("!\u{7f}", Err("at byte 1: key \"\\u{7f}\" holds the control character U+007F")),
    ];

    #[test]
    fn parse_table() {
        for (input, expected) in PARSES {
            let parsed = Selector::parse(input);
            match (expected, &parsed) {
                (Ok(canonical), Ok(selector)) => {
                    assert_eq!(selector.to_string(), *canonical, "input {input:?}");
                    assert_eq!(selector.is_empty(), canonical.is_empty(), "input {input:?}");
                    assert_eq!(
                        Selector::parse(canonical).as_ref(),
                        Ok(selector),
                        "canonical form of {input:?}"
                    );
                }
                (Err(wanted), Err(e)) => {
                    let shown = e.to_string();
                    assert!(
                        shown.contains(wanted),
                        "input {input:?}: error {shown:?} does not contain {wanted:?}"
                    );
                    assert!(shown.starts_with(&format!("at byte {}: ", e.position)));
                    assert!(input.is_char_boundary(e.position), "input {input:?}: {e:?}");
                }
                _ => panic!("input {input:?}: expected {expected:?}, got {parsed:?}"),
            }
        }
    }

    #[test]
    fn the_example_parses_to_its_requirements() {
        let selector: Selector = "app=web,tier!=db,env in (staging, prod),!canary"
            .parse()
            .unwrap();
        let set = |values: &[&str]| values.iter().map(|v| v.to_string()).collect();
        assert_eq!(
            selector.requirements(),
            [
                Requirement::Equals {
                    key: "app".into(),
                    value: "web".into()
                },
                Requirement::NotEquals {
                    key: "tier".into(),
                    value: "db".into()
                },
                Requirement::In {
                    key: "env".into(),
                    values: set(&["prod", "staging"])
                },
                Requirement::NotExists {
                    key: "canary".into()
                },
            ]
        );
        assert_eq!(
            selector.to_string(),
            "app=web,tier!=db,env in (prod,staging),!canary"
        );
        assert_eq!(
            Selector::parse("env in prod").unwrap_err().to_string(),
            "at byte 7: expected \"(\" after \"in\", found \"prod\""
        );
    }

    const EXAMPLE: &str = "app=web,tier!=db,env in (prod,staging),!canary";

    /// Metadata entries, (key, value).
    type Entries = &'static [(&'static str, &'static str)];

    /// (selector, metadata, matches?).
    const MATCHES: &[(&str, Entries, bool)] = &[
        (EXAMPLE, &[("app", "web"), ("env", "prod")], true),
        (
            EXAMPLE,
            &[("app", "web"), ("tier", "frontend"), ("env", "staging")],
            true,
        ),
        (
            EXAMPLE,
            &[("app", "web"), ("tier", "db"), ("env", "prod")],
            false,
        ),
        (EXAMPLE, &[("app", "web"), ("env", "dev")], false),
        (EXAMPLE, &[("app", "web")], false),
        (EXAMPLE, &[("app", "api"), ("env", "prod")], false),
        (
            EXAMPLE,
            &[("app", "web"), ("env", "prod"), ("canary", "")],
            false,
        ),
        (
            EXAMPLE,
            &[("app", "web"), ("env", "prod"), ("Canary", "1")],
            true,
        ),
        (EXAMPLE, &[], false),
        // The empty selector matches everything.
        ("", &[], true),
        (" ", &[("a", "b")], true),
        // Existence; an empty value is present.
        ("a", &[], false),
        ("a", &[("a", "")], true),
        ("a", &[("b", "a")], false),
        ("!a", &[], true),
        ("!a", &[("a", "")], false),
        // Equality needs the key; inequality matches it absent.
        ("a=x", &[("a", "x")], true),
        ("a=x", &[("a", "X")], false),
        ("a=x", &[], false),
        ("a==x", &[("a", "x")], true),
        ("a!=x", &[], true),
        ("a!=x", &[("a", "y")], true),
        ("a!=x", &[("a", "x")], false),
        ("a=", &[], false),
        ("a=", &[("a", "")], true),
        ("a=", &[("a", "x")], false),
        ("a!=", &[], true),
        ("a!=", &[("a", "")], false),
        ("a!=", &[("a", "x")], true),
        // Sets: in needs the key, notin matches it absent.
        ("a in (x,y)", &[("a", "y")], true),
        ("a in (x,y)", &[("a", "z")], false),
        ("a in (x,y)", &[], false),
        ("a notin (x,y)", &[], true),
        ("a notin (x,y)", &[("a", "z")], true),
        ("a notin (x,y)", &[("a", "x")], false),
        // Every requirement must hold.
        ("a=x,a=y", &[("a", "x")], false),
        ("a=x,a!=y", &[("a", "x")], true),
        ("a,b", &[("a", "1")], false),
        ("a,b", &[("a", "1"), ("b", "2")], true),
        ("in=notin", &[("in", "notin")], true),
    ];

    #[test]
    fn matches_table() {
        for (text, entries, expected) in MATCHES {
            let selector = Selector::parse(text).unwrap();
            let metadata: BTreeMap<String, String> = entries
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            assert_eq!(
                selector.matches(&metadata),
                *expected,
                "{text:?} on {entries:?}"
            );
            let hashed: HashMap<&str, &str> = entries.iter().copied().collect();
            assert_eq!(
                selector.matches_lookup(|key| hashed.get(key).copied()),
                *expected,
                "{text:?} on {entries:?} (lookup)"
            );
        }
    }

    #[test]
    fn matches_takes_a_resources_metadata() {
        let mut resource = cairn_proto::v1::Resource::default();
        let selector = Selector::parse("app=web").unwrap();
        assert!(!selector.matches(&resource.metadata));
        resource.metadata.insert("app".into(), "web".into());
        assert!(selector.matches(&resource.metadata));
    }

    #[test]
    fn limits_are_enforced_and_named() {
        // Keys and values: up to 256 bytes.
        let long = "k".repeat(SELECTOR_KEY_BYTES_MAX);
        assert!(Selector::parse(&long).is_ok());
        assert!(Selector::parse(&format!("a={long}")).is_ok());
        let e = Selector::parse(&format!("{long}k=v")).unwrap_err();
        assert_eq!(e.position, 0);
        assert!(
            e.message
                .contains("is 257 bytes, more than the limit of 256"),
            "{e}"
        );
        let e = Selector::parse(&format!("a in (x,{long}v)")).unwrap_err();
        assert_eq!(e.position, 8);
        assert!(e.message.starts_with("value \""), "{e}");

        // The text: up to SELECTOR_BYTES_MAX bytes, blanks included.
        let sixteen_keys = vec!["k".repeat(255); 16].join(",");
        let full = format!("{sixteen_keys} ");
        assert_eq!(full.len(), SELECTOR_BYTES_MAX);
        assert_eq!(Selector::parse(&full).unwrap().requirements().len(), 16);
        let e = Selector::parse(&format!("{full} ")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "at byte 0: the selector is 4097 bytes, more than the limit SELECTOR_BYTES_MAX = 4096"
        );
        assert!(Selector::parse(&" ".repeat(SELECTOR_BYTES_MAX + 1)).is_err());

        // Requirements: up to SELECTOR_REQUIREMENTS_MAX.
        let many = vec!["a"; SELECTOR_REQUIREMENTS_MAX].join(",");
        assert_eq!(
            Selector::parse(&many).unwrap().requirements().len(),
            SELECTOR_REQUIREMENTS_MAX
        );
        let e = Selector::parse(&format!("{many},b")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "at byte 128: more than the limit SELECTOR_REQUIREMENTS_MAX = 64 requirements"
        );

        // The canonical form too: 64 × "key in(v)" fits in 4095 bytes, but
        // its canonical form (with " in (") would take 4159.
        let tight: Vec<String> = (0..SELECTOR_REQUIREMENTS_MAX)
            .map(|i| format!("{:057} in(v)", i))
            .collect();
        let tight = tight.join(",");
        assert_eq!(tight.len(), 4095);
        let e = Selector::parse(&tight).unwrap_err();
        assert!(e.message.contains("canonical form"), "{e}");
        assert!(e.message.contains("SELECTOR_BYTES_MAX = 4096"), "{e}");
        // One requirement fewer fits.
        let fewer = tight.rsplit_once(',').unwrap().0;
        let selector = Selector::parse(fewer).unwrap();
        assert!(selector.to_string().len() <= SELECTOR_BYTES_MAX);
        assert_eq!(Selector::parse(&selector.to_string()), Ok(selector));
    }

    #[test]
    fn hostile_inputs_never_panic() {
        let samples = [
            EXAMPLE,
            "  app = web ,\ttier != db , env in ( staging , prod ) , ! canary  ",
            "a in (x,,y)",
            "é日本=語\u{0}!(),==!=",
            "!!!!====((((,,,,))))",
            "a\u{85}in\u{a0}(\u{2028}x)",
        ];
        for sample in samples {
            for (i, _) in sample.char_indices().chain([(sample.len(), ' ')]) {
                check_any(&sample[..i]);
                check_any(&sample[i..]);
            }
        }
        for big in [
            "(".repeat(5000),
            "(".repeat(SELECTOR_BYTES_MAX),
            ",".repeat(SELECTOR_BYTES_MAX),
            "!".repeat(SELECTOR_BYTES_MAX),
            "é".repeat(SELECTOR_BYTES_MAX / 2),
            format!("a in ({}", "x,".repeat(2000)),
            format!("a in ({})", vec!["x"; 2000].join(",")),
            vec!["a=b"; 1000].join(","),
        ] {
            check_any(&big);
        }
    }

    /// Whatever `text` is: no panic; an error points inside the text at a
    /// char boundary; a selector round-trips through its canonical form.
    fn check_any(text: &str) {
        match Selector::parse(text) {
            Ok(selector) => {
                let canonical = selector.to_string();
                assert!(canonical.len() <= SELECTOR_BYTES_MAX, "{text:?}");
                assert_eq!(
                    Selector::parse(&canonical).as_ref(),
                    Ok(&selector),
                    "{text:?}"
                );
                assert_eq!(selector.is_empty(), canonical.is_empty());
            }
            Err(e) => {
                assert!(e.position <= text.len(), "{text:?}: {e:?}");
                assert!(text.is_char_boundary(e.position), "{text:?}: {e:?}");
                assert!(!e.message.is_empty());
            }
        }
    }

    fn key_strategy() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-zA-Z0-9._/é語-]{1,12}",
            Just("in".to_string()),
            Just("notin".to_string()),
        ]
    }

    fn value_strategy(min: usize) -> impl Strategy<Value = String> {
        prop_oneof![
            proptest::string::string_regex(&format!("[a-z0-9._:*é-]{{{min},8}}")).unwrap(),
            Just("in".to_string()),
            Just("notin".to_string()),
        ]
    }

    fn requirement_strategy() -> impl Strategy<Value = Requirement> {
        let set = || proptest::collection::btree_set(value_strategy(1), 1..4);
        prop_oneof![
            (key_strategy(), value_strategy(0))
                .prop_map(|(key, value)| Requirement::Equals { key, value }),
            (key_strategy(), value_strategy(0))
                .prop_map(|(key, value)| Requirement::NotEquals { key, value }),
            (key_strategy(), set()).prop_map(|(key, values)| Requirement::In { key, values }),
            (key_strategy(), set()).prop_map(|(key, values)| Requirement::NotIn { key, values }),
            key_strategy().prop_map(|key| Requirement::Exists { key }),
            key_strategy().prop_map(|key| Requirement::NotExists { key }),
        ]
    }

    /// Text made of the grammar's pieces, so that it often nearly parses.
    fn token_soup() -> impl Strategy<Value = String> {
        let piece = prop::sample::select(vec![
            "a", "b", "é", "in", "notin", "=", "==", "!=", "!", "(", ")", ",", " ", "\t", "\u{0}",
            "\u{a0}", "x,y",
        ]);
        proptest::collection::vec(piece, 0..24).prop_map(|pieces| pieces.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 512,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        #[test]
        fn display_round_trips(requirements in proptest::collection::vec(requirement_strategy(), 0..8)) {
            let selector = Selector { requirements };
            let canonical = selector.to_string();
            prop_assert_eq!(
                canonical.len(),
                selector.requirements.iter().map(Requirement::canonical_len).sum::<usize>()
                    + selector.requirements.len().saturating_sub(1)
            );
            prop_assert_eq!(Selector::parse(&canonical), Ok(selector));
        }

        #[test]
        fn arbitrary_strings_never_panic(text in any::<String>()) {
            check_any(&text);
        }

        #[test]
        fn token_soup_never_panics_and_round_trips(text in token_soup()) {
            check_any(&text);
        }
    }
}
