//! Tokenizers and chat templates.
//!
//! The template is chosen from the tokenizer's vocabulary, so it follows the tokenizer actually in
//! use rather than the model family:
//! * LLaDA-8B-Instruct (Llama-3 style): `<|startoftext|>` once, then per message
//!   `<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>`; generation prompt
//!   `<|start_header_id|>assistant<|end_header_id|>\n\n` (content trimmed, as the checkpoint's
//!   `tokenizer_config.json` template does).
//! * Dream (Qwen2 style): `<|im_start|>{role}\n{content}<|im_end|>\n`, a default system message
//!   "You are a helpful assistant." when none is given; generation prompt `<|im_start|>assistant\n`.
//! * Anything else (e.g. the project's task-suite models): the user message alone, with the
//!   tokenizer's own post-processor adding its special tokens.

use std::path::Path;

use crate::{Error, Result};

/// A chat message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// Text.
    pub content: String,
}

impl Message {
    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self {
            role: "user".into(),
            content: content.into(),
        }
    }
}

/// The prompt format a tokenizer expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChatTemplate {
    /// LLaDA-8B-Instruct's Llama-3 style headers.
    Llada,
    /// Qwen2 / Dream `<|im_start|>` turns.
    Qwen,
    /// No template: the user text with the tokenizer's post-processor specials.
    Plain,
}

/// A Hugging Face tokenizer plus its chat template.
#[derive(Clone)]
pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    template: ChatTemplate,
    /// `inner` with special tokens encoded as text (built on first use).
    as_text: std::sync::OnceLock<tokenizers::Tokenizer>,
    /// The chat template text the tokenizer came with (a GGUF's `tokenizer.chat_template`).
    template_source: Option<String>,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("vocab", &self.inner.get_vocab_size(true))
            .field("template", &self.template)
            .finish()
    }
}

