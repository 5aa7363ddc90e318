//! Errors of the model layer: each names the file or tensor and the reason.

use std::path::PathBuf;

pub type Result<T> = std::result::Result<T, ModelError>;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    /// A checkpoint file is malformed (bad header, truncated, inconsistent index).
    #[error("{}: {why}", path.display())]
    Checkpoint { path: PathBuf, why: String },
    /// A tensor is missing, mis-shaped or mis-typed.
    #[error("tensor `{name}`: {why}")]
    Tensor { name: String, why: String },
    /// The model produced a NaN or infinite logit: no token is reported from it.
    #[error("non-finite logits in the {what} at position {position}: vocab entry {index} is {value}; no token is reported from them")]
    NonFinite { what: String, position: usize, index: usize, value: f32 },
    /// Config, kernel or backend error.
    #[error(transparent)]
    Kernel(#[from] kernel_api::Error),
}

impl ModelError {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ModelError::Io { path: path.into(), source }
    }
    pub fn checkpoint(path: impl Into<PathBuf>, why: impl Into<String>) -> Self {
        ModelError::Checkpoint { path: path.into(), why: why.into() }
    }
    pub fn tensor(name: impl Into<String>, why: impl Into<String>) -> Self {
        ModelError::Tensor { name: name.into(), why: why.into() }
    }
}
