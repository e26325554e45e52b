//! The bidirectional llama-style transformer shared by LLaDA and Dream, with the windowed forward,
//! pending K/V, commit and sparse refresh of [`DiffusionLm`].
//!
//! LLaDA and Dream are the same block (pre-RMSNorm, RoPE attention, SwiGLU MLP); they differ in
//! tensor names, q/k/v biases, GQA and the logit shift, all captured by [`TransformerConfig`].

use std::ops::Range;

use candle_core::{DType, Device, Tensor};

use crate::kv_cache::KvCache;
use crate::layers::{
    attention_on, swiglu, Backend, Embedding, Linear, OpMode, Param, RmsNorm, Rope,
};
use crate::lm::{Arch, DiffusionLm, ModelInfo, Refresh, Rows, SpecialTokens};
use crate::weights::{Role, WeightSource};
use crate::{Error, Result};

/// Architecture hyper-parameters, normalised from either model's config.
#[derive(Debug, Clone, PartialEq)]
pub struct TransformerConfig {
    /// Model family.
    pub arch: Arch,
    /// Hidden size.
    pub hidden_size: usize,
    /// Blocks.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// MLP hidden size.
    pub intermediate_size: usize,
    /// Rows of the embedding table and of the LM head.
    pub vocab_size: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// q/k/v projections carry biases.
    pub qkv_bias: bool,
    /// The LM head is the embedding table.
    pub tie_word_embeddings: bool,
    /// Logits are shifted by one position.
    pub shift_logits: bool,
    /// Longest canvas.
    pub max_seq_len: usize,
    /// Special tokens.
    pub special: SpecialTokens,
}

impl TransformerConfig {
    /// Every parameter with its shape (checkpoint `[out, in]` for matrices), in a fixed order.
    pub fn param_shapes(&self) -> Vec<(Role, Vec<usize>)> {
        let cfg = self;
        let (h, hd) = (cfg.hidden_size, cfg.head_dim());
        let (nq, nkv, ff, v) = (
            cfg.num_heads * hd,
            cfg.num_kv_heads * hd,
            cfg.intermediate_size,
            cfg.vocab_size,
        );
        let mut roles: Vec<(Role, Vec<usize>)> =
            vec![(Role::Embed, vec![v, h]), (Role::FinalNorm, vec![h])];
        if !cfg.tie_word_embeddings {
            roles.push((Role::Head, vec![v, h]));
        }
        for i in 0..cfg.num_layers {
            roles.extend([
                (Role::AttnNorm(i), vec![h]),
                (Role::Q(i), vec![nq, h]),
                (Role::K(i), vec![nkv, h]),
                (Role::V(i), vec![nkv, h]),
                (Role::O(i), vec![h, nq]),
                (Role::FfnNorm(i), vec![h]),
                (Role::Gate(i), vec![ff, h]),
                (Role::Up(i), vec![ff, h]),
                (Role::Down(i), vec![h, ff]),
            ]);
            if cfg.qkv_bias {
                roles.extend([
                    (Role::QBias(i), vec![nq]),
                    (Role::KBias(i), vec![nkv]),
                    (Role::VBias(i), vec![nkv]),
                ]);
            }
        }
        roles
    }

    /// Head dimension.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }

