//! Model sources: a local HF-layout directory, a `.gguf` file, or a Hugging Face model id, loaded
//! into a [`LoadedModel`] (model + tokenizer).

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};

use crate::config::TransformerConfig;
use crate::config_json::Fields;
use crate::gguf::GgufWeights;
#[cfg(feature = "hub")]
use crate::hub::HubRepo;
use crate::layers::{Backend, OpMode};
use crate::linear::{CpuLinears, CpuOptions};
use crate::lm::{Arch, DiffusionLm};
use crate::tokenizer::TextTokenizer;
use crate::transformer::DiffusionTransformer;
use crate::weights::{HfWeights, WeightSource};
use crate::{dream, llada, Error, Result};

/// Where a model comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// A directory with `config.json`, safetensors (single or sharded) and usually `tokenizer.json`.
    Dir(PathBuf),
    /// A llama.cpp GGUF file.
    Gguf(PathBuf),
    /// A Hugging Face model id `owner/name`, optionally `@revision`.
    Hub {
        /// `owner/name`.
        id: String,
        /// Branch, tag or commit (default `main`).
        revision: Option<String>,
    },
}

impl ModelSource {
    /// Interpret a user-supplied string: an existing directory or file, else a hub id.
    pub fn parse(spec: &str) -> Result<Self> {
        let path = Path::new(spec);
        if path.is_dir() {
            return Ok(ModelSource::Dir(path.to_path_buf()));
        }
        // Something is there, but neither a directory nor a regular file: say what it is.
        let odd = match crate::files::describe(path) {
            Some(k) => Some(k.to_string()),
            None if !path.exists() && std::fs::symlink_metadata(path).is_ok() => {
                Some("a symlink to a missing file".into())
            }
            None => None,
        };
        if let Some(k) = odd {
            return Err(Error::Source {
                source_desc: spec.into(),
                reason: format!(
                    "is {k}, not a model directory or a .gguf file (pass a model directory, a \
                     .gguf file or a hub id)"
                ),
            });
        }
        if path.is_file() {
            let mut magic = [0u8; 4];
            let is_gguf = std::fs::File::open(path)
                .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
                .map(|_| &magic == b"GGUF")
                .unwrap_or(false);
            if is_gguf {
                return Ok(ModelSource::Gguf(path.to_path_buf()));
            }
            return Err(Error::Source {
                source_desc: spec.into(),
                reason: "is a file but not a GGUF file (pass a model directory, a .gguf file or a hub id)".into(),
            });
        }
        let (id, rev) = match spec.split_once('@') {
            Some((id, rev)) => (id, Some(rev.to_string())),
            None => (spec, None),
        };
        let parts: Vec<&str> = id.split('/').collect();
        let valid = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        };
        if parts.len() == 2 && parts.iter().all(|p| valid(p)) && !spec.starts_with('.') {
            return Ok(ModelSource::Hub {
                id: id.to_string(),
                revision: rev,
            });
        }
        Err(Error::Source {
            source_desc: spec.into(),
            reason:
                "no such directory or file, and not a Hugging Face model id of the form owner/name"
                    .into(),
        })
    }
}

impl std::fmt::Display for ModelSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ModelSource::Dir(p) | ModelSource::Gguf(p) => write!(f, "{}", p.display()),
            ModelSource::Hub {
                id,
                revision: Some(r),
            } => write!(f, "{id}@{r}"),
            ModelSource::Hub { id, revision: None } => write!(f, "{id}"),
        }
    }
}

