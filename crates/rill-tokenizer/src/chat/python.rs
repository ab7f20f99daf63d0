//! Where minijinja's defaults differ from Jinja2's (which follow Python), the Python behaviour,
//! as HF transformers' chat templates see it:
//! * printed lists and dicts look like Python's `str()` (`['a', None]`, `{'k': 1.0}`), not JSON;
//! * `none` is not iterable and has no length (minijinja treats it as an empty sequence), and the
//!   `tools` / `documents` that transformers passes as `None` are a [`PyNone`], which, unlike
//!   minijinja's none, fails in a `for` loop as Python's does;
//! * an undefined value has length 0, and `select`, `reject`, `selectattr`, `rejectattr` and
//!   `map` give nothing for a false value (Jinja2 checks `if value:` before iterating), so
//!   `tools | selectattr(...)` works when `tools` is none;
//! * `join` takes Jinja2's `attribute` argument and writes items as Python's `str()`; `title`
//!   starts a word only after whitespace, `-`, `(`, `{`, `[` or `<` (Jinja2's rule);
//! * `round` rounds half to even (Python's `round`) and takes Jinja2's `method` argument;
//! * `int` and `float` give their `default` (0) for what Python cannot convert, as Jinja2 does;
//! * the tests `sequence` (strings and dicts are sequences), `number` (booleans are numbers),
//!   `iterable` and `none` follow Jinja2.

use std::fmt::{self, Write as _};
use std::sync::{Arc, OnceLock};

use minijinja::value::{Kwargs, Object, ObjectRepr, Rest, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Output, State, Value};

use super::json::py_float_repr;

/// Python's `None` where transformers passes it as a variable (`tools`, `documents`): false,
/// printed `None`, `is none`, serialized `null`, and, as in Python, not iterable (a `for` over it
/// or its `length` is an error).
#[derive(Debug)]
pub(super) struct PyNone;

impl Object for PyNone {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Plain
    }

    fn is_true(self: &Arc<Self>) -> bool {
        false
    }

    fn render(self: &Arc<Self>, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("None")
    }
}

/// `None` as the variable value transformers passes.
pub(super) fn py_none() -> Value {
    Value::from_object(PyNone)
}

/// Python's `None`: minijinja's none or a [`PyNone`].
pub(super) fn is_py_none(v: &Value) -> bool {
    v.is_none() || v.downcast_object_ref::<PyNone>().is_some()
}

/// Installs the formatter, tests and filters of this module.
pub(super) fn install(env: &mut Environment<'_>) {
    env.set_formatter(format_value);
    env.add_test("none", |v: &Value| is_py_none(v));
    env.add_test("iterable", |v: &Value| {
        !is_py_none(v) && v.kind() != ValueKind::Plain && v.try_iter().is_ok()
    });
    env.add_test("sequence", |v: &Value| {
        matches!(
            v.kind(),
            ValueKind::String | ValueKind::Seq | ValueKind::Map
        )
    });
    env.add_test("number", |v: &Value| {
        matches!(v.kind(), ValueKind::Number | ValueKind::Bool)
    });
    env.add_filter("length", length);
    env.add_filter("count", length);
    env.add_filter("string", |v: &Value| py_str(v).map(Value::from));
    env.add_filter("round", round);
    env.add_filter("join", join);
    env.add_filter("title", title);
    env.add_filter("int", to_int);
    env.add_filter("float", to_float);
    env.add_filter("indent", indent);
    install_size_guards(env);
    env.add_filter("replace", replace_filter);
    env.add_filter("format", format_filter);
    for (name, builtin) in [
        ("select", Value::from_function(minijinja::filters::select)),
        ("reject", Value::from_function(minijinja::filters::reject)),
        (
            "selectattr",
            Value::from_function(minijinja::filters::selectattr),
        ),
        (
            "rejectattr",
            Value::from_function(minijinja::filters::rejectattr),
        ),
        ("map", Value::from_function(minijinja::filters::map)),
    ] {
        env.add_filter(
            name,
            move |state: &State, value: Value, args: Rest<Value>| -> Result<Value, Error> {
                if !value.is_true() {
                    return Ok(Value::from(Vec::<Value>::new()));
                }
                check_size(&value)?;
                let mut all = Vec::with_capacity(args.len() + 1);
                all.push(value);
                all.extend(args.iter().cloned());
                builtin.call(state, &all)
            },
        );
    }
}

