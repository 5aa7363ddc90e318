//! Run-time switches read from the environment.

use kernel_api::{Error, Result};

/// The value of `var` among `choices` (name, value); unset or empty is the first choice, and
/// anything else is an `InvalidInput` naming the variable and the accepted names.
pub(crate) fn choice<T: Copy>(var: &str, choices: &[(&str, T)]) -> Result<T> {
    let raw = std::env::var(var).unwrap_or_default();
    let v = raw.trim();
    let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
    match choices.iter().find(|(n, _)| *n == v) {
        Some(&(_, t)) => Ok(t),
        None if v.is_empty() => choices.first().map(|&(_, t)| t).ok_or_else(|| Error::invalid(var, "no choices")),
        None => Err(Error::invalid(var, format!("`{v}`: expected one of {}", names.join(", ")))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_is_the_first_choice_and_unknown_names_the_variable() {
        let var = "K3_BACKEND_CUDA_ENV_CHOICE_TEST"; // read by this test only
        let choices = [("auto", 0), ("on", 1)];
        std::env::remove_var(var);
        assert_eq!(choice(var, &choices).unwrap(), 0);
        std::env::set_var(var, " on ");
        assert_eq!(choice(var, &choices).unwrap(), 1);
        std::env::set_var(var, "maybe");
        let e = choice(var, &choices).unwrap_err();
        assert_eq!(e.field(), Some(var));
        assert!(e.to_string().contains("auto, on"), "{e}");
        std::env::remove_var(var);
    }
}
