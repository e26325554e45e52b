//! Loading a model's weights: [`TransformerWeights::new_with`], one walk over the checkpoint's
//! tensor roles. Everything the config implies is checked against the checkpoint's tensor list
//! and the machine's memory first; on the NPU the stack is declared to the device from shapes and
//! types before any tensor is read (so a placement the memory policy cannot make is refused at
//! once, with the numbers). Then each role is read once: the embedding (and, on the CPU, the LM
//! head), then layer after layer — its norms and biases ([`LayerParams`]) and its matrices,
//! packed for the CPU kernels or pushed to the NPU stack and dropped before the next layer is
//! read — then the final norm and the NPU's tail. A load's peak memory is the packed weights
//! plus the layer being packed.

use candle_core::{DType, Tensor};

use super::TransformerWeights;
use crate::block::{Block, GateUp, Qkv};
use crate::config::{MatrixDims, TransformerConfig};
#[cfg(not(feature = "hexagon"))]
use crate::hexagon_off::HexTransformer;
use crate::layer_params::LayerParams;
use crate::layers::{Backend, Embedding, Linear, OpMode, RmsNorm, Rope};
use crate::linear::{dense, CpuLinear, CpuLinears, CpuOptions};
use crate::lm::{ModelId, ModelInfo};
#[cfg(feature = "hexagon")]
use crate::npu_load::{begin, shared_block, NpuStack};
#[cfg(not(feature = "hexagon"))]
use crate::npu_load_off::{begin, shared_block, NpuStack};
use crate::role::Role;
use crate::weights::WeightSource;
use crate::{Error, Result};
#[cfg(feature = "hexagon")]
use candle_hexagon::HexTransformer;

/// Give the pages of the load's freed transient copies back to the system. Each tensor is read
/// and packed through a few buffers of its size; glibc keeps freed blocks of that size in its
/// heap, where later packed matrices and reads interleave with them, so without this the resident
/// size after loading grew by about a third of the weights (F32 GGUF of 97.5M parameters: 488 MiB
/// resident for 372 MiB of weights; glibc's `malloc_trim` hands the free pages inside the heap
/// back). Other allocators return large blocks themselves.
fn release_freed_pages() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only releases free memory of glibc's allocator; it takes no pointers.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// What building the layers needs, shared by the CPU and NPU paths.
struct Loader<'a> {
    cfg: &'a TransformerConfig,
    w: &'a dyn WeightSource,
    mode: OpMode,
    /// Where the per-op layers run (the CPU when the NPU holds the stack).
    backend: &'a Backend,
    which: CpuLinears,
}

/// The layers a load produces.
struct Built {
    hex: Option<HexTransformer>,
    embed: Embedding,
    head: Linear,
    blocks: Vec<Block>,
}