/// Python's string methods (minijinja-contrib's), with the ones that copy or split a whole
/// string refused when the result would pass [`MAX_BUILT_STRING`] bytes or [`MAX_ITEMS`]
/// pieces.
pub(super) fn string_method(
    state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let Some(s) = value.as_str() {
        match method {
            "replace" => {
                if let (Some(from), Some(to)) = (
                    args.first().and_then(Value::as_str),
                    args.get(1).and_then(Value::as_str),
                ) {
                    check_replace(s, from, to)?;
                }
            }
            "format" => check_format_widths(s, args)?,
            "ljust" | "rjust" | "center" | "zfill" => {
                if let Some(n) = args.first().and_then(|v| i64::try_from(v.clone()).ok()) {
                    if n > MAX_FORMAT_WIDTH {
                        return Err(width_too_large(n));
                    }
                }
            }
            "split" | "rsplit" | "splitlines" => {
                // The pieces the split makes, counted without making them.
                let pieces = match args.first().and_then(Value::as_str) {
                    Some(sep) if method != "splitlines" && !sep.is_empty() => {
                        s.matches(sep).count()
                    }
                    _ if method == "splitlines" => s.lines().count(),
                    _ => s.split_whitespace().count(),
                };
                if pieces > MAX_ITEMS {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        format!("splitting into {pieces} pieces is too large for a chat template"),
                    ));
                }
            }
            _ => {}
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// The widest field `str.format` may pad to, and the most digits of precision: minijinja's
/// Python `format` allocates whatever a format spec asks (`'{:99999999999}'.format(1)` aborted
/// the process on the allocation; found by the chat-template fuzzer).
const MAX_FORMAT_WIDTH: i64 = 1 << 16;

fn width_too_large(n: i64) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("a format width or precision of {n} is too large for a chat template (at most {MAX_FORMAT_WIDTH})"),
    )
}

/// Checks every number in the format specs of `template` (after a field's `:`), and, when a
/// spec takes its width from an argument (`{:{}}`), every integer argument.
fn check_format_widths(template: &str, args: &[Value]) -> Result<(), Error> {
    let mut nested = false;
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        rest = &rest[open + 1..];
        if let Some(after) = rest.strip_prefix('{') {
            rest = after; // `{{` is a literal brace
            continue;
        }
        let end = rest.find('}').unwrap_or(rest.len());
        let field = &rest[..end];
        // minijinja's format parser slices fields by bytes and panics inside a multi-byte
        // character (found by the chat-template fuzzer): fields must be ASCII, and a field
        // with a nested brace or an index, which that parser may read past the field's first
        // `}` looking for the closing one, must have only ASCII after it.
        if !field.is_ascii() || field.contains(['{', '[']) && !rest.is_ascii() {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "format fields must be ASCII in a chat template",
            ));
        }
        if let Some((_, spec)) = field.split_once(':') {
            nested |= spec.contains('{') || rest[end..].starts_with("}}") && spec.is_empty();
            for digits in spec
                .split(|c: char| !c.is_ascii_digit())
                .filter(|d| !d.is_empty())
            {
                let n = digits.parse::<i64>().unwrap_or(i64::MAX);
                if n > MAX_FORMAT_WIDTH {
                    return Err(width_too_large(n));
                }
            }
        }
        rest = &rest[end.min(rest.len())..];
    }
    if nested || template.contains(":{") {
        for a in args {
            if let Ok(n) = i64::try_from(a.clone()) {
                if n > MAX_FORMAT_WIDTH {
                    return Err(width_too_large(n));
                }
            }
        }
    }
    Ok(())
}

/// The `format` filter (printf style, `'%5d' | format(x)`), minijinja's, with every width and
/// precision in the format, and every integer argument a `*` may take one from, bounded.
fn format_filter(state: &State, value: Value, args: Rest<Value>) -> Result<Value, Error> {
    if let Some(s) = value.as_str() {
        let mut chars = s.chars().peekable();
        let mut star = false;
        while let Some(c) = chars.next() {
            if c != '%' {
                continue;
            }
            let mut digits = String::new();
            while let Some(&d) = chars.peek() {
                if d.is_ascii_digit() || matches!(d, '-' | '+' | ' ' | '#' | '.' | '*') {
                    star |= d == '*';
                    digits.push(d);
                    chars.next();
                } else {
                    break;
                }
            }
            for n in digits
                .split(|c: char| !c.is_ascii_digit())
                .filter(|d| !d.is_empty())
            {
                let n = n.parse::<i64>().unwrap_or(i64::MAX);
                if n > MAX_FORMAT_WIDTH {
                    return Err(width_too_large(n));
                }
            }
        }
        if star {
            check_format_widths(":{", &args)?;
        }
    }
    let builtin = Value::from_function(minijinja::filters::format);
    let mut all = vec![value];
    all.extend(args.iter().cloned());
    builtin.call(state, &all)
}

