//! Final text as it grows, for streaming.
//!
//! A diffusion decoder does not write left to right, and under staged stabilization (`mbsd`) a
//! token already decided can still be revised. [`StepEvent::final_len`] says how much of the
//! generated canvas is final; [`FinalTextStream`] turns that growing prefix into text deltas, in
//! the spirit of candle-examples' `TokenOutputStream`: it decodes only a short window of the
//! latest tokens (the tokenizer decides spaces and merges from context, so the window starts at
//! the previous delta) and holds back a delta that ends in the middle of a character (a U+FFFD from
//! a partial UTF-8 sequence) until the next token completes it. Text stops at the first stop id
//! (EOS / EoT).
//!
//! The decoding function is the caller's (usually `TextTokenizer::decode(ids, true)`): this crate
//! knows no tokenizer.
//!
//! ```
//! use dllm_decode::stream::FinalTextStream;
//! // A toy tokenizer: id n is the word "w{n}", words joined by spaces; 0 is EOS.
//! let decode = |ids: &[u32]| -> Result<String, std::convert::Infallible> {
//!     Ok(ids.iter().map(|i| format!("w{i}")).collect::<Vec<_>>().join(" "))
//! };
//! let mut s = FinalTextStream::new(decode, vec![0]);
//! assert_eq!(s.extend(&[1, 2]).unwrap(), "w1 w2");
//! assert_eq!(s.extend(&[1, 2, 3]).unwrap(), " w3");
//! assert_eq!(s.finish(&[1, 2, 3, 4, 0, 0]).unwrap(), " w4");
//! assert_eq!(s.text(), "w1 w2 w3 w4");
//! assert!(s.ended());
//! ```
//!
//! [`StepEvent::final_len`]: crate::StepEvent::final_len

use crate::observer::StepEvent;

/// Text deltas of the final prefix of a generation (see the [module docs](self)).
pub struct FinalTextStream<D> {
    decode: D,
    stop_ids: Vec<u32>,
    /// Final answer tokens consumed so far (before any stop id).
    tokens: Vec<u32>,
    /// Start of the decoding window: the tokens of the previous delta start here.
    prev_index: usize,
    /// End of the tokens already turned into text.
    current_index: usize,
    /// Text emitted so far.
    text: String,
    /// A stop id was reached: nothing after it is text.
    ended: bool,
}

