//! The joint check of verification (see [`Joint`]), re-exported by `params`.

use crate::error::{DecodeError, Result};

/// Joint check: a token decided in the same step as another decision at most this many positions
/// away waits for a fresh look ...
pub const DEFAULT_JOINT_WITHIN: usize = 8;
/// ... unless it was decided at least this confident.
pub const DEFAULT_JOINT_UNLESS_ABOVE: f32 = 0.9999;

/// The joint check ([`crate::params::Verify::joint`]): tokens decided in one step beside another decision were
/// each predicted with the other still masked (a result digit decided with its operand), so they
/// are tentative — verified by a shadow row before they are final — unless nearly certain.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Joint {
    /// On for models whose logits are not shifted (LLaDA) unless the mbsd window shows a guess
    /// ([`crate::MbsdParams::show_guess`]: the joint check would make the guess's step tentative
    /// and the guess pointless), off for shifted ones (Dream): chosen per family on the tuning
    /// and confirmation sets (README, *Default decoding*).
    Auto,
    /// Never.
    Off,
    /// Always, with this rule.
    On(JointRule),
}

/// What the joint check holds back: see [`Joint`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JointRule {
    /// Another decision of the same step at most this many positions away.
    pub within: usize,
    /// Decisions at least this confident are exempt.
    pub unless_above: f32,
}

impl Default for JointRule {
    fn default() -> Self {
        Self {
            within: DEFAULT_JOINT_WITHIN,
            unless_above: DEFAULT_JOINT_UNLESS_ABOVE,
        }
    }
}

impl Joint {
    /// The rule for a model with (`shift_logits`) or without shifted logits whose mbsd window
    /// shows a guess (`shows_guess`) or not.
    pub fn resolve(self, shift_logits: bool, shows_guess: bool) -> Option<JointRule> {
        match self {
            Joint::Auto => (!shift_logits && !shows_guess).then(JointRule::default),
            Joint::Off => None,
            Joint::On(r) => Some(r),
        }
    }
}

impl std::str::FromStr for Joint {
    type Err = DecodeError;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "auto" => Ok(Joint::Auto),
            "off" => Ok(Joint::Off),
            "on" => Ok(Joint::On(JointRule::default())),
            other => Err(DecodeError::param(
                "joint",
                format!("`{other}` is not auto, on or off"),
            )),
        }
    }
}
