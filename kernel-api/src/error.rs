//! Typed errors shared by every backend. Nothing in the contract panics on bad input: every
//! failure is one of these variants, naming the offending field and the reason.

use std::fmt;

/// Result alias used across the contract.
pub type Result<T> = std::result::Result<T, Error>;

/// One reason why a backend or variant cannot take a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reason {
    /// What the reason is about (a field, a dtype, a variant).
    pub subject: String,
    /// Why it cannot be served.
    pub why: String,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.subject, self.why)
    }
}

/// Errors of the kernel contract.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum Error {
    /// The request is malformed: wrong shape, dtype, stride, index or value.
    #[error("invalid input `{field}`: {why}")]
    InvalidInput { field: String, why: String },
    /// The request is well formed but this backend or variant cannot serve it.
    #[error("unsupported: {}", join_reasons(.reasons))]
    Unsupported { reasons: Vec<Reason> },
    /// The backend cannot run at all here: no driver, no device, no kernel binary.
    #[error("unavailable: {why}")]
    Unavailable { why: String },
    /// A driver or runtime call failed.
    #[error("driver error in {call}: {why}")]
    Driver { call: String, why: String },
}

fn join_reasons(reasons: &[Reason]) -> String {
    reasons.iter().map(|r| r.to_string()).collect::<Vec<_>>().join("; ")
}

impl Error {
    /// Shorthand for [`Error::InvalidInput`].
    pub fn invalid(field: impl Into<String>, why: impl Into<String>) -> Self {
        Error::InvalidInput { field: field.into(), why: why.into() }
    }
    /// Shorthand for an [`Error::Unsupported`] with a single reason.
    pub fn unsupported(subject: impl Into<String>, why: impl Into<String>) -> Self {
        Error::Unsupported { reasons: vec![Reason { subject: subject.into(), why: why.into() }] }
    }
    /// The field named by an [`Error::InvalidInput`], if that is what this is.
    pub fn field(&self) -> Option<&str> {
        match self {
            Error::InvalidInput { field, .. } => Some(field),
            _ => None,
        }
    }
}

/// Collects reasons and turns them into `Ok(())` or one [`Error::Unsupported`].
#[derive(Debug, Default)]
pub struct Reasons(Vec<Reason>);

impl Reasons {
    pub fn new() -> Self {
        Self(Vec::new())
    }
    /// Records a reason when `cond` is false.
    pub fn require(&mut self, cond: bool, subject: &str, why: impl Into<String>) {
        if !cond {
            self.0.push(Reason { subject: subject.to_string(), why: why.into() });
        }
    }
    pub fn into_result(self) -> Result<()> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(Error::Unsupported { reasons: self.0 })
        }
    }
}

/// Returns `InvalidInput{field, why}` unless `cond` holds.
pub fn ensure(cond: bool, field: &str, why: impl FnOnce() -> String) -> Result<()> {
    if cond {
        Ok(())
    } else {
        Err(Error::invalid(field, why()))
    }
}