/// How to load a model.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Compute dtype (f32 by default on CPU; f16/bf16 selectable).
    pub dtype: DType,
    /// Device for activations and dense weights.
    pub device: Device,
    /// Fused (inference) or differentiable (training) ops.
    pub mode: OpMode,
    /// A `tokenizer.json` overriding the one found beside the weights.
    pub tokenizer: Option<PathBuf>,
    /// Where the fused inference ops run (CPU, or the Hexagon NPU with per-op CPU fallback).
    pub backend: Backend,
    /// What runs the linear layers on the CPU: the kernels-cpu GEMMs over weights packed at load
    /// (default), or candle's previous path (for comparisons and bisecting). Held by the model.
    pub cpu_linears: CpuLinears,
    /// Threads of the model's own pool for its CPU kernels ([`CpuOptions::threads`]); `None`
    /// (default): the caller's current rayon pool.
    pub threads: Option<usize>,
    /// Element type of the K/V cache ([`CpuOptions::kv_dtype`]); `None` (default): the compute
    /// dtype.
    pub kv_dtype: Option<DType>,
}

impl LoadOptions {
    /// Whether matrices the checkpoint stores half stay half (packed inference).
    fn keep_half(&self) -> bool {
        self.mode == OpMode::Fused && self.cpu_linears == CpuLinears::Packed
    }

    /// The CPU options of the model this load builds.
    pub fn cpu_options(&self) -> CpuOptions {
        CpuOptions {
            linears: self.cpu_linears,
            threads: self.threads,
            kv_dtype: self.kv_dtype,
        }
    }

    /// Build the model with this load's CPU options.
    fn build(&self, cfg: TransformerConfig, w: &dyn WeightSource) -> Result<DiffusionTransformer> {
        DiffusionTransformer::new_with(cfg, w, self.mode, &self.backend, self.cpu_options())
    }
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            dtype: DType::F32,
            device: Device::Cpu,
            mode: OpMode::Fused,
            tokenizer: None,
            backend: Backend::Cpu,
            cpu_linears: CpuLinears::Packed,
            threads: None,
            kv_dtype: None,
        }
    }
}

/// Decoding defaults a checkpoint may recommend in `generation_config.json` (the keys
/// `gen_length`, `block_length`, `steps`, `threshold`; an llada-rs extension that Hugging Face
/// tooling ignores). Command-line flags override them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DecodeDefaults {
    /// Generated positions.
    pub gen_length: Option<usize>,
    /// Block length.
    pub block_length: Option<usize>,
    /// Total steps.
    pub steps: Option<usize>,
    /// Parallel-decoding threshold.
    pub threshold: Option<f64>,
}

impl DecodeDefaults {
    /// Read the optional keys from a parsed `generation_config.json`.
    pub fn from_fields(f: &Fields) -> Result<Self> {
        Ok(Self {
            gen_length: f.opt_usize("gen_length")?,
            block_length: f.opt_usize("block_length")?,
            steps: f.opt_usize("steps")?,
            threshold: f.opt_f64("threshold")?,
        })
    }
}

/// A model with its tokenizer.
#[derive(Debug)]
pub struct LoadedModel {
    /// The model.
    pub model: DiffusionTransformer,
    /// The tokenizer, when one was found.
    pub tokenizer: Option<TextTokenizer>,
    /// Where it came from (for messages).
    pub source: String,
    /// Decoding defaults recommended by the checkpoint.
    pub defaults: DecodeDefaults,
    /// Things that load but look wrong (a tokenizer covering far fewer ids than the model's
    /// vocabulary); binaries print them.
    pub warnings: Vec<String>,
}

/// Load a model from any source: the model, its tokenizer (when one is found), and the decoding
/// recommendations of its `generation_config.json`. Every file is checked before use; errors name
/// the file and the field or tensor.
///
/// ```
/// use dllm_models::{load, DiffusionLm, LoadOptions, ModelSource};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/tiny-llada");
/// // A directory, a .gguf file, or a hub id such as "GSAI-ML/LLaDA-8B-Instruct".
/// let loaded = load(&ModelSource::parse(dir)?, &LoadOptions::default())?;
/// assert_eq!(loaded.model.info().special.mask, 5);
/// assert_eq!(loaded.defaults.gen_length, Some(24));
/// let e = ModelSource::parse("./no-such-dir").unwrap_err();
/// assert!(e.to_string().contains("./no-such-dir"), "{e}");
/// # Ok(())
/// # }
/// ```
pub fn load(source: &ModelSource, opts: &LoadOptions) -> Result<LoadedModel> {
    match source {
        ModelSource::Dir(dir) => load_dir(dir, opts),
        ModelSource::Gguf(path) => load_gguf(path, opts),
        #[cfg(feature = "hub")]
        ModelSource::Hub { id, revision } => load_hub(&HubRepo::new(id, revision.as_deref()), opts),
        #[cfg(not(feature = "hub"))]
        ModelSource::Hub { id, .. } => Err(Error::Source {
            source_desc: id.clone(),
            reason: "is not a local directory or .gguf file, and this build of dllm-models has no \
                     Hugging Face hub support (the `hub` feature is off)"
                .into(),
        }),
    }
}