    /// Check internal consistency; `field` names are the architecture's config keys.
    pub fn validate(&self, names: &ConfigNames) -> Result<()> {
        let pos = |v: usize, f: &str| {
            if v == 0 {
                Err(Error::invalid(f, "must be positive"))
            } else {
                Ok(())
            }
        };
        pos(self.hidden_size, names.hidden)?;
        pos(self.num_layers, names.layers)?;
        pos(self.num_heads, names.heads)?;
        pos(self.num_kv_heads, names.kv_heads)?;
        pos(self.intermediate_size, names.ffn)?;
        pos(self.vocab_size, names.vocab)?;
        pos(self.max_seq_len, names.max_len)?;
        if !self.hidden_size.is_multiple_of(self.num_heads) {
            return Err(Error::invalid(
                names.heads,
                format!(
                    "{} heads do not divide {} = {}",
                    self.num_heads, names.hidden, self.hidden_size
                ),
            ));
        }
        if !self.head_dim().is_multiple_of(2) {
            return Err(Error::invalid(
                names.heads,
                format!("head dimension {} must be even for RoPE", self.head_dim()),
            ));
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(Error::invalid(
                names.kv_heads,
                format!(
                    "{} key/value heads do not divide {} query heads",
                    self.num_kv_heads, self.num_heads
                ),
            ));
        }
        if !(self.rms_norm_eps > 0.0 && self.rms_norm_eps < 1.0) {
            return Err(Error::invalid(
                "rms_norm_eps",
                format!("{} is not in (0, 1)", self.rms_norm_eps),
            ));
        }
        if !self.rope_theta.is_finite() || self.rope_theta <= 1.0 {
            return Err(Error::invalid(
                "rope_theta",
                format!("{} must be a finite value > 1", self.rope_theta),
            ));
        }
        for (id, name) in [
            (self.special.mask, "mask_token_id"),
            (self.special.eos, "eos_token_id"),
        ] {
            if id as usize >= self.vocab_size {
                return Err(Error::invalid(
                    name,
                    format!("{id} is outside the vocabulary ({} rows)", self.vocab_size),
                ));
            }
        }
        Ok(())
    }
}

/// Config-file spellings of the fields [`TransformerConfig::validate`] reports on.
#[derive(Debug, Clone, Copy)]
pub struct ConfigNames {
    /// Hidden size key.
    pub hidden: &'static str,
    /// Layer count key.
    pub layers: &'static str,
    /// Head count key.
    pub heads: &'static str,
    /// KV head count key.
    pub kv_heads: &'static str,
    /// MLP size key.
    pub ffn: &'static str,
    /// Vocabulary key.
    pub vocab: &'static str,
    /// Max length key.
    pub max_len: &'static str,
}

#[derive(Debug)]
struct Block {
    attn_norm: RmsNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    ffn_norm: RmsNorm,
    gate: Linear,
    up: Linear,
    down: Linear,
}

/// The K/V of the last forward window, waiting to be committed.
#[derive(Debug)]
struct Pending {
    start: usize,
    end: usize,
    batch: usize,
    k: Vec<Tensor>,
    v: Vec<Tensor>,
}

/// LLaDA / Dream: a bidirectional transformer with a windowed forward and an explicit KV cache.
#[derive(Debug)]
pub struct DiffusionTransformer {
    cfg: TransformerConfig,
    info: ModelInfo,
    device: Device,
    mode: OpMode,
    backend: Backend,
    embed: Embedding,
    blocks: Vec<Block>,
    norm: RmsNorm,
    head: Linear,
    rope: Rope,
    cache: KvCache,
    pending: Option<Pending>,
}

fn dense(p: Param, role: Role) -> Result<Tensor> {
    match p {
        Param::Dense(t) => Ok(t),
        Param::Quant(q) => Ok(q
            .dequantize(&q.device())
            .map_err(|e| Error::InvalidArgument(format!("cannot dequantize {role:?}: {e}")))?),
    }
}

impl DiffusionTransformer {
    /// Build from a validated config and a weight source (CPU backend).
    pub fn new(cfg: TransformerConfig, w: &dyn WeightSource, mode: OpMode) -> Result<Self> {
        Self::new_on(cfg, w, mode, &Backend::Cpu)
    }