impl<D, E> FinalTextStream<D>
where
    D: FnMut(&[u32]) -> Result<String, E>,
{
    /// A stream that decodes with `decode` and ends at the first of `stop_ids`.
    pub fn new(decode: D, stop_ids: Vec<u32>) -> Self {
        Self {
            decode,
            stop_ids,
            tokens: Vec::new(),
            prev_index: 0,
            current_index: 0,
            text: String::new(),
            ended: false,
        }
    }

    /// The text that became final in this step (often empty).
    pub fn step(&mut self, e: &StepEvent<'_>) -> Result<String, E> {
        let end = (e.prompt_len + e.final_len).min(e.canvas.len());
        self.extend(&e.canvas[e.prompt_len.min(end)..end])
    }

    /// The text of `final_ids` (the final prefix of the generated positions, which only grows)
    /// beyond what was already returned.
    pub fn extend(&mut self, final_ids: &[u32]) -> Result<String, E> {
        let mut out = String::new();
        let mut k = self.tokens.len();
        while !self.ended && k < final_ids.len() {
            let t = final_ids[k];
            k += 1;
            if self.stop_ids.contains(&t) {
                self.ended = true;
                break;
            }
            out.push_str(&self.next_token(t)?);
        }
        Ok(out)
    }

    /// The rest of the text once the generation has returned (`generated`: every generated
    /// position; all of it is final now), including a held-back partial character.
    pub fn finish(&mut self, generated: &[u32]) -> Result<String, E> {
        let mut out = self.extend(generated)?;
        self.ended = true;
        if self.current_index < self.tokens.len() {
            let prev = (self.decode)(&self.tokens[self.prev_index..self.current_index])?;
            let all = (self.decode)(&self.tokens[self.prev_index..])?;
            if all.len() > prev.len() && all.is_char_boundary(prev.len()) {
                let rest = &all[prev.len()..];
                out.push_str(rest);
                self.text.push_str(rest);
            }
            self.current_index = self.tokens.len();
        }
        Ok(out)
    }

    /// Everything returned so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The final answer tokens consumed so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Whether a stop id (or [`finish`](Self::finish)) ended the text.
    pub fn ended(&self) -> bool {
        self.ended
    }

    fn next_token(&mut self, t: u32) -> Result<String, E> {
        let prev = if self.current_index > self.prev_index {
            (self.decode)(&self.tokens[self.prev_index..self.current_index])?
        } else {
            String::new()
        };
        self.tokens.push(t);
        let text = (self.decode)(&self.tokens[self.prev_index..])?;
        if text.len() > prev.len()
            && text.is_char_boundary(prev.len())
            && text.starts_with(&prev)
            && !text.ends_with('\u{FFFD}')
        {
            let delta = text[prev.len()..].to_string();
            self.prev_index = self.current_index;
            self.current_index = self.tokens.len();
            self.text.push_str(&delta);
            Ok(delta)
        } else {
            Ok(String::new())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::states::TokenState;

    /// A byte-level toy tokenizer: ids 10.. are single bytes (id - 10), decoded lossily, with the
    /// first leading space stripped (as the task-suite tokenizers' decoder does).
    fn decode(ids: &[u32]) -> Result<String, String> {
        if let Some(bad) = ids.iter().find(|&&i| !(10..266).contains(&i)) {
            return Err(format!("id {bad}"));
        }
        let bytes: Vec<u8> = ids.iter().map(|&i| (i - 10) as u8).collect();
        let s = String::from_utf8_lossy(&bytes).into_owned();
        Ok(s.strip_prefix(' ').map(str::to_string).unwrap_or(s))
    }

    fn ids(s: &str) -> Vec<u32> {
        s.bytes().map(|b| b as u32 + 10).collect()
    }

    #[test]
    fn deltas_add_up_to_the_text_whatever_the_step_sizes() {
        let answer = " héllo wörld, 28. Answer: 28";
        let all = ids(answer);
        for step in 1..6 {
            let mut s = FinalTextStream::new(decode, vec![3]);
            let mut got = String::new();
            let mut n = 0;
            while n < all.len() {
                n = (n + step).min(all.len());
                let d = s.extend(&all[..n]).unwrap();
                assert!(!d.contains('\u{FFFD}'), "a split character leaked: {d:?}");
                got.push_str(&d);
            }
            got.push_str(&s.finish(&all).unwrap());
            assert_eq!(got, answer.trim_start(), "step {step}");
            assert_eq!(s.text(), got);
        }
    }

    #[test]
    fn text_ends_at_the_first_stop_id() {
        let mut g = ids(" 23 + 5");
        g.push(3);
        g.extend(ids(" junk"));
        let mut s = FinalTextStream::new(decode, vec![3]);
        assert_eq!(s.extend(&g[..3]).unwrap(), "23");
        let d = s.extend(&g).unwrap();
        assert_eq!(d, " + 5");
        assert!(s.ended());
        assert_eq!(s.finish(&g).unwrap(), "");
        assert_eq!(s.tokens(), &ids(" 23 + 5")[..]);
    }

    #[test]
    fn events_feed_the_final_prefix_only() {
        // prompt of 2, then "ab" final, "c" visible (revisable), a masked position.
        let mut canvas = vec![10, 11];
        canvas.extend(ids("abc"));
        canvas.push(5);
        use TokenState::*;
        let states = [Stable, Stable, Stable, Stable, Visible, Invisible];
        let e = StepEvent {
            step: 0,
            block: 0,
            num_blocks: 1,
            forwards: 1,
            canvas: &canvas,
            prompt_len: 2,
            unmasked: &[],
            confidences: &[],
            revised: &[],
            remasked: &[],
            verified: &[],
            window: 0..6,
            masked_left: 1,
            mask_id: 5,
            states: &states,
            final_len: crate::observer::final_prefix(&states, 2),
            tentative: &[],
            guess: None,
        };
        assert_eq!(e.final_len, 2);
        let mut s = FinalTextStream::new(decode, vec![3]);
        assert_eq!(s.step(&e).unwrap(), "ab");
        // The decoder's errors come through.
        let mut bad = FinalTextStream::new(decode, vec![3]);
        assert_eq!(bad.extend(&[300]).unwrap_err(), "id 300");
    }
}
