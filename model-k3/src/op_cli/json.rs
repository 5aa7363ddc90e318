//! Typed reads of the params JSON by key. Every read is recorded, so that after an op has read
//! all it knows, any key left over (a typo, a field of another op) is an error naming it.

use super::OpError;
use serde_json::{Map, Value};
use std::cell::RefCell;
use std::collections::BTreeSet;
use std::rc::Rc;

/// Integer values flattened row-major, with their shape.
pub(crate) type IntArray = (Vec<i64>, Vec<usize>);

/// Keys read so far, as dotted paths; objects read as a whole (`dtypes`) are leaves.
#[derive(Default)]
struct Consumed {
    leaves: BTreeSet<String>,
    /// Objects whose own keys are params fields (checked key by key).
    objects: BTreeSet<String>,
}

/// One JSON object of the params file (the root, or a nested struct such as `cache`).
pub(crate) struct Params<'a> {
    op: &'static str,
    /// Dotted path of this object followed by `.`; empty at the root.
    prefix: String,
    obj: &'a Map<String, Value>,
    consumed: Rc<RefCell<Consumed>>,
}

/// What a value must look like, for error messages.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl<'a> Params<'a> {
    pub fn root(op: &'static str, v: &'a Value) -> Result<Self, OpError> {
        match v {
            Value::Object(obj) => Ok(Params { op, prefix: String::new(), obj, consumed: Rc::default() }),
            other => Err(OpError::param(op, ".", format!("the params file must hold a JSON object, not {}", kind(other)))),
        }
    }

    /// The dotted path of `key` (what errors name).
    pub fn path(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    pub fn err(&self, key: &str, why: impl Into<String>) -> OpError {
        OpError::param(self.op, self.path(key), why)
    }

    /// The value of `key`; absent and `null` are both `None`. Marks the key as read.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.consumed.borrow_mut().leaves.insert(self.path(key));
        self.obj.get(key).filter(|v| !v.is_null())
    }

    pub fn has(&self, key: &str) -> bool {
        self.obj.get(key).is_some_and(|v| !v.is_null())
    }

    fn required(&self, key: &str, what: &str) -> Result<&'a Value, OpError> {
        self.get(key).ok_or_else(|| self.err(key, format!("missing (expected {what})")))
    }

    fn as_usize(&self, key: &str, v: &Value) -> Result<usize, OpError> {
        v.as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| self.err(key, format!("expected a non-negative integer, got {v}")))
    }

    fn as_f32(&self, key: &str, v: &Value) -> Result<f32, OpError> {
        let x = v.as_f64().ok_or_else(|| self.err(key, format!("expected a number, got {}", kind(v))))?;
        let f = x as f32;
        if x.is_finite() && !f.is_finite() {
            return Err(self.err(key, format!("{x} does not fit f32")));
        }
        Ok(f)
    }

    pub fn usize(&self, key: &str) -> Result<usize, OpError> {
        let v = self.required(key, "a non-negative integer")?;
        self.as_usize(key, v)
    }

    /// `key` if given, else `default()` (typically a tensor dimension).
    pub fn usize_or(&self, key: &str, default: impl FnOnce() -> Result<usize, OpError>) -> Result<usize, OpError> {
        match self.get(key) {
            Some(v) => self.as_usize(key, v),
            None => default(),
        }
    }

    pub fn f32(&self, key: &str) -> Result<f32, OpError> {
        let v = self.required(key, "a number")?;
        self.as_f32(key, v)
    }

    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>, OpError> {
        self.get(key).map(|v| self.as_f32(key, v)).transpose()
    }

    pub fn f32_or(&self, key: &str, default: f32) -> Result<f32, OpError> {
        Ok(self.opt_f32(key)?.unwrap_or(default))
    }

    pub fn bool(&self, key: &str) -> Result<bool, OpError> {
        let v = self.required(key, "true or false")?;
        v.as_bool().ok_or_else(|| self.err(key, format!("expected true or false, got {}", kind(v))))
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&'a str>, OpError> {
        match self.get(key) {
            Some(v) => v.as_str().map(Some).ok_or_else(|| self.err(key, format!("expected a string, got {}", kind(v)))),
            None => Ok(None),
        }
    }

    pub fn str(&self, key: &str) -> Result<&'a str, OpError> {
        self.opt_str(key)?.ok_or_else(|| self.err(key, "missing (expected a string)"))
    }

    /// One of `choices` (`(spelling, value)`), or `default` when absent.
    pub fn choice<T: Copy>(&self, key: &str, choices: &[(&str, T)], default: Option<T>) -> Result<T, OpError> {
        let names = || choices.iter().map(|(n, _)| format!("\"{n}\"")).collect::<Vec<_>>().join(", ");
        match self.opt_str(key)? {
            Some(s) => choices
                .iter()
                .find(|(n, _)| *n == s)
                .map(|(_, v)| *v)
                .ok_or_else(|| self.err(key, format!("unknown value \"{s}\" (expected one of {})", names()))),
            None => default.ok_or_else(|| self.err(key, format!("missing (expected one of {})", names()))),
        }
    }

    /// A nested struct (`cache`, `routing`, ...) whose keys are checked like the root's.
    pub fn object(&self, key: &str) -> Result<Params<'a>, OpError> {
        self.opt_object(key)?.ok_or_else(|| self.err(key, "missing (expected an object)"))
    }

    pub fn opt_object(&self, key: &str) -> Result<Option<Params<'a>>, OpError> {
        match self.get(key) {
            Some(Value::Object(obj)) => {
                let mut c = self.consumed.borrow_mut();
                c.leaves.remove(&self.path(key));
                c.objects.insert(self.path(key));
                Ok(Some(Params { op: self.op, prefix: format!("{}.", self.path(key)), obj, consumed: self.consumed.clone() }))
            }
            Some(other) => Err(self.err(key, format!("expected an object, got {}", kind(other)))),
            None => Ok(None),
        }
    }

    /// The entries of a `{"name": "value"}` map (`dtypes`, `out_dtypes`); empty when absent.
    pub fn string_map(&self, key: &str) -> Result<Vec<(String, &'a str)>, OpError> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Object(m)) => m
                .iter()
                .map(|(k, v)| {
                    v.as_str()
                        .map(|s| (k.clone(), s))
                        .ok_or_else(|| self.err(&format!("{key}.{k}"), format!("expected a string, got {}", kind(v))))
                })
                .collect(),
            Some(other) => Err(self.err(key, format!("expected an object of strings, got {}", kind(other)))),
        }
    }

    /// An integer array, flattened row-major, with its shape (`[[1, 2], [3, 4]]` -> `[1, 2, 3, 4]`,
    /// `[2, 2]`). `None` when absent.
    pub fn int_array(&self, key: &str) -> Result<Option<IntArray>, OpError> {
        let Some(v) = self.get(key) else { return Ok(None) };
        let mut values = Vec::new();
        let shape = flatten(v, &mut values).map_err(|why| self.err(key, why))?;
        Ok(Some((values, shape)))
    }

    /// Every key of the params file that no op read: the first is an error.
    pub fn check_all_read(&self) -> Result<(), OpError> {
        let c = self.consumed.borrow();
        check_read(self.op, "", self.obj, &c)
    }
}