/// Refuses a replacement whose result would pass [`MAX_BUILT_STRING`] bytes.
fn check_replace(s: &str, from: &str, to: &str) -> Result<(), Error> {
    if to.len() > from.len() {
        let count = if from.is_empty() {
            s.chars().count() + 1
        } else {
            s.matches(from).count()
        };
        let grown = count.saturating_mul(to.len() - from.len());
        if s.len().saturating_add(grown) > MAX_BUILT_STRING {
            return Err(too_large());
        }
    }
    Ok(())
}

/// `replace(old, new, count=None)`, minijinja's, behind [`check_replace`].
fn replace_filter(
    state: &State,
    value: Value,
    from: Value,
    to: Value,
    rest: Rest<Value>,
) -> Result<Value, Error> {
    if let (Some(s), Some(f), Some(t)) = (value.as_str(), from.as_str(), to.as_str()) {
        check_replace(s, f, t)?;
    }
    let builtin = Value::from_function(minijinja::filters::replace);
    let mut all = vec![value, from, to];
    all.extend(rest.iter().cloned());
    builtin.call(state, &all)
}

/// The builtin filters that walk or copy all of their input, each behind [`check_size`].
fn install_size_guards(env: &mut Environment<'_>) {
    use minijinja::filters as f;
    for (name, builtin) in [
        ("list", Value::from_function(f::list)),
        ("sort", Value::from_function(f::sort)),
        ("unique", Value::from_function(f::unique)),
        ("reverse", Value::from_function(f::reverse)),
        ("sum", Value::from_function(f::sum)),
        ("min", Value::from_function(f::min)),
        ("max", Value::from_function(f::max)),
        ("last", Value::from_function(f::last)),
        ("batch", Value::from_function(f::batch)),
        ("slice", Value::from_function(f::slice)),
        ("groupby", Value::from_function(f::groupby)),
        ("dictsort", Value::from_function(f::dictsort)),
        ("items", Value::from_function(f::items)),
    ] {
        env.add_filter(
            name,
            move |state: &State, value: Value, args: Rest<Value>| -> Result<Value, Error> {
                check_size(&value)?;
                let mut all = Vec::with_capacity(args.len() + 1);
                all.push(value);
                all.extend(args.iter().cloned());
                builtin.call(state, &all)
            },
        );
    }
}

/// Most items of a container a filter may walk, and characters of a string it may split: a
/// list multiplied by a huge number (minijinja repeats lazily, and counts no fuel while a
/// filter iterates) must fail here instead of taking minutes or gigabytes.
const MAX_ITEMS: usize = 1 << 20;
const MAX_CHARS: usize = 16 << 20;

pub(super) fn check_size(value: &Value) -> Result<(), Error> {
    let (n, limit) = match value.kind() {
        ValueKind::String => (value.len().unwrap_or(0), MAX_CHARS),
        _ => (value.len().unwrap_or(0), MAX_ITEMS),
    };
    if n > limit {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("a value of {n} items is too large for a chat template (at most {limit})"),
        ));
    }
    Ok(())
}

/// `indent(width=4, first=False, blank=False)` as Jinja2 writes it: the text gets a newline
/// appended before it is split into lines, so a trailing newline survives (minijinja's drops
/// it); `width` may be a string to indent with.
fn indent(
    value: String,
    width: Option<Value>,
    first: Option<bool>,
    blank: Option<bool>,
    kwargs: Kwargs,
) -> Result<String, Error> {
    let width = kwargs.get::<Option<Value>>("width")?.or(width);
    let first = kwargs
        .get::<Option<bool>>("first")?
        .or(first)
        .unwrap_or(false);
    let blank = kwargs
        .get::<Option<bool>>("blank")?
        .or(blank)
        .unwrap_or(false);
    kwargs.assert_all_used()?;
    let indention = match &width {
        None => "    ".to_string(),
        Some(w) if w.kind() == ValueKind::String => w.as_str().unwrap_or("").to_string(),
        Some(w) => {
            let n = i64::try_from(w.clone()).map_err(|_| {
                Error::new(
                    ErrorKind::InvalidOperation,
                    "indent width must be a number or a string",
                )
            })?;
            let n = usize::try_from(n).unwrap_or(0);
            if n > MAX_BUILT_STRING {
                return Err(too_large());
            }
            " ".repeat(n)
        }
    };
    let text = format!("{value}\n");
    // Python's str.splitlines() on text ending in a newline: no empty last line.
    let lines: Vec<&str> = text.lines().collect();
    if indention
        .len()
        .saturating_mul(lines.len() + 1)
        .saturating_add(text.len())
        > MAX_BUILT_STRING
    {
        return Err(too_large());
    }
    let mut rv = String::new();
    if blank {
        rv = lines.join(&format!("\n{indention}"));
    } else if let Some((head, rest)) = lines.split_first() {
        rv.push_str(head);
        for line in rest {
            rv.push('\n');
            if !line.is_empty() {
                rv.push_str(&indention);
            }
            rv.push_str(line);
        }
    }
    if first {
        rv.insert_str(0, &indention);
    }
    Ok(rv)
}

