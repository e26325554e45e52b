//! Mutators: byte-level (bit flips, interesting integers, truncation, insertion, deletion,
//! duplication) and structure-aware (JSON values replaced by hostile ones, keys removed or
//! added; safetensors headers rewritten as JSON; GGUF metadata values and tensor descriptors
//! overwritten in place), all driven by one seeded generator so a run is reproducible.

use serde_json::Value;

/// SplitMix64: tiny, fast, and the same stream on every platform.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
    /// True with probability `1/n`.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }
    /// A random element.
    pub fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len())]
    }
}

/// Integers that break size arithmetic.
pub const INTERESTING: [u64; 20] = [
    0,
    1,
    2,
    3,
    7,
    31,
    32,
    33,
    255,
    256,
    65535,
    65536,
    1 << 31,
    (1 << 32) - 1,
    (1 << 32) + 5,
    1_000_000_000,
    1 << 40,
    1_000_000_000_000_000_000,
    i64::MAX as u64,
    u64::MAX,
];

/// Apply 1 to 8 byte-level edits (mostly 1 to 4; edits that change the length are rarer than
/// in-place ones, so that mutants of binary files get past the size checks often).
pub fn bytes(rng: &mut Rng, data: &mut Vec<u8>, what: &mut String) {
    let n = 1 + if rng.one_in(4) {
        rng.below(8)
    } else {
        rng.below(4)
    };
    for _ in 0..n {
        if data.is_empty() {
            data.push(rng.next_u64() as u8);
            continue;
        }
        let at = rng.below(data.len());
        match rng.below(14) {
            0..=3 => {
                data[at] ^= 1 << rng.below(8);
                what.push_str(&format!(" flip@{at}"));
            }
            4 | 5 => {
                data[at] = *rng.pick(&[0u8, 0xff, 0x7f, 0x80, 0x7c, b'"', b'{', b'9']);
                what.push_str(&format!(" byte@{at}"));
            }
            6 | 7 => {
                let v = *rng.pick(&INTERESTING);
                let w = *rng.pick(&[4usize, 8]);
                let end = (at + w).min(data.len());
                let b = v.to_le_bytes();
                data[at..end].copy_from_slice(&b[..end - at]);
                what.push_str(&format!(" int{w}@{at}={v}"));
            }
            8 => {
                data.truncate(at);
                what.push_str(&format!(" trunc@{at}"));
            }
            9 => {
                let k = 1 + rng.below(16);
                let ins: Vec<u8> = (0..k).map(|_| rng.next_u64() as u8).collect();
                data.splice(at..at, ins);
                what.push_str(&format!(" ins{k}@{at}"));
            }
            10 => {
                let end = (at + 1 + rng.below(64)).min(data.len());
                data.drain(at..end);
                what.push_str(&format!(" del@{at}..{end}"));
            }
            11 => {
                let end = (at + 1 + rng.below(64)).min(data.len());
                let chunk = data[at..end].to_vec();
                let to = rng.below(data.len());
                data.splice(to..to, chunk);
                what.push_str(&format!(" dup@{at}..{end}->{to}"));
            }
            _ => {
                // A float that is NaN, infinite or huge, at a 4-byte boundary (weights).
                let at = at & !3;
                if at + 4 <= data.len() {
                    let f = *rng.pick(&[f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 3e38, -1e30]);
                    data[at..at + 4].copy_from_slice(&f.to_le_bytes());
                    what.push_str(&format!(" f32@{at}={f}"));
                }
            }
        }
    }
}

/// A hostile JSON value.
fn hostile_value(rng: &mut Rng) -> Value {
    match rng.below(10) {
        0..=3 => Value::from(*rng.pick(&INTERESTING)),
        4 => Value::from(-(rng.below(1 << 20) as i64) - 1),
        5 => Value::from(*rng.pick(&[0.5f64, -0.0, 1e-300, 1e300, -1e308, 2.5e9])),
        6 => Value::from(*rng.pick(&["", "NaN", "inf", "-1", "1e9", "llada", "dream", "gpt2"])),
        7 => Value::Bool(rng.one_in(2)),
        8 => Value::Null,
        _ => match rng.below(3) {
            0 => Value::Array(vec![Value::from(1), Value::from("x")]),
            1 => serde_json::json!({"type": "linear", "factor": 2.0}),
            _ => Value::Array(vec![]),
        },
    }
}

/// Paths to every value of `v` (object keys and array indices).
fn paths(v: &Value, prefix: &mut Vec<PathPart>, out: &mut Vec<Vec<PathPart>>, depth: usize) {
    if depth > 6 || out.len() > 4096 {
        return;
    }
    match v {
        Value::Object(m) => {
            for (k, c) in m {
                prefix.push(PathPart::Key(k.clone()));
                out.push(prefix.clone());
                paths(c, prefix, out, depth + 1);
                prefix.pop();
            }
        }
        Value::Array(a) => {
            for (i, c) in a.iter().enumerate().take(64) {
                prefix.push(PathPart::Index(i));
                out.push(prefix.clone());
                paths(c, prefix, out, depth + 1);
                prefix.pop();
            }
        }
        _ => {}
    }
}

#[derive(Debug, Clone)]
enum PathPart {
    Key(String),
    Index(usize),
}

fn get_mut<'a>(v: &'a mut Value, path: &[PathPart]) -> Option<&'a mut Value> {
    let mut cur = v;
    for p in path {
        cur = match p {
            PathPart::Key(k) => cur.as_object_mut()?.get_mut(k)?,
            PathPart::Index(i) => cur.as_array_mut()?.get_mut(*i)?,
        };
    }
    Some(cur)
}

