//! The crate's one error type: every variant names what was wrong (which operand, which size).
//! Kernels never panic on caller input: shapes, buffer lengths and formats are validated before
//! any work starts.

use crate::isa::Isa;

/// What went wrong in a kernel call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Shapes, strides or dimensions that do not fit together or do not fit the format.
    #[error("{op}: {what}")]
    Shape {
        /// The kernel or operand.
        op: &'static str,
        /// What does not fit.
        what: String,
    },
    /// A buffer does not have the length its shape implies.
    #[error("{what}: expected {expected} elements/bytes, got {got}")]
    Length {
        /// Which operand (e.g. "activations", "packed weights").
        what: &'static str,
        /// The length implied by the shape.
        expected: usize,
        /// The length given.
        got: usize,
    },
    /// A size computation overflowed `usize` (a shape no machine can hold).
    #[error("{what}: size overflows the address space")]
    Overflow {
        /// Which operand.
        what: &'static str,
    },
    /// A weight type this crate has no kernel for.
    #[error("unsupported weight type {0}")]
    Unsupported(String),
    /// A kernel path was requested that this CPU cannot run.
    #[error("the {0} kernels need CPU features this machine does not have")]
    IsaUnavailable(Isa),
    /// `threads` outside `1..=max`.
    #[error("thread count {requested} is outside 1..={max}")]
    Threads {
        /// The count asked for.
        requested: usize,
        /// The largest count accepted.
        max: usize,
    },
    /// The global thread pool could not be built (e.g. it was already started with another size).
    #[error("thread pool: {0}")]
    Pool(String),
}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// `a * b`, or an [`Error::Overflow`] naming `what`.
pub(crate) fn mul(what: &'static str, a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b).ok_or(Error::Overflow { what })
}

/// Check a buffer length.
pub(crate) fn check_len(what: &'static str, got: usize, expected: usize) -> Result<()> {
    if got == expected {
        Ok(())
    } else {
        Err(Error::Length {
            what,
            expected,
            got,
        })
    }
}
