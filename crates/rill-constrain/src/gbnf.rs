//! llama.cpp's GBNF grammars, lowered to llguidance's Lark syntax.
//!
//! GBNF (`name ::= alternatives`, rule `root` first to match) describes text character by
//! character: literals `"..."`, classes `[a-z]` / `[^"]`, any character `.`, groups, and the
//! postfixes `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}`, `{,n}`. Each becomes its Lark counterpart
//! (a class is a one-character regex), so the language is unchanged. What has no counterpart
//! (llama.cpp's token references `<[id]>`, `<name>`, `!<...>`) is refused with its position.
//! As in llama.cpp, a rule's alternatives may continue on the next line only after `|` or
//! inside parentheses; `#` starts a comment.

use std::collections::{HashMap, HashSet};
use std::fmt::Write;

use crate::ConstraintError;

/// Largest count a `{m,n}` may name (the grammar grows with it).
const MAX_REPEAT: u32 = 10_000;

#[derive(Debug, Clone)]
enum Expr {
    Alt(Vec<Expr>),
    Seq(Vec<Expr>),
    Lit(String),
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
    Any,
    Ref(String),
    Repeat {
        inner: Box<Expr>,
        min: u32,
        max: Option<u32>,
    },
}

struct Parser {
    chars: Vec<char>,
    pos: usize,
}

/// The Lark grammar of GBNF `src`, starting at its `root` rule.
pub(crate) fn to_lark(src: &str) -> Result<String, ConstraintError> {
    let mut p = Parser {
        chars: src.chars().collect(),
        pos: 0,
    };
    let rules = p.grammar()?;
    let known: HashSet<&str> = rules.iter().map(|(n, _)| n.as_str()).collect();
    if !known.contains("root") {
        return Err(ConstraintError::Gbnf {
            line: 1,
            column: 1,
            message: "the grammar has no `root` rule".into(),
        });
    }
    for (name, body) in &rules {
        if let Some(missing) = first_undefined(body, &known) {
            return Err(p.error_at(
                0,
                format!("rule `{name}` refers to `{missing}`, which is not defined"),
            ));
        }
    }
    let names = lark_names(rules.iter().map(|(n, _)| n.as_str()));
    let mut out = String::new();
    let _ = writeln!(out, "start: {}", names["root"]);
    for (name, body) in &rules {
        let _ = writeln!(out, "{}: {}", names[name.as_str()], render(body, &names, 0));
    }
    Ok(out)
}

/// Lark rule names (lower case, `_` for anything but letters and digits, prefixed so no name
/// clashes with a keyword), distinct even where two GBNF names map to the same text.
fn lark_names<'a>(names: impl Iterator<Item = &'a str>) -> HashMap<&'a str, String> {
    let mut taken = HashSet::new();
    let mut out = HashMap::new();
    for name in names {
        let base: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .collect();
        let mut candidate = format!("g_{base}");
        let mut k = 2;
        while !taken.insert(candidate.clone()) {
            candidate = format!("g_{base}_{k}");
            k += 1;
        }
        out.insert(name, candidate);
    }
    out
}

fn first_undefined<'e>(e: &'e Expr, known: &HashSet<&str>) -> Option<&'e str> {
    match e {
        Expr::Ref(n) if !known.contains(n.as_str()) => Some(n),
        Expr::Alt(v) | Expr::Seq(v) => v.iter().find_map(|x| first_undefined(x, known)),
        Expr::Repeat { inner, .. } => first_undefined(inner, known),
        _ => None,
    }
}

/// `e` in Lark syntax; `level` 0 at a rule's top, 1 inside a sequence, 2 under a postfix.
fn render(e: &Expr, names: &HashMap<&str, String>, level: u8) -> String {
    match e {
        Expr::Alt(alts) => {
            let (empty, full): (Vec<&Expr>, Vec<&Expr>) = alts.iter().partition(|a| is_empty(a));
            let body = full
                .iter()
                .map(|a| render(a, names, 0))
                .collect::<Vec<_>>()
                .join(" | ");
            if full.is_empty() {
                "\"\"".into()
            } else if !empty.is_empty() {
                format!("({body})?")
            } else if level > 0 && full.len() > 1 {
                format!("({body})")
            } else {
                body
            }
        }
        Expr::Seq(items) => {
            let items: Vec<&Expr> = items.iter().filter(|x| !is_empty(x)).collect();
            match items.len() {
                0 => "\"\"".into(),
                1 => render(items[0], names, level),
                _ => {
                    let body = items
                        .iter()
                        .map(|x| render(x, names, 1))
                        .collect::<Vec<_>>()
                        .join(" ");
                    if level == 2 {
                        format!("({body})")
                    } else {
                        body
                    }
                }
            }
        }
        Expr::Lit(s) => serde_json::to_string(s).unwrap_or_default(),
        Expr::Class { negated, ranges } => {
            let mut rx = String::from("/[");
            if *negated {
                rx.push('^');
            }
            for &(a, b) in ranges {
                let _ = write!(rx, "\\x{{{:X}}}", a as u32);
                if b != a {
                    let _ = write!(rx, "-\\x{{{:X}}}", b as u32);
                }
            }
            rx.push_str("]/");
            rx
        }
        Expr::Any => "/(?s:.)/".into(),
        Expr::Ref(n) => names[n.as_str()].clone(),
        Expr::Repeat { inner, min, max } => {
            let body = render(inner, names, 2);
            match (min, max) {
                (0, None) => format!("{body}*"),
                (1, None) => format!("{body}+"),
                (0, Some(1)) => format!("{body}?"),
                (m, None) => format!("{body}{{{m}}} {body}*"),
                (m, Some(n)) if m == n => format!("{body}{{{m}}}"),
                (m, Some(n)) => format!("{body}{{{m},{n}}}"),
            }
        }
    }
}

