//! Reading a request's JSON object field by field, so that every wrong type and every value out
//! of range is a 400 naming the field and what it accepts. `null` counts as absent (OpenAI's
//! clients send `null` for unset optional fields); fields nobody reads are ignored.

use serde_json::{Map, Value};

use crate::error::ApiError;

/// A JSON object of a request.
#[derive(Clone)]
pub(crate) struct Fields<'a> {
    map: &'a Map<String, Value>,
    /// Prefix of the names in error messages (`messages[2].` for a nested object).
    prefix: String,
}

impl<'a> Fields<'a> {
    pub(crate) fn new(map: &'a Map<String, Value>) -> Fields<'a> {
        Fields {
            map,
            prefix: String::new(),
        }
    }

    pub(crate) fn nested(map: &'a Map<String, Value>, prefix: String) -> Fields<'a> {
        Fields { map, prefix }
    }

    /// The full name of field `key`.
    pub(crate) fn name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// The value, `None` when absent or `null`.
    pub(crate) fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub(crate) fn bool(&self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(ApiError::wrong_type(&self.name(key), "a boolean", v)),
        }
    }

    pub(crate) fn str(&self, key: &str) -> Result<Option<&'a str>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(ApiError::wrong_type(&self.name(key), "a string", v)),
        }
    }

    pub(crate) fn object(&self, key: &str) -> Result<Option<Fields<'a>>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(m)) => Ok(Some(Fields::nested(m, format!("{}.", self.name(key))))),
            Some(v) => Err(ApiError::wrong_type(&self.name(key), "an object", v)),
        }
    }

    /// A number in a range; `range` describes it for the error message (e.g. "in [0, 2]").
    pub(crate) fn number(
        &self,
        key: &str,
        ok: impl Fn(f64) -> bool,
        range: &str,
    ) -> Result<Option<f64>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => number_value(&self.name(key), v, ok, range).map(Some),
        }
    }

    /// An integer in `min..=max`.
    pub(crate) fn int(&self, key: &str, min: i64, max: i64) -> Result<Option<i64>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => int_value(&self.name(key), v, min, max).map(Some),
        }
    }
}

/// A number (not NaN: JSON has none) for which `ok` holds.
pub(crate) fn number_value(
    name: &str,
    v: &Value,
    ok: impl Fn(f64) -> bool,
    range: &str,
) -> Result<f64, ApiError> {
    let Some(x) = v.as_f64() else {
        return Err(ApiError::wrong_type(name, &format!("a number {range}"), v));
    };
    if !ok(x) {
        return Err(ApiError::param(
            name,
            format!("'{name}' must be {range}, got {x}"),
        ));
    }
    Ok(x)
}

/// An integer in `min..=max` (a number with no fractional part is accepted too: `2.0`).
pub(crate) fn int_value(name: &str, v: &Value, min: i64, max: i64) -> Result<i64, ApiError> {
    let range = if max == i64::MAX {
        format!(">= {min}")
    } else {
        format!("in [{min}, {max}]")
    };
    let n = match v {
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Some(i128::from(i))
            } else if let Some(u) = n.as_u64() {
                Some(i128::from(u))
            } else {
                n.as_f64()
                    .filter(|f| f.fract() == 0.0 && f.abs() < 1e30)
                    .map(|f| f as i128)
            }
        }
        _ => None,
    };
    let Some(n) = n else {
        return Err(ApiError::wrong_type(
            name,
            &format!("an integer {range}"),
            v,
        ));
    };
    if n < i128::from(min) || n > i128::from(max) {
        return Err(ApiError::param(
            name,
            format!("'{name}' must be an integer {range}, got {n}"),
        ));
    }
    Ok(n as i64)
}

/// A seed: any integer that fits 64 bits, signed or not (negative ones are taken modulo 2^64).
pub(crate) fn seed_value(name: &str, v: &Value) -> Result<u64, ApiError> {
    match v {
        Value::Number(n) if n.is_u64() => Ok(n.as_u64().unwrap_or(0)),
        Value::Number(n) if n.is_i64() => Ok(n.as_i64().unwrap_or(0) as u64),
        _ => Err(ApiError::invalid(format!(
            "'{name}' must be an integer in [-2^63, 2^64), got {v}"
        ))
        .with_param(name)
        .with_code(if v.is_number() {
            "invalid_value"
        } else {
            "invalid_type"
        })),
    }
}