/// `length` / `count`: Python's `len()`, with Jinja2's 0 for an undefined value.
fn length(v: &Value) -> Result<Value, Error> {
    if v.is_undefined() {
        return Ok(Value::from(0));
    }
    v.len().map(Value::from).ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("object of type {} has no len()", py_type_name(v)),
        )
    })
}

/// Jinja2's `join(value, d='', attribute=None)`.
fn join(
    value: &Value,
    separator: Option<String>,
    kwargs: minijinja::value::Kwargs,
) -> Result<Value, Error> {
    let separator = match separator {
        Some(s) => s,
        None => kwargs.get::<Option<String>>("d")?.unwrap_or_default(),
    };
    let attribute: Option<Value> = kwargs.get("attribute")?;
    kwargs.assert_all_used()?;
    check_size(value)?;
    let mut out = String::new();
    for (i, item) in value.try_iter()?.enumerate() {
        if i > 0 {
            out.push_str(&separator);
        }
        let item = match &attribute {
            None => item,
            Some(attr) => get_attribute(&item, attr)?,
        };
        out.push_str(&py_str(&item)?);
        if out.len() > MAX_BUILT_STRING {
            return Err(too_large());
        }
    }
    Ok(Value::from(out))
}

/// Jinja2's attribute getter for `join(attribute=...)`: a dotted path of keys (integer parts
/// index sequences), or an integer index.
fn get_attribute(item: &Value, attr: &Value) -> Result<Value, Error> {
    if attr.is_integer() {
        return item.get_item(attr);
    }
    let path = attr.as_str().unwrap_or_default();
    let mut v = item.clone();
    for part in path.split('.') {
        v = match part.parse::<i64>() {
            Ok(i) if v.kind() == ValueKind::Seq => v.get_item(&Value::from(i))?,
            _ => v.get_item(&Value::from(part))?,
        };
    }
    Ok(v)
}

/// Jinja2's `title`: each piece between runs of whitespace, `-`, `(`, `{`, `[`, `<` gets its
/// first character upper-cased and the rest lower-cased.
fn title(value: &Value) -> Result<String, Error> {
    let s = py_str(value)?;
    let is_sep = |c: char| c.is_whitespace() || matches!(c, '-' | '(' | '{' | '[' | '<');
    let mut out = String::with_capacity(s.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        let mut chars = word.chars();
        if let Some(first) = chars.next() {
            out.extend(first.to_uppercase());
            out.push_str(&chars.as_str().to_lowercase());
        }
        word.clear();
    };
    for c in s.chars() {
        if is_sep(c) {
            flush(&mut word, &mut out);
            out.push(c);
        } else {
            word.push(c);
        }
    }
    flush(&mut word, &mut out);
    Ok(out)
}

