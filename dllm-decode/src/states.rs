//! Staged token stabilization (paper §3.3): every generated position is [`TokenState::Invisible`],
//! [`TokenState::Visible`] or [`TokenState::Stable`], and changes state only through
//! [`transition`]. An impossible event for a state is an error, never a silent no-op.
//!
//! * Invisible: undecided (masked, or a prediction below `theta_visible`); not context.
//! * Visible: a concrete token used as context by later forwards, still tentative: verification
//!   may send it back to the mask (never to another token) while its confidence stays below
//!   `theta_stable`.
//! * Stable: final; its K/V are reused for good and it needs no more logits.

use std::fmt;

/// The state of one generated position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenState {
    /// Undecided.
    Invisible,
    /// Decided for now, used as context, still revisable.
    Visible,
    /// Final.
    Stable,
}

/// What happened to a position.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TokenEvent {
    /// A forward predicted this undecided position with this confidence.
    Predicted(f64),
    /// Nothing in a step reached `theta_visible`; this was its most confident candidate.
    Promoted,
    /// A verification (shadow row) re-scored this visible position, masked, with this
    /// probability of its token.
    Rescored(f64),
    /// A lookahead draft was accepted for this undecided position when its block became current.
    Drafted,
    /// Verification sent this visible position back to the mask.
    Remasked,
}

/// The two thresholds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    /// Confidence at which a prediction becomes visible context (paper default 0.7).
    pub visible: f64,
    /// Confidence at which a token becomes final (paper default 0.9).
    pub stable: f64,
}

/// An event that the state does not admit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InvalidTransition {
    /// The state.
    pub from: TokenState,
    /// The event.
    pub event: TokenEvent,
}

impl fmt::Display for InvalidTransition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "token state {:?} does not admit {:?}",
            self.from, self.event
        )
    }
}

impl std::error::Error for InvalidTransition {}

/// The one transition function.
pub fn transition(
    from: TokenState,
    event: TokenEvent,
    t: Thresholds,
) -> Result<TokenState, InvalidTransition> {
    use TokenEvent as E;
    use TokenState as S;
    let bad = Err(InvalidTransition { from, event });
    match (from, event) {
        (S::Invisible, E::Predicted(c)) if c >= t.stable => Ok(S::Stable),
        (S::Invisible, E::Predicted(c)) if c >= t.visible => Ok(S::Visible),
        (S::Invisible, E::Predicted(_)) => Ok(S::Invisible),
        (S::Invisible, E::Promoted | E::Drafted) => Ok(S::Visible),
        (S::Visible, E::Rescored(c)) if c >= t.stable => Ok(S::Stable),
        (S::Visible, E::Rescored(_)) => Ok(S::Visible),
        (S::Visible, E::Remasked) => Ok(S::Invisible),
        (S::Invisible, E::Rescored(_) | E::Remasked)
        | (S::Visible, E::Predicted(_) | E::Promoted | E::Drafted)
        | (S::Stable, _) => bad,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TokenEvent as E;
    use TokenState as S;

    const T: Thresholds = Thresholds {
        visible: 0.7,
        stable: 0.9,
    };

    #[test]
    fn transition_table() {
        let ok: &[(TokenState, TokenEvent, TokenState)] = &[
            (S::Invisible, E::Predicted(0.95), S::Stable),
            (S::Invisible, E::Predicted(0.9), S::Stable),
            (S::Invisible, E::Predicted(0.8), S::Visible),
            (S::Invisible, E::Predicted(0.7), S::Visible),
            (S::Invisible, E::Predicted(0.69), S::Invisible),
            (S::Invisible, E::Predicted(f64::NAN), S::Invisible),
            (S::Invisible, E::Promoted, S::Visible),
            (S::Visible, E::Rescored(0.91), S::Stable),
            (S::Visible, E::Rescored(0.5), S::Visible),
            (S::Visible, E::Rescored(f64::NAN), S::Visible),
            (S::Invisible, E::Drafted, S::Visible),
            (S::Visible, E::Remasked, S::Invisible),
        ];
        for &(from, ev, to) in ok {
            assert_eq!(transition(from, ev, T), Ok(to), "{from:?} + {ev:?}");
        }
        let bad: &[(TokenState, TokenEvent)] = &[
            (S::Invisible, E::Rescored(0.95)),
            (S::Visible, E::Predicted(0.95)),
            (S::Visible, E::Promoted),
            (S::Stable, E::Predicted(0.95)),
            (S::Stable, E::Promoted),
            (S::Stable, E::Rescored(0.1)),
            (S::Invisible, E::Remasked),
            (S::Visible, E::Drafted),
            (S::Stable, E::Remasked),
            (S::Stable, E::Drafted),
        ];
        for &(from, ev) in bad {
            let e = transition(from, ev, T).unwrap_err();
            assert_eq!((e.from, e.event), (from, ev));
            assert!(e.to_string().contains("does not admit"));
        }
    }
}
