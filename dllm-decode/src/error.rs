//! The crate's error type.

/// Errors from decoding.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// A decoding parameter is impossible or inconsistent; the message names it.
    #[error("invalid parameter `{name}`: {reason}")]
    InvalidParam {
        /// The field of [`crate::DecodeParams`] (a path such as `gen_length` or
        /// `revision.theta_visible`); command-line tools map it to their flag.
        name: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A decoding role (window policy or selector) produced an impossible plan.
    #[error("decoding policy `{policy}`: {reason}")]
    Policy {
        /// The role's name.
        policy: String,
        /// What is wrong with its plan.
        reason: String,
    },
    /// A token-state transition the state machine does not admit (a decoder bug, reported).
    #[error(transparent)]
    State(#[from] crate::states::InvalidTransition),
    /// A generation was driven out of order (`next` twice without `absorb`, an answer with other
    /// rows than the ask): a bug in the loop that holds it.
    #[error("generation driven out of order: {0}")]
    Sequence(&'static str),
    /// The prompt cannot be decoded with this model.
    #[error("invalid prompt: {0}")]
    InvalidPrompt(String),
    /// A latency table that cannot be read or used; the message names the file and the problem.
    #[error("latency table: {0}")]
    LatencyTable(String),
    /// The model failed.
    #[error(transparent)]
    Model(#[from] dllm_models::Error),
    /// candle failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

impl DecodeError {
    pub(crate) fn param(name: &'static str, reason: impl Into<String>) -> Self {
        DecodeError::InvalidParam {
            name,
            reason: reason.into(),
        }
    }
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, DecodeError>;