/// Which architecture parsed `config.json` fields describe (`model_type`, else `architectures`);
/// the error text names the field.
fn arch_of(f: &Fields) -> std::result::Result<Arch, String> {
    let model_type = f.opt_str("model_type").map_err(|e| e.to_string())?;
    if let Some(t) = &model_type {
        match t.to_ascii_lowercase().as_str() {
            "llada" => return Ok(Arch::Llada),
            "dream" => return Ok(Arch::Dream),
            _ => {}
        }
    }
    if let Some(serde_json::Value::Array(a)) = f.get("architectures") {
        for v in a.iter().filter_map(|v| v.as_str()) {
            if v.starts_with("LLaDA") {
                return Ok(Arch::Llada);
            }
            if v.starts_with("Dream") {
                return Ok(Arch::Dream);
            }
        }
    }
    Err(format!(
        "config: field `model_type`: {} is not a supported diffusion model (expected llada or Dream)",
        model_type
            .map(|s| format!("`{s}`"))
            .unwrap_or_else(|| "missing, and `architectures` names no known model,".into())
    ))
}

/// The config of parsed `config.json` fields, of whichever architecture they describe.
fn config_of(f: &Fields, arch: Arch) -> Result<TransformerConfig> {
    match arch {
        Arch::Llada => llada::config_from_fields(f),
        Arch::Dream => dream::config_from_fields(f),
    }
}

/// Which architecture a `config.json` describes.
pub fn detect_arch(config: &Path) -> Result<Arch> {
    arch_of(&Fields::from_file(config)?).map_err(|m| Error::file(config, m))
}

/// Parse `config.json` of either architecture (the file is read once).
pub fn read_config(config: &Path) -> Result<TransformerConfig> {
    Fields::parse_file(config, |f| {
        config_of(f, arch_of(f).map_err(|m| Error::file(config, m))?)
    })
}

/// The `weight_map` of a `model.safetensors.index.json` (tensor name -> shard file name); shard
/// names must be plain file names in the checkpoint's directory.
fn weight_map(index: &Path) -> Result<Vec<(String, String)>> {
    let f = Fields::from_file(index)?;
    let map = f
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| Error::file(index, "missing or malformed `weight_map`"))?;
    let mut out = Vec::with_capacity(map.len());
    for (tensor, file) in map {
        let file = file.as_str().ok_or_else(|| {
            Error::file(
                index,
                format!("`weight_map` entry `{tensor}` is not a file name"),
            )
        })?;
        let plain = !file.is_empty()
            && file != "."
            && file != ".."
            && !file.contains(['/', '\\'])
            && Path::new(file).file_name().is_some();
        if !plain {
            return Err(Error::file(
                index,
                format!("`weight_map` entry `{tensor}` names `{file}`, which is not a file in the checkpoint's directory"),
            ));
        }
        out.push((tensor.clone(), file.to_string()));
    }
    Ok(out)
}

/// The distinct shard file names of a `model.safetensors.index.json`, sorted.
fn shard_names(index: &Path) -> Result<Vec<String>> {
    let mut files: Vec<String> = weight_map(index)?.into_iter().map(|(_, f)| f).collect();
    files.sort();
    files.dedup();
    Ok(files)
}

