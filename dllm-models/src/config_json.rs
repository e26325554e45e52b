//! Typed access to `config.json` fields with errors that name the field.
//!
//! serde's derive reports a wrong type without the field name; reading fields one by one lets every
//! message say exactly which key is missing or malformed.

use std::path::Path;

use serde_json::{Map, Value};

use crate::lm::SpecialTokens;
use crate::{Error, Result};

fn not_an_object() -> Error {
    Error::InvalidJson {
        reason: "config is not a JSON object".into(),
    }
}

/// A parsed JSON object.
pub struct Fields {
    map: Map<String, Value>,
}

impl Fields {
    /// Read and parse `path`, which must hold a JSON object.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = crate::files::read_text(path, "JSON", crate::files::MAX_JSON_BYTES)?;
        Self::parse_str(&text).map_err(|e| match e {
            e @ Error::InvalidJson { .. } => Error::file(path, e),
            e => e,
        })
    }

    /// Read `path` and parse it with `parse`; field errors are reported with the file name.
    pub fn parse_file<T>(path: &Path, parse: impl FnOnce(&Fields) -> Result<T>) -> Result<T> {
        let f = Self::from_file(path)?;
        parse(&f).map_err(|e| match e {
            e @ (Error::MissingField { .. } | Error::InvalidField { .. }) => Error::file(path, e),
            e => e,
        })
    }

    /// The HF special-token fields: `mask_token_id` and `eos_token_id` (required), `bos_token_id`
    /// and `pad_token_id` (optional).
    pub fn special_tokens(&self) -> Result<SpecialTokens> {
        Ok(SpecialTokens {
            mask: self.token_id("mask_token_id")?,
            eos: self.token_id("eos_token_id")?,
            eot: None,
            bos: self.opt_token_id("bos_token_id")?,
            pad: self.opt_token_id("pad_token_id")?,
        })
    }

    /// `rope_scaling` absent or `null`: both models rotate with plain RoPE at `rope_theta`, and a
    /// scaled RoPE would silently compute something else (the same rule for LLaDA and Dream).
    pub fn require_no_rope_scaling(&self) -> Result<()> {
        match self.get("rope_scaling") {
            None => Ok(()),
            Some(v) => Err(Error::invalid(
                "rope_scaling",
                format!("{v} is not supported (only null)"),
            )),
        }
    }

    /// A parsed JSON value, which must be an object.
    pub fn from_value(v: Value) -> Result<Self> {
        match v {
            Value::Object(map) => Ok(Self { map }),
            _ => Err(not_an_object()),
        }
    }

    /// Parse a JSON object from text.
    pub fn parse_str(text: &str) -> Result<Self> {
        match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(map)) => Ok(Self { map }),
            Ok(_) => Err(not_an_object()),
            Err(e) => Err(Error::InvalidJson {
                reason: e.to_string(),
            }),
        }
    }

    /// Raw value, treating JSON `null` as absent.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// A required non-negative integer.
    pub fn usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?
            .ok_or_else(|| Error::MissingField { field: key.into() })
    }

    /// An optional non-negative integer.
    pub fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(|x| Some(x as usize)).ok_or_else(|| {
                Error::invalid(key, format!("expected a non-negative integer, found {v}"))
            }),
        }
    }

    /// A required token id (a non-negative integer, or the first of a list as in some HF configs).
    pub fn token_id(&self, key: &str) -> Result<u32> {
        self.opt_token_id(key)?
            .ok_or_else(|| Error::MissingField { field: key.into() })
    }

    /// An optional token id.
    pub fn opt_token_id(&self, key: &str) -> Result<Option<u32>> {
        let v = match self.get(key) {
            None => return Ok(None),
            Some(Value::Array(a)) => match a.first() {
                Some(v) => v,
                None => return Ok(None),
            },
            Some(v) => v,
        };
        v.as_u64()
            .filter(|&x| x <= u32::MAX as u64)
            .map(|x| Some(x as u32))
            .ok_or_else(|| Error::invalid(key, format!("expected a token id, found {v}")))
    }

    /// A required number.
    pub fn f64(&self, key: &str) -> Result<f64> {
        self.opt_f64(key)?
            .ok_or_else(|| Error::MissingField { field: key.into() })
    }

    /// An optional number.
    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| Error::invalid(key, format!("expected a number, found {v}"))),
        }
    }

    /// An optional boolean.
    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| Error::invalid(key, format!("expected true/false, found {v}"))),
        }
    }

    /// An optional string.
    pub fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| Error::invalid(key, format!("expected a string, found {v}"))),
        }
    }

    /// Error unless the optional boolean `key` is absent or equals `supported`.
    pub fn require_bool(&self, key: &str, supported: bool) -> Result<()> {
        match self.opt_bool(key)? {
            Some(v) if v != supported => Err(Error::invalid(
                key,
                format!("{v} is not supported (only {supported})"),
            )),
            _ => Ok(()),
        }
    }

    /// Error unless the optional string `key` is absent or one of `supported` (case-insensitive).
    pub fn require_str(&self, key: &str, supported: &[&str]) -> Result<()> {
        match self.opt_str(key)? {
            Some(v) if !supported.iter().any(|s| s.eq_ignore_ascii_case(v)) => Err(Error::invalid(
                key,
                format!(
                    "`{v}` is not supported (expected {})",
                    supported.join(" or ")
                ),
            )),
            _ => Ok(()),
        }
    }
}
