//! The error every function in `format` returns: one sentence naming the defect, or what
//! kept a file from being read (or from still being the file that was opened).

use std::fmt;

/// A defect found in a model file: what is wrong, where, and expected vs found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatError {
    message: String,
}

impl FormatError {
    pub fn new(message: impl Into<String>) -> Self {
        FormatError {
            message: message.into(),
        }
    }

    /// "`what` at `place`: expected `expected`, found `found`".
    pub fn mismatch(
        what: &str, place: impl fmt::Display, expected: impl fmt::Display, found: impl fmt::Display,
    ) -> Self {
        FormatError::new(format!(
            "{what} at {place}: expected {expected}, found {found}"
        ))
    }

    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for FormatError {}
