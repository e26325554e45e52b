//! The crate's one error type: every variant names what was wrong (which operand, which size).

use crate::isa::Isa;

/// Errors of the CPU kernels. Kernels never panic on caller input: shapes, buffer lengths and
/// formats are validated before any work starts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A buffer does not have the length its shape implies.
    #[error("{what}: expected {expected} elements/bytes, got {got}")]
    Length {
        /// Which operand (e.g. "activations", "Q4_0 tiles").
        what: &'static str,
        /// The length implied by the shape.
        expected: usize,
        /// The length given.
        got: usize,
    },
    /// A dimension is impossible for the format (zero, not a multiple of the block size, ...).
    #[error("{what}: {reason}")]
    Shape {
        /// Which operand or dimension.
        what: &'static str,
        /// What is wrong with it.
        reason: String,
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

/// Result alias for this crate.
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