impl Loader<'_> {
    fn norm(&self, t: Tensor) -> RmsNorm {
        RmsNorm::on_backend(t, self.cfg.rms_norm_eps as f32, self.backend)
    }

    fn prepare(&self, l: Linear) -> Result<Linear> {
        match self.mode {
            OpMode::Fused => l.for_inference(self.which),
            OpMode::Differentiable => Ok(l),
        }
    }

    /// Inference on the CPU over packed GEMMs: a source that can stream a matrix from its file
    /// into the packed tiles does so (no whole copy of it in another layout on the way).
    fn packed(&self, role: Role, out: usize, inp: usize) -> Result<Option<CpuLinear>> {
        let stream = matches!(self.backend, Backend::Cpu)
            && self.mode == OpMode::Fused
            && self.which == CpuLinears::Packed;
        if stream {
            self.w.get_packed(role, &[out, inp])
        } else {
            Ok(None)
        }
    }

    fn lin(&self, role: Role, out: usize, inp: usize, b: Option<Tensor>) -> Result<Linear> {
        if let Some(c) = self.packed(role, out, inp)? {
            return Ok(Linear::Cpu(c.with_bias(b.as_ref())?));
        }
        let w = self.w.get(role, &[out, inp])?;
        self.prepare(Linear::on_backend(w, b, self.backend, self.which)?)
    }

    /// The embedding, and the LM head it is when the model ties them.
    fn embedding(&self) -> Result<(Embedding, Option<Linear>)> {
        let (v, h) = (self.cfg.vocab_size, self.cfg.hidden_size);
        let tied = self.cfg.tie_word_embeddings;
        let dtype = self.w.dtype();
        Ok(match self.packed(Role::Embed, v, h)? {
            // A tied head and the embedding gather read the same tiles.
            Some(table) => {
                let head = tied.then(|| Linear::Cpu(table.clone()));
                (Embedding::packed(table, dtype), head)
            }
            None => {
                let p = self.w.get(Role::Embed, &[v, h])?;
                let head = match tied {
                    true => Some(self.prepare(Linear::on_backend(
                        p.clone(),
                        None,
                        self.backend,
                        self.which,
                    )?)?),
                    false => None,
                };
                (Embedding::new(p, dtype), head)
            }
        })
    }

    /// Block `i` on the CPU: one linear layer per checkpoint matrix.
    fn cpu_block(&self, i: usize, p: LayerParams) -> Result<Block> {
        let h = self.cfg.hidden_size;
        let MatrixDims { nq, nkv, ff, .. } = self.cfg.matrix_dims();
        let [qb, kb, vb] = match p.qkv_bias {
            Some([q, k, v]) => [Some(q), Some(k), Some(v)],
            None => [None, None, None],
        };
        Ok(Block {
            attn_norm: self.norm(p.attn_norm),
            qkv: Qkv::Split {
                q: self.lin(Role::Q(i), nq, h, qb)?,
                k: self.lin(Role::K(i), nkv, h, kb)?,
                v: self.lin(Role::V(i), nkv, h, vb)?,
            },
            o: self.lin(Role::O(i), h, nq, None)?,
            ffn_norm: self.norm(p.ffn_norm),
            gate_up: GateUp::Split {
                gate: self.lin(Role::Gate(i), ff, h, None)?,
                up: self.lin(Role::Up(i), ff, h, None)?,
            },
            down: self.lin(Role::Down(i), h, ff, None)?,
        })
    }

    /// Everything on the CPU (or on the per-op NPU path): the embedding and the head first (the
    /// largest tensors: their transient copies, where a source cannot stream them, pass while
    /// little else is resident), then the blocks.
    fn cpu(&self) -> Result<Built> {
        let (v, h) = (self.cfg.vocab_size, self.cfg.hidden_size);
        let (embed, tied) = self.embedding()?;
        let head = match tied {
            Some(head) => head,
            None => self.lin(Role::Head, v, h, None)?,
        };
        release_freed_pages();
        let mut blocks = Vec::with_capacity(self.cfg.num_layers);
        for i in 0..self.cfg.num_layers {
            blocks.push(self.cpu_block(i, LayerParams::read(self.w, self.cfg, i)?)?);
            release_freed_pages();
        }
        Ok(Built {
            hex: None,
            embed,
            head,
            blocks,
        })
    }

    /// The stack on the NPU: each layer read once and pushed (its matrices dropped before the
    /// next layer is read), then the tail; the CPU layers (the refresh path) read the module's
    /// packed bytes in place instead of packing a second copy.
    fn npu(&self, mut stack: NpuStack, final_norm: &Tensor) -> Result<Built> {
        let (embed, tied) = self.embedding()?;
        release_freed_pages();
        let mut params = Vec::with_capacity(self.cfg.num_layers);
        for i in 0..self.cfg.num_layers {
            let p = LayerParams::read(self.w, self.cfg, i)?;
            stack.push_layer(self.cfg, self.w, i, &p)?;
            params.push(p);
            release_freed_pages();
        }
        let (hex, head) = stack.finish(self.cfg, self.w, final_norm, self.which)?;
        let head = head.or(tied).ok_or(Error::Internal {
            what: "an untied LM head without a layer",
        })?;
        let mut blocks = Vec::with_capacity(params.len());
        for (i, p) in params.into_iter().enumerate() {
            let fused_bias = match &p.qkv_bias {
                Some(b) => Some(Tensor::cat(b, 0)?),
                None => None,
            };
            let (qkv, o, gate_up, down) = shared_block(&hex, i, self.cfg, fused_bias.as_ref())?;
            blocks.push(Block {
                attn_norm: self.norm(p.attn_norm),
                qkv,
                o,
                ffn_norm: self.norm(p.ffn_norm),
                gate_up,
                down,
            });
        }
        Ok(Built {
            hex: Some(hex),
            embed,
            head,
            blocks,
        })
    }
}