/// Every tensor the index lists is in the shard it names, and every tensor of the shards is
/// listed (a stale index would otherwise load another checkpoint's tensors, or miss some).
fn check_index(dir: &Path, index: &Path) -> Result<()> {
    let listed = weight_map(index)?;
    let mut actual = std::collections::HashMap::new();
    for shard in shard_names(index)? {
        for name in crate::weights::safetensors_names(&dir.join(&shard))? {
            actual.insert(name, shard.clone());
        }
    }
    for (tensor, file) in &listed {
        match actual.remove(tensor) {
            Some(f) if &f == file => {}
            Some(f) => {
                return Err(Error::file(
                    index,
                    format!("`weight_map` puts tensor `{tensor}` in {file}, but it is in {f}"),
                ))
            }
            None => {
                return Err(Error::file(
                    index,
                    format!(
                        "`weight_map` puts tensor `{tensor}` in {file}, which does not hold it"
                    ),
                ))
            }
        }
    }
    if let Some((tensor, file)) = actual.into_iter().next() {
        return Err(Error::file(
            index,
            format!("`weight_map` does not list tensor `{tensor}` of {file}"),
        ));
    }
    Ok(())
}

/// The safetensors files of an HF directory: the shards of `model.safetensors.index.json`, or
/// `model.safetensors`.
pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let paths: Vec<PathBuf> = shard_names(&index)?.iter().map(|f| dir.join(f)).collect();
        if paths.is_empty() {
            return Err(Error::file(&index, "`weight_map` lists no tensors"));
        }
        if let Some(missing) = paths.iter().find(|p| !p.is_file()) {
            return Err(Error::file(
                missing,
                "shard listed in model.safetensors.index.json is missing",
            ));
        }
        check_index(dir, &index)?;
        return Ok(paths);
    }
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    Err(Error::Source {
        source_desc: dir.display().to_string(),
        reason: "contains neither model.safetensors nor model.safetensors.index.json".into(),
    })
}

/// A parsed `generation_config.json` and how to name it in errors.
struct GenerationConfig {
    fields: Fields,
    desc: String,
}

impl GenerationConfig {
    fn read(path: &Path) -> Result<Option<Self>> {
        if !path.is_file() {
            return Ok(None);
        }
        Ok(Some(Self {
            fields: Fields::from_file(path)?,
            desc: path.display().to_string(),
        }))
    }

    /// Field errors name the file.
    fn named<T>(&self, r: Result<T>) -> Result<T> {
        r.map_err(|e| match e {
            e @ (Error::MissingField { .. } | Error::InvalidField { .. }) => Error::File {
                path: self.desc.clone().into(),
                reason: e.to_string(),
            },
            e => e,
        })
    }

    /// The decoding defaults, checked against the model they come with.
    fn defaults(&self, max_seq_len: usize) -> Result<DecodeDefaults> {
        let d = self.named(DecodeDefaults::from_fields(&self.fields))?;
        let bad = |key: &str, why: String| self.named::<()>(Err(Error::invalid(key, why)));
        for (key, v) in [
            ("gen_length", d.gen_length),
            ("block_length", d.block_length),
            ("steps", d.steps),
        ] {
            match v {
                Some(0) => bad(key, "must be positive".into())?,
                Some(v) if v > max_seq_len => bad(
                    key,
                    format!("{v} exceeds the model's maximum sequence length {max_seq_len}"),
                )?,
                _ => {}
            }
        }
        if let Some(t) = d.threshold {
            if !(t > 0.0 && t <= 1.0) {
                bad("threshold", format!("{t} is not in (0, 1]"))?;
            }
        }
        Ok(d)
    }
}