    /// Build on `backend`: with [`Backend::Hexagon`] the linear layers' weights are packed into
    /// NPU memory (where the device takes them) and the fused ops run on the NPU. The model code
    /// is the same as on the CPU; only the layers' backend differs.
    pub fn new_on(
        cfg: TransformerConfig,
        w: &dyn WeightSource,
        mode: OpMode,
        backend: &Backend,
    ) -> Result<Self> {
        if backend.hexagon().is_some() && mode != OpMode::Fused {
            return Err(Error::InvalidArgument(
                "the Hexagon backend runs inference only (OpMode::Fused): its ops have no backward pass"
                    .into(),
            ));
        }
        let (h, hd) = (cfg.hidden_size, cfg.head_dim());
        let (nq, nkv, ff, v) = (
            cfg.num_heads * hd,
            cfg.num_kv_heads * hd,
            cfg.intermediate_size,
            cfg.vocab_size,
        );
        let dtype = w.dtype();
        let device = w.device().clone();
        let eps = cfg.rms_norm_eps as f32;
        let norm = |role: Role| -> Result<RmsNorm> {
            Ok(RmsNorm::on_backend(
                dense(w.get(role, &[h])?, role)?,
                eps,
                backend,
            ))
        };
        let bias = |role: Role, n: usize| -> Result<Option<Tensor>> {
            if cfg.qkv_bias {
                Ok(Some(dense(w.get(role, &[n])?, role)?))
            } else {
                Ok(None)
            }
        };
        let prepare = |l: Linear| -> Result<Linear> {
            match mode {
                OpMode::Fused => l.for_inference(),
                OpMode::Differentiable => Ok(l),
            }
        };
        let lin = |role: Role, out: usize, inp: usize, b: Option<Tensor>| -> Result<Linear> {
            prepare(Linear::on_backend(w.get(role, &[out, inp])?, b, backend)?)
        };
        let mut blocks = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            blocks.push(Block {
                attn_norm: norm(Role::AttnNorm(i))?,
                q: lin(Role::Q(i), nq, h, bias(Role::QBias(i), nq)?)?,
                k: lin(Role::K(i), nkv, h, bias(Role::KBias(i), nkv)?)?,
                v: lin(Role::V(i), nkv, h, bias(Role::VBias(i), nkv)?)?,
                o: lin(Role::O(i), h, nq, None)?,
                ffn_norm: norm(Role::FfnNorm(i))?,
                gate: lin(Role::Gate(i), ff, h, None)?,
                up: lin(Role::Up(i), ff, h, None)?,
                down: lin(Role::Down(i), h, ff, None)?,
            });
        }
        let embed_p = w.get(Role::Embed, &[v, h])?;
        let head = if cfg.tie_word_embeddings {
            prepare(Linear::on_backend(embed_p.clone(), None, backend)?)?
        } else {
            lin(Role::Head, v, h, None)?
        };
        let embed = Embedding::new(embed_p, dtype);
        let norm_f = norm(Role::FinalNorm)?;
        let rope = Rope::new(
            cfg.rope_theta,
            hd,
            cfg.max_seq_len.min(4096),
            dtype,
            &device,
        )?;
        let num_params = cfg
            .param_shapes()
            .iter()
            .map(|(_, shape)| shape.iter().product::<usize>())
            .sum();
        let info = ModelInfo {
            arch: cfg.arch,
            vocab_size: v,
            hidden_size: h,
            num_layers: cfg.num_layers,
            num_heads: cfg.num_heads,
            num_kv_heads: cfg.num_kv_heads,
            head_dim: hd,
            intermediate_size: ff,
            max_seq_len: cfg.max_seq_len,
            shift_logits: cfg.shift_logits,
            special: cfg.special.clone(),
            dtype,
            num_params,
        };
        Ok(Self {
            cache: KvCache::new(cfg.num_layers),
            cfg,
            info,
            device,
            mode,
            backend: backend.clone(),
            embed,
            blocks,
            norm: norm_f,
            head,
            rope,
            pending: None,
        })
    }

    /// The normalised config.
    pub fn config(&self) -> &TransformerConfig {
        &self.cfg
    }

    /// Replace the special tokens (e.g. with ids found in the tokenizer).
    pub fn set_special_tokens(&mut self, special: SpecialTokens) {
        self.info.special = special.clone();
        self.cfg.special = special;
    }

    /// The backend the model was built on.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// Bytes held by the KV cache buffers.
    pub fn cache_bytes(&self) -> usize {
        self.cache.bytes()
    }

    fn check_canvas(&self, canvas: &Tensor) -> Result<(usize, usize)> {
        let (b, l) = canvas.dims2().map_err(|_| {
            Error::InvalidArgument(format!(
                "canvas must be (batch, len), got shape {:?}",
                canvas.dims()
            ))
        })?;
        if canvas.dtype() != DType::U32 {
            return Err(Error::InvalidArgument(format!(
                "canvas must hold u32 ids, got {:?}",
                canvas.dtype()
            )));
        }
        if l > self.cfg.max_seq_len {
            return Err(Error::InvalidArgument(format!(
                "canvas of {l} positions exceeds the model's maximum sequence length {}",
                self.cfg.max_seq_len
            )));
        }
        if b == 0 || l == 0 {
            return Err(Error::InvalidArgument("empty canvas".into()));
        }
        self.cache.check_batch(b)?;
        Ok((b, l))
    }

    /// The raw-output row that predicts position `p`.
    fn source_row(&self, p: usize) -> usize {
        if self.cfg.shift_logits {
            p.saturating_sub(1)
        } else {
            p
        }
    }

    fn idx(&self, v: impl IntoIterator<Item = usize>) -> Result<Tensor> {
        let v: Vec<u32> = v.into_iter().map(|x| x as u32).collect();
        Ok(Tensor::new(v, &self.device)?)
    }

    /// One block. `q_rows` restricts queries (and the block's output) to those rows of `x`;
    /// `context` turns the block's fresh `(k, v)` into the full key/value set to attend to.
    fn block(
        &self,
        blk: &Block,
        x: &Tensor,
        rope: (&Tensor, &Tensor),
        q_rows: Option<&Tensor>,
        context: impl FnOnce(&Tensor, &Tensor) -> Result<(Tensor, Tensor)>,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let (b, n, _) = x.dims3()?;
        let hd = self.cfg.head_dim();
        let m = self.mode;
        let h = blk.attn_norm.forward(x, m)?;
        let k = blk
            .k
            .forward(&h)?
            .reshape((b, n, self.cfg.num_kv_heads, hd))?;
        let v = blk
            .v
            .forward(&h)?
            .reshape((b, n, self.cfg.num_kv_heads, hd))?;
        let k = Rope::apply_on(&k, rope.0, rope.1, m, &self.backend)?;
        let (xq, hq, cos, sin) = match q_rows {
            None => (x.clone(), h, rope.0.clone(), rope.1.clone()),
            Some(idx) if idx.dim(0)? == 0 => return Ok((x.narrow(1, 0, 0)?, k, v)),
            Some(idx) => (
                x.index_select(idx, 1)?,
                h.index_select(idx, 1)?,
                rope.0.index_select(idx, 0)?,
                rope.1.index_select(idx, 0)?,
            ),
        };
        let nq = xq.dim(1)?;
        if nq == 0 {
            return Ok((xq, k, v));
        }
        let q = blk
            .q
            .forward(&hq)?
            .reshape((b, nq, self.cfg.num_heads, hd))?;
        let q = Rope::apply_on(&q, &cos, &sin, m, &self.backend)?;
        let (kk, vv) = context(&k, &v)?;
        let attn = attention_on(&q, &kk, &vv, 1.0 / (hd as f32).sqrt(), m, &self.backend)?;
        let x = (xq + blk.o.forward(&attn)?)?;
        let h2 = blk.ffn_norm.forward(&x, m)?;
        let act = swiglu(
            &blk.gate.forward(&h2)?,
            &blk.up.forward(&h2)?,
            m,
            &self.backend,
        )?;
        let x = (x + blk.down.forward(&act)?)?;
        Ok((x, k, v))
    }

    fn logits(&self, x: &Tensor) -> Result<Tensor> {
        let (b, n, _) = x.dims3()?;
        if n == 0 {
            return Ok(Tensor::zeros(
                (b, 0, self.cfg.vocab_size),
                DType::F32,
                &self.device,
            )?);
        }
        let x = self.norm.forward(x, self.mode)?;
        Ok(self.head.forward(&x)?.to_dtype(DType::F32)?)
    }

    /// Resolve [`Rows`] to positions and validate them against `allowed`.
    fn requested(&self, rows: Rows<'_>, allowed: Range<usize>) -> Result<Vec<usize>> {
        let v: Vec<usize> = match rows {
            Rows::All => allowed.clone().collect(),
            Rows::None => Vec::new(),
            Rows::Positions(p) => p.to_vec(),
        };
        if let Some(&bad) = v.iter().find(|p| !allowed.contains(p)) {
            return Err(Error::InvalidArgument(format!(
                "logits requested for position {bad}, outside the forward window {allowed:?}"
            )));
        }
        Ok(v)
    }

    /// Full training forward: logits for every position of `ids` (no cache, differentiable when the
    /// model was built with [`OpMode::Differentiable`]).
    pub fn forward_train(&self, ids: &Tensor) -> Result<Tensor> {
        let (_, l) = ids.dims2()?;
        let mut x = self.embed.forward(ids)?;
        let (cos, sin) = self.rope.range(0, l)?;
        for blk in &self.blocks {
            x = self
                .block(blk, &x, (&cos, &sin), None, |k, v| {
                    Ok((k.clone(), v.clone()))
                })?
                .0;
        }
        if self.cfg.shift_logits {
            let rows = self.idx((0..l).map(|p| self.source_row(p)))?;
            x = x.index_select(&rows, 1)?;
        }
        let x = self.norm.forward(&x, self.mode)?;
        self.head.forward(&x)
    }
}