/// The K/V cache dtypes a model takes.
fn check_kv_dtype(kv: Option<DType>) -> Result<()> {
    match kv {
        None | Some(DType::F32 | DType::F16 | DType::BF16) => Ok(()),
        Some(dtype) => Err(Error::UnsupportedDtype {
            what: "the KV cache",
            dtype,
        }),
    }
}

fn info_of(cfg: &TransformerConfig, dtype: DType) -> ModelInfo {
    ModelInfo {
        arch: cfg.arch,
        vocab_size: cfg.vocab_size,
        hidden_size: cfg.hidden_size,
        num_layers: cfg.num_layers,
        num_heads: cfg.num_heads,
        num_kv_heads: cfg.num_kv_heads,
        head_dim: cfg.head_dim(),
        intermediate_size: cfg.intermediate_size,
        max_seq_len: cfg.max_seq_len,
        shift_logits: cfg.shift_logits,
        special: cfg.special.clone(),
        dtype,
        num_params: cfg.param_count().unwrap_or(u64::MAX) as usize,
    }
}

impl TransformerWeights {
    /// [`new`](Self::new) with explicit [`CpuOptions`]: what runs the linear layers, and the
    /// model's own pool of `threads` threads (an error naming the count outside
    /// `1..=MAX_THREADS`). The options belong to this model only.
    pub fn new_with(
        cfg: TransformerConfig,
        w: &dyn WeightSource,
        mode: OpMode,
        backend: &Backend,
        cpu: CpuOptions,
    ) -> Result<Self> {
        let pool = cpu.threads.map(crate::threads::pool).transpose()?;
        check_kv_dtype(cpu.kv_dtype)?;
        if backend.hexagon().is_some() && mode != OpMode::Fused {
            return Err(Error::HexagonNeedsFused {
                mode: format!("{mode:?}"),
            });
        }
        // Everything the config implies is checked against the checkpoint's tensor list (names,
        // shapes, layer count) and the machine's memory before anything is read or allocated.
        w.check_layout(&cfg)?;
        crate::limits::check_memory("the model's parameters", w.resident_bytes(&cfg))?;
        // The block-level module is declared first, from shapes and types only.
        let npu = match backend.hexagon() {
            Some(dev) if mode == OpMode::Fused => begin(dev, &cfg, w)?,
            _ => None,
        };
        if let (Some(_), Some(dtype)) = (&npu, cpu.kv_dtype) {
            if dtype != DType::F16 {
                return Err(Error::UnsupportedDtype {
                    what: "the K/V cache of a model on the NPU (it keeps its cache in fp16)",
                    dtype,
                });
            }
        }
        let ops_backend = match npu {
            Some(_) => Backend::Cpu,
            None => backend.clone(),
        };
        let l = Loader {
            cfg: &cfg,
            w,
            mode,
            backend: &ops_backend,
            which: cpu.linears,
        };
        let final_norm = dense(w.get(Role::FinalNorm, &[cfg.hidden_size])?, Role::FinalNorm)?;
        let built = match npu {
            Some(stack) => l.npu(stack, &final_norm)?,
            None => l.cpu()?,
        };
        let dtype = w.dtype();
        let device = w.device().clone();
        let norm = l.norm(final_norm);
        let rope = Rope::new(
            cfg.rope_theta,
            cfg.head_dim(),
            cfg.max_seq_len.min(4096),
            dtype,
            &device,
        )?;
        Ok(Self {
            id: ModelId::fresh(),
            cpu,
            pool,
            info: info_of(&cfg, dtype),
            norm,
            device,
            mode,
            backend: backend.clone(),
            ops_backend,
            hex: built.hex,
            embed: built.embed,
            blocks: built.blocks,
            head: built.head,
            rope,
            cfg,
        })
    }
}