/// Complete a loaded model: special tokens the config lacks (EoT from the tokenizer, BOS from
/// `generation_config.json`), the tokenizer checked against the model, and the decoding defaults
/// `generation_config.json` recommends.
fn finish(
    mut model: DiffusionTransformer,
    tokenizer: Option<(TextTokenizer, String)>,
    generation_config: Option<&GenerationConfig>,
    source: String,
) -> Result<LoadedModel> {
    let mut warnings = Vec::new();
    let info = model.info().clone();
    if let Some((tok, desc)) = &tokenizer {
        check_tokenizer(tok, desc, &info, &mut warnings)?;
    }
    let tokenizer = tokenizer.map(|(t, _)| t);
    let bos = match generation_config {
        Some(g) => g.named(g.fields.opt_token_id("bos_token_id"))?,
        None => None,
    };
    let special = crate::special::complete_special(&info, tokenizer.as_ref(), bos)?;
    model.set_special_tokens(special)?;
    let defaults = match generation_config {
        Some(g) => g.defaults(info.max_seq_len)?,
        None => DecodeDefaults::default(),
    };
    Ok(LoadedModel {
        model,
        tokenizer,
        source,
        defaults,
        warnings,
    })
}

/// A tokenizer that produces ids beyond the model's embedding is not this model's: an error (the
/// embedding lookup would fail mid-run). One that cannot spell the model's mask or EOS id, or
/// covers much less than the embedding, is a warning (checkpoints pad their embedding a little: LLaDA-8B has 126,349 ids
/// for 126,464 rows, Dream-7B 151,667 for 152,064; generated ids beyond the tokenizer's decode
/// to nothing).
fn check_tokenizer(
    tok: &TextTokenizer,
    desc: &str,
    info: &crate::ModelInfo,
    warnings: &mut Vec<String>,
) -> Result<()> {
    let mismatch = |reason: String| Error::TokenizerMismatch {
        tokenizer: desc.to_string(),
        reason,
    };
    let ids = tok.id_bound();
    if ids > info.vocab_size {
        return Err(mismatch(format!(
            "holds ids up to {}, beyond the model's {} embedding rows: it belongs to another model",
            ids - 1,
            info.vocab_size
        )));
    }
    for (field, id) in [
        ("mask_token_id", info.special.mask),
        ("eos_token_id", info.special.eos),
    ] {
        if tok.inner().id_to_token(id).is_none() {
            warnings.push(format!(
                "tokenizer {desc} has no token with the model's {field} {id} (is it the model's tokenizer?)"
            ));
        }
    }
    // Less than 99% of the rows: more than padding.
    if (info.vocab_size - ids) * 100 > info.vocab_size {
        warnings.push(format!(
            "tokenizer {desc} spells {ids} ids, the model has {} embedding rows: generated ids \
             {ids} and above decode to nothing (is it the model's tokenizer?)",
            info.vocab_size
        ));
    }
    Ok(())
}

/// The tokenizer given explicitly, else `tokenizer.json` beside the weights, with a description
/// for messages.
fn load_tokenizer(
    explicit: &Option<PathBuf>,
    beside: &Path,
) -> Result<Option<(TextTokenizer, String)>> {
    let path = match explicit {
        Some(p) => p,
        None if beside.is_file() => beside,
        None => return Ok(None),
    };
    Ok(Some((
        TextTokenizer::from_file(path)?,
        path.display().to_string(),
    )))
}

/// Load an HF-layout directory.
pub fn load_dir(dir: &Path, opts: &LoadOptions) -> Result<LoadedModel> {
    let config = dir.join("config.json");
    if !config.is_file() {
        return Err(Error::Source {
            source_desc: dir.display().to_string(),
            reason: "has no config.json".into(),
        });
    }
    let cfg = read_config(&config)?;
    let files = weight_files(dir)?;
    let weights = HfWeights::from_safetensors(&files, cfg.arch, opts.dtype, &opts.device)?
        .keep_half_matrices(opts.keep_half());
    let model = opts.build(cfg, &weights)?;
    let tokenizer = load_tokenizer(&opts.tokenizer, &dir.join("tokenizer.json"))?;
    let gen = GenerationConfig::read(&dir.join("generation_config.json"))?;
    finish(model, tokenizer, gen.as_ref(), dir.display().to_string())
}