fn check_read(op: &'static str, prefix: &str, obj: &Map<String, Value>, c: &Consumed) -> Result<(), OpError> {
    for (k, v) in obj {
        let path = format!("{prefix}{k}");
        if c.objects.contains(&path) {
            if let Value::Object(inner) = v {
                check_read(op, &format!("{path}."), inner, c)?;
            }
        } else if !c.leaves.contains(&path) {
            // The keys this op reads at this level (those it reached before the check).
            let known: BTreeSet<&str> = c
                .leaves
                .iter()
                .chain(&c.objects)
                .filter_map(|p| p.strip_prefix(prefix))
                .filter(|k| !k.contains('.'))
                .collect();
            let known: Vec<&str> = known.into_iter().collect();
            return Err(OpError::param(op, path, format!("not a parameter of `{op}` (keys here: {})", known.join(", "))));
        }
    }
    Ok(())
}

/// Flattens nested integer arrays of a regular shape.
fn flatten(v: &Value, out: &mut Vec<i64>) -> Result<Vec<usize>, String> {
    match v {
        Value::Array(items) => {
            let mut inner: Option<Vec<usize>> = None;
            for item in items {
                let s = flatten(item, out)?;
                match &inner {
                    None => inner = Some(s),
                    Some(prev) if *prev == s => {}
                    Some(prev) => return Err(format!("ragged array: rows of shape {prev:?} and {s:?}")),
                }
            }
            let mut shape = vec![items.len()];
            shape.extend(inner.unwrap_or_default());
            Ok(shape)
        }
        Value::Number(n) => {
            let x = n.as_i64().ok_or_else(|| format!("expected integers, got {n}"))?;
            out.push(x);
            Ok(Vec::new())
        }
        other => Err(format!("expected an integer array, got {}", kind(other))),
    }
}
