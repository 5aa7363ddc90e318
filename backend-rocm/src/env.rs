//! Run-time switches read from the environment.

use kernel_api::{Error, Result};

/// The value of `var` among `choices` (name, value); unset or empty is the first choice, and
/// anything else is an `InvalidInput` naming the variable and the accepted names.
pub(crate) fn choice<T: Copy>(var: &str, choices: &[(&str, T)]) -> Result<T> {
    let raw = std::env::var(var).unwrap_or_default();
    let v = raw.trim();
    match choices.iter().find(|(n, _)| *n == v) {
        Some(&(_, t)) => Ok(t),
        None if v.is_empty() => choices.first().map(|&(_, t)| t).ok_or_else(|| Error::invalid(var, "no choices")),
        None => {
            let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
            Err(Error::invalid(var, format!("`{v}`: expected one of {}", names.join(", "))))
        }
    }
}