/// Load a model whose files are in memory (e.g. embedded in a binary with `include_bytes!`):
/// `config.json` text, one safetensors file, `tokenizer.json` text and an optional
/// `generation_config.json` text.
pub fn load_from_memory(
    config_json: &str,
    safetensors: &'static [u8],
    tokenizer_json: &str,
    generation_config_json: Option<&str>,
    name: &str,
    opts: &LoadOptions,
) -> Result<LoadedModel> {
    let f = Fields::parse_str(config_json)?;
    let arch = arch_of(&f).map_err(|reason| Error::Source {
        source_desc: name.into(),
        reason,
    })?;
    let cfg = config_of(&f, arch)?;
    let weights =
        HfWeights::from_safetensors_bytes(safetensors, name, cfg.arch, opts.dtype, &opts.device)?
            .keep_half_matrices(opts.keep_half());
    let model = opts.build(cfg, &weights)?;
    // An explicit tokenizer replaces the embedded one (and must exist).
    let tokenizer = match &opts.tokenizer {
        Some(p) => (TextTokenizer::from_file(p)?, p.display().to_string()),
        None => (
            TextTokenizer::from_bytes(tokenizer_json.as_bytes())
                .map_err(|e| Error::Tokenizer(format!("embedded tokenizer: {e}")))?,
            format!("{name} (embedded)"),
        ),
    };
    let gen = generation_config_json
        .map(|text| -> Result<GenerationConfig> {
            let desc = format!("{name}: generation_config.json");
            Ok(GenerationConfig {
                fields: Fields::parse_str(text).map_err(|e| Error::file(&desc, e))?,
                desc,
            })
        })
        .transpose()?;
    finish(model, Some(tokenizer), gen.as_ref(), name.to_string())
}

/// Load a GGUF file. Its tokenizer: `LoadOptions::tokenizer` when given, else `tokenizer.json` in
/// the same directory, else the file's own `tokenizer.ggml.*` metadata
/// ([`crate::gguf_tokenizer`]; malformed metadata is an error naming the key, metadata this crate
/// cannot build a tokenizer from a warning), else none.
pub fn load_gguf(path: &Path, opts: &LoadOptions) -> Result<LoadedModel> {
    let (cfg, weights) = GgufWeights::open(path, opts.dtype, &opts.device)?;
    let beside = path
        .parent()
        .unwrap_or(Path::new("."))
        .join("tokenizer.json");
    // Read before the weights are packed: a malformed vocabulary fails the load at once.
    let mut warnings = Vec::new();
    let tokenizer = match load_tokenizer(&opts.tokenizer, &beside)? {
        Some(t) => Some(t),
        None => crate::gguf_tokenizer::for_loader(path, weights.metadata(), &mut warnings)?
            .map(|t| (t, format!("{} (GGUF metadata)", path.display()))),
    };
    let weights = weights.keep_half_matrices(opts.keep_half());
    let model = opts.build(cfg, &weights)?;
    let mut loaded = finish(model, tokenizer, None, path.display().to_string())?;
    loaded.warnings.extend(warnings);
    Ok(loaded)
}

/// Resolve a hub repo's files (cache first) and load them.
#[cfg(feature = "hub")]
pub fn load_hub(repo: &HubRepo, opts: &LoadOptions) -> Result<LoadedModel> {
    let config = repo.get("config.json")?;
    let dir = config
        .parent()
        .ok_or_else(|| Error::Source {
            source_desc: repo.id().to_string(),
            reason: format!("{} has no parent directory", config.display()),
        })?
        .to_path_buf();
    match repo.get_optional("model.safetensors.index.json")? {
        Some(index) => {
            for s in shard_names(&index)? {
                repo.get(&s)?;
            }
        }
        None => {
            repo.get("model.safetensors")?;
        }
    }
    // Fetched into the snapshot so `load_dir` finds them; absent is fine, failing is not.
    repo.get_optional("tokenizer.json")?;
    repo.get_optional("generation_config.json")?;
    let mut loaded = load_dir(&dir, opts)?;
    loaded.source = repo.id().to_string();
    Ok(loaded)
}