/// Jinja2's `round(value, precision=0, method='common')`: `common` is Python's `round` (half to
/// even on the exact binary value; an integer stays an integer), `ceil` / `floor` round
/// `value * 10**precision` that way and divide back.
fn round(value: &Value, precision: Option<i32>, method: Option<String>) -> Result<Value, Error> {
    let precision = precision.unwrap_or(0);
    let method = method.as_deref().unwrap_or("common");
    if !matches!(method, "common" | "ceil" | "floor") {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "method must be common, ceil or floor",
        ));
    }
    if value.kind() != ValueKind::Number && value.kind() != ValueKind::Bool {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("cannot round a value of type {}", py_type_name(value)),
        ));
    }
    if method == "common" && (value.is_integer() || value.kind() == ValueKind::Bool) {
        return Ok(value.clone());
    }
    let x = f64::try_from(value.clone()).unwrap_or(f64::NAN);
    let scale = 10f64.powi(precision.clamp(-300, 300));
    let rounded = match method {
        "ceil" => (x * scale).ceil() / scale,
        "floor" => (x * scale).floor() / scale,
        // Rust's fixed-precision formatting is correctly rounded, ties to even, like CPython's.
        _ if precision >= 0 => format!("{:.*}", precision.min(330) as usize, x)
            .parse()
            .unwrap_or(x),
        _ => {
            let unit = 1.0 / scale;
            let digits = format!("{:.0}", x / unit);
            digits.parse::<f64>().map_or(x, |d| d * unit)
        }
    };
    Ok(Value::from(rounded))
}

/// Jinja2's `int(value, default=0, base=10)`: Python's `int(value)` (strings in `base`), else
/// `int(float(value))`, else `default`.
fn to_int(value: &Value, default: Option<Value>, base: Option<u32>) -> Value {
    let default = default.unwrap_or_else(|| Value::from(0));
    let base = base.unwrap_or(10);
    let from_float = |f: f64| {
        if f.is_finite() && f.abs() < 1.7e38 {
            Value::from(f.trunc() as i128)
        } else {
            default.clone()
        }
    };
    match value.kind() {
        ValueKind::Bool => Value::from(i64::from(value.is_true())),
        ValueKind::Number if value.is_integer() => value.clone(),
        ValueKind::Number => f64::try_from(value.clone()).map_or(default.clone(), from_float),
        ValueKind::String => {
            let s = value.as_str().unwrap_or_default().trim();
            let digits = match base {
                16 => s.trim_start_matches("0x").trim_start_matches("0X"),
                8 => s.trim_start_matches("0o").trim_start_matches("0O"),
                2 => s.trim_start_matches("0b").trim_start_matches("0B"),
                _ => s,
            };
            if (2..=36).contains(&base) {
                if let Ok(i) = i128::from_str_radix(digits, base) {
                    return Value::from(i);
                }
            }
            s.parse::<f64>().map_or(default.clone(), from_float)
        }
        _ => default,
    }
}

/// Jinja2's `float(value, default=0.0)`: Python's `float(value)`, else `default`.
fn to_float(value: &Value, default: Option<Value>) -> Value {
    let default = default.unwrap_or_else(|| Value::from(0.0));
    match value.kind() {
        ValueKind::Bool => Value::from(if value.is_true() { 1.0 } else { 0.0 }),
        ValueKind::Number => f64::try_from(value.clone()).map_or(default, Value::from),
        ValueKind::String => value
            .as_str()
            .unwrap_or_default()
            .trim()
            .parse::<f64>()
            .map_or(default, Value::from),
        _ => default,
    }
}

fn py_type_name(v: &Value) -> &'static str {
    match v.kind() {
        _ if is_py_none(v) => "NoneType",
        ValueKind::Bool => "bool",
        ValueKind::Number if v.is_integer() => "int",
        ValueKind::Number => "float",
        ValueKind::Undefined => "Undefined",
        _ => "object",
    }
}

/// `{{ value }}`: Python's `str(value)`.
fn format_value(out: &mut Output, state: &State, value: &Value) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Seq | ValueKind::Map | ValueKind::Iterable | ValueKind::Number => out
            .write_str(&py_str(value)?)
            .map_err(|_| Error::new(ErrorKind::WriteFailure, "formatting failed")),
        _ => minijinja::escape_formatter(out, state, value),
    }
}

/// Python's `str()`: strings as they are, containers and scalars as `repr()`.
fn py_str(v: &Value) -> Result<String, Error> {
    if let Some(s) = v.as_str() {
        return Ok(s.to_string());
    }
    let mut out = String::new();
    py_repr(&mut out, v, 0)?;
    if out.len() > MAX_BUILT_STRING {
        return Err(too_large());
    }
    Ok(out)
}

/// The longest string a filter or `{{ value }}` builds from a container (`str()`, `join`): a
/// hostile template multiplying a list (`[x] * 4000000000`, which minijinja makes lazily) must
/// fail here, not allocate without bound. Far above any real conversation's rendering.
pub(super) const MAX_BUILT_STRING: usize = 64 << 20;

pub(super) fn too_large() -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("the value is too large to render (over {MAX_BUILT_STRING} bytes)"),
    )
}