/// Matches only the empty string (an empty literal or sequence).
fn is_empty(e: &Expr) -> bool {
    match e {
        Expr::Lit(s) => s.is_empty(),
        Expr::Seq(v) => v.iter().all(is_empty),
        _ => false,
    }
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

impl Parser {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn error_at(&self, pos: usize, message: String) -> ConstraintError {
        let before = &self.chars[..pos.min(self.chars.len())];
        let line = before.iter().filter(|&&c| c == '\n').count() + 1;
        let column = before.iter().rev().take_while(|&&c| c != '\n').count() + 1;
        ConstraintError::Gbnf {
            line,
            column,
            message,
        }
    }

    fn error(&self, message: impl Into<String>) -> ConstraintError {
        self.error_at(self.pos, message.into())
    }

    /// Skips blanks and comments, and line ends when `newlines`.
    fn space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' => self.pos += 1,
                '\r' | '\n' if newlines => self.pos += 1,
                '#' => {
                    while self.peek().is_some_and(|c| c != '\n' && c != '\r') {
                        self.pos += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn grammar(&mut self) -> Result<Vec<(String, Expr)>, ConstraintError> {
        let mut rules: Vec<(String, Expr)> = Vec::new();
        let mut seen = HashSet::new();
        loop {
            self.space(true);
            if self.peek().is_none() {
                break;
            }
            let at = self.pos;
            let name = self.name()?;
            self.space(false);
            if !self.eat("::=") {
                return Err(self.error(format!("expected `::=` after rule name `{name}`")));
            }
            self.space(true);
            let body = self.alternatives(false)?;
            if !seen.insert(name.clone()) {
                return Err(self.error_at(at, format!("rule `{name}` is defined twice")));
            }
            rules.push((name, body));
            self.space(false);
            match self.peek() {
                None | Some('\n' | '\r') => {}
                Some(c) => return Err(self.error(format!("unexpected `{c}` after a rule"))),
            }
        }
        if rules.is_empty() {
            return Err(self.error("the grammar is empty"));
        }
        Ok(rules)
    }

    fn eat(&mut self, s: &str) -> bool {
        let n = s.chars().count();
        if self.chars[self.pos..].iter().take(n).copied().eq(s.chars()) {
            self.pos += n;
            true
        } else {
            false
        }
    }

    fn name(&mut self) -> Result<String, ConstraintError> {
        let start = self.pos;
        while self.peek().is_some_and(is_name_char) {
            self.pos += 1;
        }
        if start == self.pos {
            return Err(self.error(match self.peek() {
                Some(c) => format!("expected a rule name, found `{c}`"),
                None => "expected a rule name".into(),
            }));
        }
        Ok(self.chars[start..self.pos].iter().collect())
    }

    fn alternatives(&mut self, nested: bool) -> Result<Expr, ConstraintError> {
        let mut alts = vec![self.sequence(nested)?];
        while self.peek() == Some('|') {
            self.pos += 1;
            self.space(true);
            alts.push(self.sequence(nested)?);
        }
        Ok(if alts.len() == 1 {
            alts.pop().unwrap_or(Expr::Seq(Vec::new()))
        } else {
            Expr::Alt(alts)
        })
    }

    fn sequence(&mut self, nested: bool) -> Result<Expr, ConstraintError> {
        let mut items: Vec<Expr> = Vec::new();
        while let Some(c) = self.peek() {
            let item = match c {
                '"' => Expr::Lit(self.literal()?),
                '[' => self.class()?,
                '.' => {
                    self.pos += 1;
                    Expr::Any
                }
                '(' => {
                    self.pos += 1;
                    self.space(true);
                    let inner = self.alternatives(true)?;
                    self.space(true);
                    if self.peek() != Some(')') {
                        return Err(self.error("expected `)`"));
                    }
                    self.pos += 1;
                    inner
                }
                '*' | '+' | '?' | '{' => {
                    let Some(last) = items.pop() else {
                        return Err(self.error(format!("`{c}` with nothing before it to repeat")));
                    };
                    let (min, max) = self.postfix()?;
                    Expr::Repeat {
                        inner: Box::new(last),
                        min,
                        max,
                    }
                }
                '<' | '!' => {
                    return Err(self.error(
                        "token references (`<[id]>`, `<name>`, `!<...>`) are not supported; \
                         write the token's text instead",
                    ))
                }
                c if is_name_char(c) => Expr::Ref(self.name()?),
                _ => break,
            };
            items.push(item);
            self.space(nested);
        }
        Ok(if items.len() == 1 {
            items.pop().unwrap_or(Expr::Seq(Vec::new()))
        } else {
            Expr::Seq(items)
        })
    }

    fn postfix(&mut self) -> Result<(u32, Option<u32>), ConstraintError> {
        let c = self.peek().unwrap_or(' ');
        self.pos += 1;
        Ok(match c {
            '*' => (0, None),
            '+' => (1, None),
            '?' => (0, Some(1)),
            _ => {
                self.space(false);
                let min = self.number()?;
                self.space(false);
                let (min, max) = if self.peek() == Some(',') {
                    self.pos += 1;
                    self.space(false);
                    let max = self.number()?;
                    (min.unwrap_or(0), max)
                } else {
                    let Some(m) = min else {
                        return Err(self.error("expected a count in `{...}`"));
                    };
                    (m, Some(m))
                };
                self.space(false);
                if self.peek() != Some('}') {
                    return Err(self.error("expected `}`"));
                }
                self.pos += 1;
                if let Some(n) = max {
                    if n < min {
                        return Err(self
                            .error(format!("`{{{min},{n}}}`: the maximum is below the minimum")));
                    }
                }
                if max.unwrap_or(min) > MAX_REPEAT {
                    return Err(
                        self.error(format!("repetition counts are limited to {MAX_REPEAT}"))
                    );
                }
                (min, max)
            }
        })
    }

    fn number(&mut self) -> Result<Option<u32>, ConstraintError> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        if start == self.pos {
            return Ok(None);
        }
        let digits: String = self.chars[start..self.pos].iter().collect();
        digits
            .parse()
            .map(Some)
            .map_err(|_| self.error_at(start, format!("count {digits} is too large")))
    }

    fn literal(&mut self) -> Result<String, ConstraintError> {
        let start = self.pos;
        self.pos += 1;
        let mut s = String::new();
        loop {
            match self.peek() {
                None | Some('\n' | '\r') => {
                    return Err(self.error_at(start, "unterminated string literal".into()))
                }
                Some('"') => {
                    self.pos += 1;
                    return Ok(s);
                }
                Some(_) => s.push(self.char_in_literal()?),
            }
        }
    }

    /// One character of a literal or class, escapes decoded.
    fn char_in_literal(&mut self) -> Result<char, ConstraintError> {
        let at = self.pos;
        let c = self.peek().ok_or_else(|| self.error("unexpected end"))?;
        self.pos += 1;
        if c != '\\' {
            return Ok(c);
        }
        let e = self
            .peek()
            .ok_or_else(|| self.error("unexpected end after `\\`"))?;
        self.pos += 1;
        let hex = |p: &mut Parser, n: usize| -> Result<char, ConstraintError> {
            let digits: String = p.chars[p.pos..].iter().take(n).collect();
            if digits.len() != n || !digits.chars().all(|d| d.is_ascii_hexdigit()) {
                return Err(p.error_at(at, format!("`\\{e}` needs {n} hex digits")));
            }
            p.pos += n;
            u32::from_str_radix(&digits, 16)
                .ok()
                .and_then(char::from_u32)
                .ok_or_else(|| p.error_at(at, format!("`\\{e}{digits}` is not a character")))
        };
        Ok(match e {
            'x' => hex(self, 2)?,
            'u' => hex(self, 4)?,
            'U' => hex(self, 8)?,
            't' => '\t',
            'n' => '\n',
            'r' => '\r',
            '\\' | '"' | '[' | ']' | '-' | '^' | '/' => e,
            _ => return Err(self.error_at(at, format!("unknown escape `\\{e}`"))),
        })
    }

    fn class(&mut self) -> Result<Expr, ConstraintError> {
        let start = self.pos;
        self.pos += 1;
        let negated = self.peek() == Some('^');
        if negated {
            self.pos += 1;
        }
        let mut ranges = Vec::new();
        loop {
            match self.peek() {
                None => return Err(self.error_at(start, "unterminated character class".into())),
                Some(']') => {
                    self.pos += 1;
                    break;
                }
                Some(_) => {
                    let a = self.char_in_literal()?;
                    let b = match (self.peek(), self.chars.get(self.pos + 1)) {
                        (Some('-'), None) => {
                            return Err(self.error_at(start, "unterminated character class".into()))
                        }
                        (Some('-'), Some(&next)) if next != ']' => {
                            self.pos += 1;
                            self.char_in_literal()?
                        }
                        _ => a,
                    };
                    if b < a {
                        return Err(self.error(format!("range `{a}-{b}` is reversed")));
                    }
                    ranges.push((a, b));
                }
            }
        }
        if ranges.is_empty() && !negated {
            return Err(self.error_at(start, "empty character class".into()));
        }
        if ranges.is_empty() {
            return Ok(Expr::Any);
        }
        Ok(Expr::Class { negated, ranges })
    }
}