impl DiffusionLm for DiffusionTransformer {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn forward(&mut self, canvas: &Tensor, window: Range<usize>, rows: Rows<'_>) -> Result<Tensor> {
        let (b, l) = self.check_canvas(canvas)?;
        if window.start >= window.end || window.end > l {
            return Err(Error::InvalidArgument(format!(
                "forward window {window:?} is empty or outside the canvas of {l} positions"
            )));
        }
        if window.start > self.cache.len() {
            return Err(Error::InvalidArgument(format!(
                "forward window starts at {} but the KV cache covers only [0, {}): positions in between would be invisible",
                window.start,
                self.cache.len()
            )));
        }
        let requested = self.requested(rows, window.clone())?;
        // A shifted model needs the raw output one position left of the window.
        let ws = if self.cfg.shift_logits {
            window.start.saturating_sub(1)
        } else {
            window.start
        };
        let we = window.end;
        let n = we - ws;
        let hidden_rows: Vec<usize> = requested.iter().map(|&p| self.source_row(p) - ws).collect();
        let identity =
            hidden_rows.len() == n && hidden_rows.iter().enumerate().all(|(i, &r)| i == r);
        let last_rows = if identity {
            None
        } else {
            Some(self.idx(hidden_rows)?)
        };

        let mut x = self.embed.forward(&canvas.narrow(1, ws, n)?)?;
        let (cos, sin) = self.rope.range(ws, n)?;
        let mut ks = Vec::with_capacity(self.blocks.len());
        let mut vs = Vec::with_capacity(self.blocks.len());
        let last = self.blocks.len() - 1;
        for (li, blk) in self.blocks.iter().enumerate() {
            let q_rows = if li == last { last_rows.as_ref() } else { None };
            let cache = &self.cache;
            let (nx, k, v) = self.block(blk, &x, (&cos, &sin), q_rows, |k, v| {
                cache.around(li, ws, we, k, v)
            })?;
            x = nx;
            ks.push(k);
            vs.push(v);
        }
        self.pending = Some(Pending {
            start: ws,
            end: we,
            batch: b,
            k: ks,
            v: vs,
        });
        self.logits(&x)
    }