/// Python's `repr()` of a value made of Python-like data (a lazily repeated list as the list it
/// stands for); an error past [`MAX_BUILT_STRING`] bytes or a container of more than
/// [`MAX_ITEMS`].
fn py_repr(out: &mut String, v: &Value, depth: usize) -> Result<(), Error> {
    if depth > 64 {
        out.push_str("...");
        return Ok(());
    }
    if out.len() > MAX_BUILT_STRING {
        return Err(too_large());
    }
    match v.kind() {
        ValueKind::Undefined => {}
        _ if is_py_none(v) => out.push_str("None"),
        ValueKind::Bool => out.push_str(if v.is_true() { "True" } else { "False" }),
        ValueKind::Number if v.is_integer() => {
            let _ = write!(out, "{v}");
        }
        ValueKind::Number => match f64::try_from(v.clone()) {
            Ok(f) if f.is_nan() => out.push_str("nan"),
            Ok(f) if f.is_infinite() => out.push_str(if f > 0.0 { "inf" } else { "-inf" }),
            Ok(f) => out.push_str(&py_float_repr(f)),
            Err(_) => {
                let _ = write!(out, "{v}");
            }
        },
        ValueKind::String => py_repr_str(out, v.as_str().unwrap_or_default()),
        ValueKind::Seq | ValueKind::Iterable => {
            check_size(v)?;
            out.push('[');
            if let Ok(items) = v.try_iter() {
                for (i, item) in items.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr(out, &item, depth + 1)?;
                }
            }
            out.push(']');
        }
        ValueKind::Map => {
            check_size(v)?;
            out.push('{');
            if let Ok(keys) = v.try_iter() {
                for (i, key) in keys.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr(out, &key, depth + 1)?;
                    out.push_str(": ");
                    py_repr(out, &v.get_item(&key).unwrap_or_default(), depth + 1)?;
                }
            }
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{v}");
        }
    }
    Ok(())
}

/// Python's `repr()` of a string: single quotes unless the text has `'` and no `"`; escapes for
/// the quote, backslash, `\n` `\r` `\t`, and `\xNN` / `\uNNNN` / `\UNNNNNNNN` for characters that
/// are not printable (general categories C* and Z* except the space).
fn py_repr_str(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !is_printable(c) => {
                let cp = c as u32;
                let _ = if cp < 0x100 {
                    write!(out, "\\x{cp:02x}")
                } else if cp < 0x10000 {
                    write!(out, "\\u{cp:04x}")
                } else {
                    write!(out, "\\U{cp:08x}")
                };
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Python's `str.isprintable()` for one character.
fn is_printable(c: char) -> bool {
    if c == ' ' {
        return true;
    }
    if c.is_ascii() {
        return !c.is_ascii_control();
    }
    static NOT_PRINTABLE: OnceLock<Vec<(u32, u32)>> = OnceLock::new();
    let ranges = NOT_PRINTABLE.get_or_init(|| {
        crate::unicode::class_ranges(r"[\p{Cc}\p{Cf}\p{Co}\p{Cn}\p{Zl}\p{Zp}\p{Zs}]")
    });
    !crate::unicode::in_ranges(ranges, c as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repr_like_python() {
        // repr(x) in CPython 3.11.
        let cases: [(Value, &str); 7] = [
            (Value::from("it's"), r#""it's""#),
            (Value::from("say \"x\" it's"), r#"'say "x" it\'s'"#),
            (
                Value::from("a\nb\\\u{1}\u{200b}é😀"),
                r"'a\nb\\\x01\u200bé😀'",
            ),
            (Value::from_serialize(vec![Some(1.5), None]), "[1.5, None]"),
            (Value::from(vec![true, false]), "[True, False]"),
            (Value::from(2.0), "2.0"),
            (Value::from(1e20), "1e+20"),
        ];
        for (v, want) in cases {
            let mut s = String::new();
            py_repr(&mut s, &v, 0).unwrap();
            assert_eq!(s, want);
        }
        assert!(!is_printable('\u{a0}'));
        // round(x, n) in CPython.
        for (x, n, want) in [
            (2.5, 0, 2.0),
            (3.5, 0, 4.0),
            (0.125, 2, 0.12),
            (2.675, 2, 2.67),
        ] {
            let got = round(&Value::from(x), Some(n), None).unwrap();
            assert_eq!(f64::try_from(got).unwrap(), want, "round({x}, {n})");
        }
        assert!(is_printable('日'));
    }
}
