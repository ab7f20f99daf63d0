//! The `tojson` filter as HF transformers overrides it for chat templates:
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`, i.e. Python's
//! `json` module output (no HTML escaping, Python's float repr, `", "` / `": "` separators by
//! default), not minijinja's or Jinja2's HTML-safe `tojson`.

use std::fmt::Write as _;

use minijinja::value::{Kwargs, Rest, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// Deeper nesting than this is refused (Python would hit its recursion limit near 1000).
const MAX_DEPTH: usize = 256;

struct Options {
    ensure_ascii: bool,
    /// `None`: one line. `Some(unit)`: a newline and `unit` repeated per level.
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

/// `value | tojson(ensure_ascii=False, indent=None, separators=None, sort_keys=False)`; the
/// arguments may also be given by position, in that order, as Python allows.
pub(super) fn tojson(value: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    const NAMES: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > NAMES.len() {
        return Err(Error::new(
            ErrorKind::TooManyArguments,
            "tojson takes at most 4 arguments besides the value",
        ));
    }
    let mut given: [Option<Value>; 4] = Default::default();
    for (slot, v) in given.iter_mut().zip(args.iter()) {
        *slot = Some(v.clone());
    }
    for (slot, name) in given.iter_mut().zip(NAMES) {
        if kwargs.has(name) {
            if slot.is_some() {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson got multiple values for argument {name:?}"),
                ));
            }
            *slot = Some(kwargs.get::<Value>(name)?);
        }
    }
    kwargs.assert_all_used()?;
    let [ensure_ascii, indent, separators, sort_keys] = given;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.kind() {
            // Python: an int is that many spaces (negative: none), a string is used as is.
            ValueKind::Number if v.is_integer() => {
                let n = i64::try_from(v.clone()).unwrap_or(0).clamp(0, 64) as usize;
                Some(" ".repeat(n))
            }
            ValueKind::String => Some(v.as_str().unwrap_or_default().to_string()),
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "tojson: indent must be an int or a string, not {}",
                        v.kind()
                    ),
                ))
            }
        },
    };
    let (item_sep, key_sep) = match separators {
        Some(v) if !v.is_none() => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => (
                    a.as_str().unwrap_or_default().to_string(),
                    b.as_str().unwrap_or_default().to_string(),
                ),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be two strings",
                    ))
                }
            }
        }
        // Python's defaults: no trailing space after "," when indenting.
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    let opts = Options {
        ensure_ascii: ensure_ascii.is_some_and(|v| v.is_true()),
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.is_some_and(|v| v.is_true()),
    };
    let mut out = String::new();
    write_value(&mut out, value, &opts, 0)?;
    Ok(Value::from(out))
}

fn not_serializable(v: &Value) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!(
            "tojson: object of type {} is not JSON serializable",
            v.kind()
        ),
    )
}

fn write_value(out: &mut String, v: &Value, opts: &Options, depth: usize) -> Result<(), Error> {
    if depth > MAX_DEPTH {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson: nesting too deep",
        ));
    }
    if out.len() > super::python::MAX_BUILT_STRING {
        return Err(super::python::too_large());
    }
    if matches!(
        v.kind(),
        ValueKind::Seq | ValueKind::Iterable | ValueKind::Map
    ) {
        super::python::check_size(v)?;
    }
    match v.kind() {
        _ if super::python::is_py_none(v) => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, v)?,
        ValueKind::String => write_string(out, v.as_str().unwrap_or_default(), opts.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            write_container(out, '[', ']', &items, opts, depth, |out, item, depth| {
                write_value(out, item, opts, depth)
            })?;
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            for key in v.try_iter()? {
                let value = v.get_item(&key)?;
                entries.push((key_string(&key)?, value));
            }
            if opts.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(
                out,
                '{',
                '}',
                &entries,
                opts,
                depth,
                |out, (k, val), depth| {
                    write_string(out, k, opts.ensure_ascii);
                    out.push_str(&opts.key_sep);
                    write_value(out, val, opts, depth)
                },
            )?;
        }
        // Undefined, bytes, functions, macros, plain objects: Python raises TypeError.
        _ => return Err(not_serializable(v)),
    }
    Ok(())
}

fn write_container<T>(
    out: &mut String,
    open: char,
    close: char,
    items: &[T],
    opts: &Options,
    depth: usize,
    mut each: impl FnMut(&mut String, &T, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    let newline = |out: &mut String, level: usize| {
        if let Some(unit) = &opts.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(unit);
            }
        }
    };
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&opts.item_sep);
        }
        newline(out, depth + 1);
        each(out, item, depth + 1)?;
    }
    newline(out, depth);
    out.push(close);
    Ok(())
}

/// A dict key as Python's json writes it: strings as they are, numbers, booleans and None
/// converted; anything else is a TypeError.
fn key_string(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_string()),
        ValueKind::None => Ok("null".to_string()),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.to_string()),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(&mut s, key)?;
            Ok(s)
        }
        _ => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "tojson: keys must be str, int, float, bool or None, not {}",
                key.kind()
            ),
        )),
    }
}

fn write_number(out: &mut String, v: &Value) -> Result<(), Error> {
    if v.is_integer() {
        let n = i128::try_from(v.clone()).map_err(|_| not_serializable(v))?;
        let _ = write!(out, "{n}");
    } else {
        let f = f64::try_from(v.clone()).map_err(|_| not_serializable(v))?;
        out.push_str(&py_float_repr(f));
    }
    Ok(())
}

/// Python's `float.__repr__` (shortest round-trip digits; scientific notation below 1e-4 and
/// from 1e16), with json's spellings of the non-finite values.
pub(super) fn py_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_string();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.to_string();
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "-1.2345e-7", "1e16", "0e0".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let mut s = String::from(sign);
    if !(-4..16).contains(&exp) {
        s.push_str(&digits[..1]);
        if digits.len() > 1 {
            s.push('.');
            s.push_str(&digits[1..]);
        }
        let _ = write!(s, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    } else if exp < 0 {
        s.push_str("0.");
        for _ in 0..(-exp - 1) {
            s.push('0');
        }
        s.push_str(&digits);
    } else {
        let point = exp as usize + 1;
        if digits.len() > point {
            s.push_str(&digits[..point]);
            s.push('.');
            s.push_str(&digits[point..]);
        } else {
            s.push_str(&digits);
            for _ in digits.len()..point {
                s.push('0');
            }
            s.push_str(".0");
        }
    }
    s
}

/// A JSON string as Python's `json` writes it.
fn write_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && (c as u32) > 0x7e => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_like_python() {
        // repr(x) in CPython for each x.
        for (f, want) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1e16, "1e+16"),
            (1.5e-7, "1.5e-07"),
            (0.0001, "0.0001"),
            (123456789012345678.0, "1.2345678901234568e+17"),
            (1e15, "1000000000000000.0"),
            (2.71, "2.71"),
            (1e-5, "1e-05"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-Infinity"),
        ] {
            assert_eq!(py_float_repr(f), want, "{f}");
        }
    }

    #[test]
    fn strings_like_python() {
        let mut s = String::new();
        write_string(&mut s, "a\"b\\c\nd\u{1}é😀<&>'", false);
        assert_eq!(s, r#""a\"b\\c\nd\u0001é😀<&>'""#);
        let mut s = String::new();
        write_string(&mut s, "é😀\u{7f}", true);
        assert_eq!(s, "\"\\u00e9\\ud83d\\ude00\\u007f\"");
    }
}