impl TextTokenizer {
    /// Load a `tokenizer.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let bytes =
            crate::files::read_limited(path, "tokenizer", crate::files::MAX_TOKENIZER_BYTES)?;
        Self::from_bytes(&bytes).map_err(|e| Error::file(path, format!("invalid tokenizer: {e}")))
    }

    /// Parse a `tokenizer.json` held in memory.
    pub fn from_bytes(bytes: &[u8]) -> std::result::Result<Self, String> {
        let inner =
            guarded(|| tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| e.to_string()))?;
        Ok(Self::new(inner))
    }

    /// One past the largest id the tokenizer spells (vocabulary and added tokens).
    pub fn id_bound(&self) -> usize {
        self.inner
            .get_vocab(true)
            .values()
            .map(|&id| id as usize + 1)
            .max()
            .unwrap_or(0)
    }

    /// Wrap a tokenizer, detecting its chat template.
    pub fn new(inner: tokenizers::Tokenizer) -> Self {
        let template = if inner.token_to_id("<|start_header_id|>").is_some() {
            ChatTemplate::Llada
        } else if inner.token_to_id("<|im_start|>").is_some() {
            ChatTemplate::Qwen
        } else {
            ChatTemplate::Plain
        };
        Self {
            inner,
            template,
            as_text: std::sync::OnceLock::new(),
            template_source: None,
        }
    }

    /// Keep the chat template text the tokenizer came with (a GGUF's `tokenizer.chat_template`).
    pub fn with_chat_template_source(mut self, source: Option<String>) -> Self {
        self.template_source = source;
        self
    }

    /// The chat template text the tokenizer came with, as written (a GGUF's
    /// `tokenizer.chat_template`; `None` for a `tokenizer.json`). It is not executed: prompts are
    /// framed by the template found in the vocabulary ([`Self::template`]).
    pub fn chat_template_source(&self) -> Option<&str> {
        self.template_source.as_deref()
    }

    /// Whether the vocabulary carries a chat template's special tokens (LLaDA's or Qwen2's);
    /// without one, `encode_prompt(.., chat = true)` encodes the prompt as written.
    pub fn has_chat_template(&self) -> bool {
        self.template != ChatTemplate::Plain
    }

    /// The chat template found in the vocabulary.
    pub fn template(&self) -> ChatTemplate {
        self.template
    }

    /// The underlying tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Id of a token string.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Encode text; `add_special` applies the tokenizer's post-processor (BOS etc.).
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let enc = guarded(|| {
            self.inner
                .encode(text, add_special)
                .map_err(|e| e.to_string())
        })
        .map_err(Error::Tokenizer)?;
        Ok(enc.get_ids().to_vec())
    }

    /// Decode ids; `skip_special` drops special tokens.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        guarded(|| {
            self.inner
                .decode(ids, skip_special)
                .map_err(|e| e.to_string())
        })
        .map_err(Error::Tokenizer)
    }

    /// Render messages with the chat template (as text, specials spelled out).
    pub fn render_chat(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let mut s = String::new();
        match self.template {
            ChatTemplate::Llada => {
                s.push_str("<|startoftext|>");
                for m in messages {
                    s.push_str(&format!(
                        "<|start_header_id|>{}<|end_header_id|>\n\n{}<|eot_id|>",
                        m.role,
                        m.content.trim()
                    ));
                }
                if add_generation_prompt {
                    s.push_str("<|start_header_id|>assistant<|end_header_id|>\n\n");
                }
            }
            ChatTemplate::Qwen => {
                if messages.first().map(|m| m.role != "system").unwrap_or(true) {
                    s.push_str("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n");
                }
                for m in messages {
                    s.push_str(&format!(
                        "<|im_start|>{}\n{}<|im_end|>\n",
                        m.role, m.content
                    ));
                }
                if add_generation_prompt {
                    s.push_str("<|im_start|>assistant\n");
                }
            }
            ChatTemplate::Plain => {
                let users: Vec<&str> = messages.iter().map(|m| m.content.as_str()).collect();
                s.push_str(&users.join("\n"));
            }
        }
        Ok(s)
    }

    /// Encode text a user typed: special-token strings in it (`[MASK]`, `<eos>`, `<|eot_id|>`)
    /// are text, never control tokens, as Hugging Face's `split_special_tokens` does for untrusted
    /// input; `add_special` still applies the post-processor (BOS etc.).
    pub fn encode_user_text(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let tok = self.as_text.get_or_init(|| {
            let mut t = self.inner.clone();
            t.set_encode_special_tokens(true);
            t
        });
        let enc = guarded(|| tok.encode(text, add_special).map_err(|e| e.to_string()))
            .map_err(Error::Tokenizer)?;
        Ok(enc.get_ids().to_vec())
    }

    /// Token ids of a prompt: with `chat`, the user message through the chat template (with the
    /// generation prompt); without, the raw text with the tokenizer's post-processor specials. The
    /// prompt's own text is encoded with [`Self::encode_user_text`]: typing `[MASK]` or `<eos>`
    /// gives their characters, never the control ids (only the template's own tokens are special).
    pub fn encode_prompt(&self, prompt: &str, chat: bool) -> Result<Vec<u32>> {
        if !chat || self.template == ChatTemplate::Plain {
            return self.encode_user_text(prompt, true);
        }
        self.encode_chat(&[Message::user(prompt)])
    }

    /// Token ids of a conversation through the chat template, ending with the assistant's
    /// generation prompt (without a template: the messages' text, joined by newlines, with the
    /// post-processor specials). The messages' text is encoded with [`Self::encode_user_text`]
    /// (typed specials are text); only the template's own tokens are special.
    pub fn encode_chat(&self, messages: &[Message]) -> Result<Vec<u32>> {
        if self.template == ChatTemplate::Plain {
            return self.encode_user_text(&self.render_chat(messages, true)?, true);
        }
        // The template rendered around placeholders (so no message text can be taken for part
        // of the frame), then each piece of frame encoded with its specials and each message's
        // text as text. (The template already spells out BOS: the post-processor adds none.)
        let slots: Vec<String> = (0..messages.len())
            .map(|i| format!("\u{0}message {i}\u{0}"))
            .collect();
        let framed: Vec<Message> = messages
            .iter()
            .zip(&slots)
            .map(|(m, slot)| Message {
                role: m.role.clone(),
                content: slot.clone(),
            })
            .collect();
        let frame = self.render_chat(&framed, true)?;
        let mut rest = frame.as_str();
        let mut ids = Vec::new();
        for (m, slot) in messages.iter().zip(&slots) {
            let (before, after) = rest
                .split_once(slot.as_str())
                .ok_or_else(|| Error::Tokenizer("the chat template lost a message".into()))?;
            let content = match self.template {
                ChatTemplate::Llada => m.content.trim(),
                _ => m.content.as_str(),
            };
            ids.extend(self.encode(before, false)?);
            ids.extend(self.encode_user_text(content, false)?);
            rest = after;
        }
        ids.extend(self.encode(rest, false)?);
        Ok(ids)
    }

    /// The end-of-turn token of the template, if the vocabulary has it.
    pub fn eot_id(&self) -> Option<u32> {
        match self.template {
            ChatTemplate::Llada => self.token_id("<|eot_id|>"),
            ChatTemplate::Qwen => self.token_id("<|im_end|>"),
            ChatTemplate::Plain => None,
        }
    }
}

/// Run a `tokenizers` call, turning a panic inside it into an error: that crate panics on some
/// malformed `tokenizer.json` files (e.g. inconsistent merges or normalizer data) instead of
/// returning its error, and a bad file must not abort the program.
pub(crate) fn guarded<T>(
    f: impl FnOnce() -> std::result::Result<T, String>,
) -> std::result::Result<T, String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => Err(format!(
            "the tokenizers library failed on this file: {}",
            p.downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| p.downcast_ref::<&str>().copied())
                .unwrap_or("(no message)")
        )),
    }
}
