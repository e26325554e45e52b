//! The one error type of the crate: a kernel called with shapes or buffers that do not fit.

/// What went wrong in a kernel call (nothing here panics on bad input).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Shapes, strides or buffer lengths that do not fit together.
    #[error("{op}: {what}")]
    Shape {
        /// The kernel.
        op: &'static str,
        /// What does not fit.
        what: String,
    },
}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