    fn commit(&mut self, range: Range<usize>) -> Result<()> {
        let p = self
            .pending
            .as_ref()
            .ok_or_else(|| Error::InvalidArgument("commit without a preceding forward".into()))?;
        if range.start > range.end || range.start < p.start || range.end > p.end {
            return Err(Error::InvalidArgument(format!(
                "commit range {range:?} is not inside the last forward window [{}, {})",
                p.start, p.end
            )));
        }
        if range.start > self.cache.len() {
            return Err(Error::InvalidArgument(format!(
                "commit range {range:?} would leave a hole after the cached [0, {})",
                self.cache.len()
            )));
        }
        if range.is_empty() {
            return Ok(());
        }
        let (off, n, batch) = (range.start - p.start, range.len(), p.batch);
        let rows: Vec<(Tensor, Tensor)> =
            p.k.iter()
                .zip(&p.v)
                .map(|(k, v)| Ok((k.narrow(1, off, n)?, v.narrow(1, off, n)?)))
                .collect::<Result<_>>()?;
        for (li, (k, v)) in rows.iter().enumerate() {
            self.cache.write(li, range.start, k, v)?;
        }
        self.cache.set_valid(range.end, batch);
        Ok(())
    }

    fn cache_len(&self) -> usize {
        self.cache.len()
    }