/// Structure-aware JSON mutation: 1 to 3 edits of values and keys; `None` if `data` is not JSON.
pub fn json(rng: &mut Rng, data: &[u8], what: &mut String) -> Option<Vec<u8>> {
    let mut v: Value = serde_json::from_slice(data).ok()?;
    for _ in 0..1 + rng.below(3) {
        let mut all = Vec::new();
        paths(&v, &mut Vec::new(), &mut all, 0);
        if all.is_empty() {
            break;
        }
        let path = rng.pick(&all).clone();
        let label = format!("{path:?}");
        match rng.below(6) {
            0..=2 => {
                if let Some(slot) = get_mut(&mut v, &path) {
                    *slot = hostile_value(rng);
                    what.push_str(&format!(" set {label}={slot}"));
                }
            }
            3 => {
                let (last, parent) = path.split_last()?;
                if let (Some(p), PathPart::Key(k)) = (get_mut(&mut v, parent), last) {
                    if let Some(m) = p.as_object_mut() {
                        m.remove(k);
                        what.push_str(&format!(" del {label}"));
                    }
                }
            }
            4 => {
                // Copy one value over another (a shape into an offset, a name into a number...).
                let src = get_mut(&mut v, rng.pick(&all).as_slice()).map(|s| s.clone());
                if let (Some(src), Some(slot)) = (src, get_mut(&mut v, &path)) {
                    *slot = src;
                    what.push_str(&format!(" copy->{label}"));
                }
            }
            _ => {
                if let Some(m) =
                    get_mut(&mut v, &path[..path.len() - 1]).and_then(|p| p.as_object_mut())
                {
                    let k = rng
                        .pick(&[
                            "weight_tying",
                            "tie_word_embeddings",
                            "rope_scaling",
                            "use_sliding_window",
                            "qkv_bias",
                            "__metadata__",
                            "sliding_window",
                        ])
                        .to_string();
                    m.insert(k.clone(), hostile_value(rng));
                    what.push_str(&format!(" add {k}"));
                }
            }
        }
    }
    serde_json::to_vec(&v).ok()
}

/// A safetensors file with its JSON header mutated structurally (the length prefix rewritten,
/// or occasionally left stale).
pub fn safetensors_header(rng: &mut Rng, data: &[u8], what: &mut String) -> Option<Vec<u8>> {
    let n = u64::from_le_bytes(data.get(..8)?.try_into().ok()?) as usize;
    let header = data.get(8..8usize.checked_add(n)?)?;
    let new = json(rng, header, what)?;
    let len = if rng.one_in(8) {
        what.push_str(" stale-len");
        n as u64
    } else {
        new.len() as u64
    };
    let mut out = len.to_le_bytes().to_vec();
    out.extend(&new);
    out.extend(&data[8 + n..]);
    Some(out)
}

/// Positions of GGUF header fields worth overwriting: each metadata value (after its key and
/// type) and each tensor's dims/type/offset (after its name). Found by searching the key and
/// tensor names, which are plain ASCII in the header.
pub fn gguf_fields(data: &[u8]) -> Vec<(usize, &'static str)> {
    let mut out = Vec::new();
    let header_end = data.len().min(1 << 16);
    let hay = &data[..header_end];
    let keys = [
        "general.architecture",
        "general.alignment",
        "block_count",
        "context_length",
        "embedding_length",
        "feed_forward_length",
        "attention.head_count",
        "attention.head_count_kv",
        "attention.layer_norm_rms_epsilon",
        "rope.freq_base",
        "vocab_size",
        "mask_token_id",
        "eos_token_id",
        "bos_token_id",
        "shift_logits",
        "attention.causal",
    ];
    for k in keys {
        let kb = k.as_bytes();
        let mut from = 0;
        while let Some(p) = hay[from..].windows(kb.len()).position(|w| w == kb) {
            let at = from + p + kb.len();
            out.push((at, "type"));
            out.push((at + 4, "value"));
            from = at;
        }
    }
    for name in [".weight", ".bias"] {
        let nb = name.as_bytes();
        let mut from = 0;
        while let Some(p) = hay[from..].windows(nb.len()).position(|w| w == nb) {
            let at = from + p + nb.len();
            out.push((at, "n_dims"));
            out.push((at + 4, "dim0"));
            out.push((at + 12, "dim1"));
            out.push((at + 20, "type/offset"));
            from = at;
        }
    }
    out.retain(|(p, _)| *p < data.len());
    out
}

/// Overwrite 1 to 3 GGUF header fields with interesting integers or type codes.
pub fn gguf(rng: &mut Rng, data: &mut [u8], fields: &[(usize, &'static str)], what: &mut String) {
    if fields.is_empty() {
        return;
    }
    for _ in 0..1 + rng.below(3) {
        let (at, kind) = *rng.pick(fields);
        // An earlier edit of this input may have shortened the file.
        if at >= data.len() {
            continue;
        }
        let v: u64 = if kind == "type" || kind == "n_dims" {
            rng.below(40) as u64
        } else {
            *rng.pick(&INTERESTING)
        };
        let w = if kind == "type" || kind == "n_dims" || rng.one_in(2) {
            4
        } else {
            8
        };
        let end = (at + w).min(data.len());
        data[at..end].copy_from_slice(&v.to_le_bytes()[..end - at]);
        what.push_str(&format!(" gguf {kind}@{at}={v}"));
    }
}