    fn truncate_cache(&mut self, len: usize) -> Result<()> {
        self.pending = None;
        self.cache.truncate(len)
    }

    fn compute_refresh(
        &self,
        canvas: &Tensor,
        positions: &[usize],
        logits: Option<&[usize]>,
    ) -> Result<Refresh> {
        let (_, _) = self.check_canvas(canvas)?;
        let len = self.cache.len();
        let mut pos: Vec<usize> = positions.to_vec();
        pos.sort_unstable();
        pos.dedup();
        if pos.is_empty() {
            return Err(Error::InvalidArgument(
                "refresh of an empty position set".into(),
            ));
        }
        if let Some(&bad) = pos.iter().find(|&&p| p >= len) {
            return Err(Error::InvalidArgument(format!(
                "refresh position {bad} is not cached (cache covers [0, {len}))"
            )));
        }
        let want: Vec<usize> = logits.map(|l| l.to_vec()).unwrap_or_default();
        if let Some(&bad) = want.iter().find(|p| pos.binary_search(p).is_err()) {
            return Err(Error::InvalidArgument(format!(
                "logits asked for position {bad}, which is not refreshed"
            )));
        }
        if self.cfg.shift_logits {
            pos.extend(want.iter().map(|&p| self.source_row(p)));
            pos.sort_unstable();
            pos.dedup();
        }
        let hidden_rows: Vec<usize> = want
            .iter()
            .map(|&p| {
                pos.binary_search(&self.source_row(p))
                    .expect("source row added above")
            })
            .collect();
        let ids = canvas.index_select(&self.idx(pos.iter().copied())?, 1)?;
        let mut x = self.embed.forward(&ids)?;
        let (cos, sin) = self.rope.gather(&pos)?;
        let last_rows = self.idx(hidden_rows)?;
        let kept = self.cache.kept_rows(&pos, &self.device)?;
        let mut keys = Vec::with_capacity(self.blocks.len());
        let mut values = Vec::with_capacity(self.blocks.len());
        let last = self.blocks.len() - 1;
        for (li, blk) in self.blocks.iter().enumerate() {
            let q_rows = if li == last { Some(&last_rows) } else { None };
            let (nx, k, v) = self.block(blk, &x, (&cos, &sin), q_rows, |k, v| {
                self.cache.with_rows_replaced(li, kept.as_ref(), k, v)
            })?;
            x = nx;
            keys.push(k);
            values.push(v);
        }
        let logits = if logits.is_some() {
            Some(self.logits(&x)?)
        } else {
            None
        };
        Ok(Refresh {
            positions: pos,
            keys,
            values,
            logits,
        })
    }

    fn apply_refresh(&mut self, r: &Refresh) -> Result<()> {
        if r.keys.len() != self.blocks.len() || r.values.len() != self.blocks.len() {
            return Err(Error::InvalidArgument(
                "refresh has the wrong number of layers".into(),
            ));
        }
        let len = self.cache.len();
        if let Some(&bad) = r.positions.iter().find(|&&p| p >= len) {
            return Err(Error::InvalidArgument(format!(
                "refresh position {bad} is no longer cached (cache covers [0, {len}))"
            )));
        }
        // Write runs of consecutive positions with one copy each.
        let mut runs: Vec<(usize, usize)> = Vec::new(); // (index into positions, run length)
        for (i, &p) in r.positions.iter().enumerate() {
            match runs.last_mut() {
                Some((s, n)) if r.positions[*s] + *n == p => *n += 1,
                _ => runs.push((i, 1)),
            }
        }
        for li in 0..self.blocks.len() {
            for &(s, n) in &runs {
                let k = r.keys[li].narrow(1, s, n)?;
                let v = r.values[li].narrow(1, s, n)?;
                self.cache.write(li, r.positions[s], &k, &v)?;
            }
        }
        Ok(())
    }
}
