//! The training loop: the model and optimizer built (or restored from a checkpoint), one SFT
//! step at a time with its log record and the periodic quick eval, and the checkpoints.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use candle_core::{DType, Device};
use candle_nn::VarMap;
use dllm_models::DiffusionTransformer;
use dllm_tasks::rng::Rng;
use dllm_tasks::tasks::{suite_train_stream, Suite, TaskKind, TrainStream};
use dllm_tasks::tokenizer::{self as tk, MASK_ID};
use dllm_tasks::train::{
    inference_copy, init_from, init_varmap, lr_at, named_vars, sft_loss_with, trainable, AdamW,
    AdamWConfig, Batcher,
};
use indicatif::{ProgressBar, ProgressStyle};

use crate::output::{self, RunDir};
use crate::setup::Resolved;
use crate::{interrupted, quick_eval, stage_weights, Args, State};

/// A run in progress: its model, optimizer, data and masking streams, and counters.
pub struct Training<'a> {
    /// The arguments.
    a: &'a Args,
    /// The values resolved from them.
    res: &'a Resolved,
    /// Where the run keeps its log and checkpoint.
    run: &'a RunDir,
    /// The model's `config.json` (saved with each checkpoint).
    config_json: &'a serde_json::Value,
    /// The model's variables (the weights the model and the optimizer share).
    pub varmap: VarMap,
    /// The model, with differentiable ops.
    model: DiffusionTransformer,
    /// The optimizer and its moments.
    opt: AdamW,
    /// The batches, from the suite's training stream.
    batcher: Batcher,
    /// The masking randomness.
    mask_rng: Rng,
    /// Optimizer steps taken (a resumed run's included).
    pub step: usize,
    /// Training time before this process (a resumed run's).
    prior: Duration,
    /// Examples trained on (a resumed run's included).
    pub examples: usize,
    /// The smoothed loss, once a step is taken.
    ema: Option<f64>,
}

/// One step's outcome: its log record, the smoothed loss after it, and the training time so far.
struct StepDone {
    /// The record logged for the step.
    rec: serde_json::Value,
    /// The smoothed loss.
    loss_ema: f64,
    /// The run's training time after the step (resumed runs' included).
    elapsed: Duration,
}

/// The model initialised from `--seed` (or warm-started from `--init-from`), its optimizer, and
/// its parameter count.
fn build_model(a: &Args, res: &Resolved) -> Result<(VarMap, DiffusionTransformer, AdamW, usize)> {
    let varmap = VarMap::new();
    init_varmap(&varmap, &res.cfg, a.seed)?;
    if let Some(dir) = &a.init_from {
        let w = init_from(&varmap, dir, &res.tok)
            .with_context(|| format!("--init-from {}", dir.display()))?;
        eprintln!(
            "warm start from {}: {} tensors copied, {} vocabulary matrices mapped by token from {} to {} rows ({} tokens changed id)",
            dir.display(),
            w.copied,
            w.extended,
            w.old_vocab,
            res.vocab,
            w.moved
        );
    }
    let model = trainable(&varmap, &res.cfg)?;
    let vars = named_vars(&varmap)?;
    let n_params: usize = vars.iter().map(|(_, v)| v.elem_count()).sum();
    let opt = AdamW::new(
        vars,
        AdamWConfig {
            weight_decay: a.weight_decay,
            clip_norm: Some(a.clip),
            ..Default::default()
        },
    )?;
    Ok((varmap, model, opt, n_params))
}

/// The progress bar of a run of `steps` steps, at `step`.
fn progress_bar(steps: usize, step: usize) -> ProgressBar {
    let pb = ProgressBar::new(steps as u64).with_position(step as u64);
    pb.set_style(
        ProgressStyle::with_template(
            "{bar:30} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}",
        )
        .expect("template"),
    );
    pb
}

impl<'a> Training<'a> {
    /// Build the model and optimizer, restore a resumed run's weights, moments, streams and
    /// counters from its checkpoint (`resumed`), and print the model's size.
    pub fn start(
        a: &'a Args,
        res: &'a Resolved,
        run: &'a RunDir,
        config_json: &'a serde_json::Value,
        resumed: Option<State>,
    ) -> Result<Self> {
        let (mut varmap, model, mut opt, n_params) = build_model(a, res)?;
        let ckpt = run.checkpoint();
        let mut stream: TrainStream = suite_train_stream(res.suite, a.seed);
        let mut mask_rng = Rng::new(a.seed ^ 0x5E_ED0F_3A5C);
        let (mut step, mut prior, mut examples) = (0usize, Duration::ZERO, 0usize);
        if let Some(st) = resumed {
            varmap
                .load(ckpt.join("model.safetensors"))
                .with_context(|| format!("loading {}", ckpt.join("model.safetensors").display()))?;
            opt.load(&ckpt.join("optimizer.safetensors"))?;
            stream = TrainStream::from_suite_rng_state(res.suite, st.stream);
            mask_rng = Rng::from_state(st.mask_rng);
            step = st.step;
            prior = Duration::from_secs_f64(st.elapsed_s);
            examples = st.examples;
            eprintln!(
                "resumed at step {step} ({:.1} min trained)",
                prior.as_secs_f64() / 60.0
            );
        }
        let (cfg, vocab) = (&res.cfg, res.vocab);
        eprintln!(
            "{} model: {n_params} parameters (d {}, {} layers, {} heads / {} kv, mlp {}), vocab {vocab}, rows {}+{}, batch {}",
            cfg.arch, cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size,
            tk::max_prompt_tokens(res.suite), a.gen_len, a.batch
        );
        let gen_lens = if a.small_fraction > 0.0 {
            vec![a.small_gen_len, a.gen_len]
        } else {
            vec![a.gen_len]
        };
        let batcher = Batcher::with_gen_lens(
            stream
                .with_weights(res.weights)?
                .with_small_fraction(a.small_fraction)?,
            a.batch,
            gen_lens,
        );
        Ok(Self {
            a,
            res,
            run,
            config_json,
            varmap,
            model,
            opt,
            batcher,
            mask_rng,
            step,
            prior,
            examples,
            ema: None,
        })
    }

    /// Train until `--steps`, the time budget or a signal, logging every step and saving a
    /// checkpoint every `--checkpoint-every` steps and at the end (unless nothing was trained).
    /// Returns the signal that stopped the run, if one did, and the total training time.
    pub fn train(&mut self) -> Result<(Option<i32>, Duration)> {
        let a = self.a;
        // A resumed run keeps the lines its checkpoint covers; a fresh run starts a new log.
        let mut log = self.run.open_log(a.resume.then_some(self.step))?;
        let mut saved_step = a.resume.then_some(self.step);
        let pb = progress_bar(a.steps, self.step);
        let t0 = Instant::now();
        let mut stopped_by = None;
        while self.step < a.steps {
            if let Some(sig) = interrupted() {
                stopped_by = Some(sig);
                break;
            }
            if let Some(m) = a.minutes {
                if (self.prior + t0.elapsed()).as_secs_f64() > m * 60.0 {
                    let step = self.step;
                    pb.println(format!("time budget of {m} minutes reached at step {step}"));
                    break;
                }
            }
            let mut done = self.train_step(&pb, t0)?;
            if a.eval_every > 0
                && (self.step.is_multiple_of(a.eval_every) || self.step == a.steps)
                && interrupted().is_none()
            {
                self.quick_eval_record(&pb, &mut done.rec, done.loss_ema)?;
            }
            writeln!(log, "{}", done.rec)?;
            if self.step.is_multiple_of(a.checkpoint_every) {
                self.save_checkpoint(done.elapsed)?;
                saved_step = Some(self.step);
            }
        }
        pb.finish();
        let elapsed = self.prior + t0.elapsed();
        let nothing_trained = stopped_by.is_some() && self.step == 0;
        if saved_step != Some(self.step) && !nothing_trained {
            self.save_checkpoint(elapsed)?;
        }
        log.sync_all()
            .with_context(|| format!("syncing {}", self.run.dir.join(output::LOG).display()))?;
        Ok((stopped_by, elapsed))
    }

    /// One optimizer step on the next batch, shown on the progress bar (`t0`: when this process
    /// started training).
    fn train_step(&mut self, pb: &ProgressBar, t0: Instant) -> Result<StepDone> {
        let a = self.a;
        let batch = self.batcher.next_batch(&self.res.tok)?;
        let lens = vec![batch.prompt_len; batch.rows.len()];
        let out = sft_loss_with(
            &self.model,
            &batch.rows,
            &lens,
            MASK_ID,
            &mut self.mask_rng,
            &Device::Cpu,
            Some(self.res.block_masking),
        )?;
        let loss_v = out.loss.to_scalar::<f32>()? as f64;
        let grads = out.loss.backward()?;
        let lr = lr_at(self.step, a.steps, a.warmup, a.lr, a.min_lr_ratio);
        let gnorm = self.opt.step(&grads, lr)?;
        self.step += 1;
        let ema = match self.ema {
            Some(e) => 0.98 * e + 0.02 * loss_v,
            None => loss_v,
        };
        self.ema = Some(ema);
        let elapsed = self.prior + t0.elapsed();
        self.examples += batch.rows.len();
        let (step, examples) = (self.step, self.examples);
        pb.set_position(step as u64);
        pb.set_message(format!(
            "loss {:.4} lr {lr:.2e} |g| {gnorm:.2} {:.0} ex/s",
            ema,
            (examples as f64) / elapsed.as_secs_f64()
        ));
        let rec = serde_json::json!({"step": step, "loss": loss_v, "loss_ema": ema, "lr": lr, "grad_norm": gnorm, "elapsed_s": elapsed.as_secs_f64(), "examples": examples});
        Ok(StepDone {
            rec,
            loss_ema: ema,
            elapsed,
        })
    }

    /// Run the quick eval, print it (with `loss_ema`, the smoothed loss) and add its accuracies
    /// to the step's record `rec` (the long suite's per-step accuracies and skills too).
    fn quick_eval_record(
        &self,
        pb: &ProgressBar,
        rec: &mut serde_json::Value,
        loss_ema: f64,
    ) -> Result<()> {
        let (a, step) = (self.a, self.step);
        let acc = quick_eval(
            &self.varmap,
            &self.res.cfg,
            &self.res.tok,
            a,
            self.res.suite,
        )?;
        let txt: Vec<String> = acc
            .iter()
            .map(|(k, v, st)| match st {
                Some(st) => {
                    format!("{} {:.0}% (steps {:.0}%)", k.name(), 100.0 * v, 100.0 * st)
                }
                None => format!("{} {:.0}%", k.name(), 100.0 * v),
            })
            .collect();
        pb.println(format!(
            "step {step}: loss {:.4}, quick eval ({} per task): {}",
            loss_ema,
            a.eval_limit,
            txt.join(", ")
        ));
        rec["eval"] = serde_json::json!(acc
            .iter()
            .map(|(k, v, _)| (k.name(), *v))
            .collect::<BTreeMap<_, _>>());
        if self.res.suite == Suite::Long {
            rec["eval_steps"] = serde_json::json!(acc
                .iter()
                .filter_map(|(k, _, st)| st.map(|st| (k.name(), st)))
                .collect::<BTreeMap<_, _>>());
            self.probe_skills(pb, rec)?;
        }
        Ok(())
    }

    /// Which part of a worked line is learnt (teacher-forced, `dllm_tasks::probe`): printed and
    /// added to `rec` as `skills`.
    fn probe_skills(&self, pb: &ProgressBar, rec: &mut serde_json::Value) -> Result<()> {
        let a = self.a;
        let mut model = inference_copy(&self.varmap, &self.res.cfg)?;
        let qs = dllm_tasks::eval::questions(&[TaskKind::LongMath], Some(a.eval_limit));
        let sk = dllm_tasks::probe::probe_long_math(&mut model, &self.res.tok, &qs, a.gen_len)?;
        pb.println(format!(
            "step {}: long-math skills: copy {:.0}%, lookup {:.0}%, arithmetic {:.0}%",
            self.step,
            100.0 * sk.copy.accuracy(),
            100.0 * sk.lookup.accuracy(),
            100.0 * sk.arithmetic.accuracy()
        ));
        rec["skills"] = serde_json::json!({
            "copy": sk.copy.accuracy(), "lookup": sk.lookup.accuracy(),
            "arithmetic": sk.arithmetic.accuracy(),
        });
        Ok(())
    }

    /// Save a resumable checkpoint of the current step (`elapsed`: its total training time).
    fn save_checkpoint(&self, elapsed: Duration) -> Result<()> {
        // One directory, swapped in as a whole: weights, moments and state of the same step.
        self.run.save_checkpoint(|staged| {
            stage_weights(staged, &self.varmap, "model.safetensors", DType::F32)?;
            staged.with("optimizer.safetensors", |tmp| Ok(self.opt.save(tmp)?))?;
            staged.json("config.json", self.config_json)?;
            staged.json(
                "state.json",
                &State {
                    step: self.step,
                    stream: self.batcher.stream_state(),
                    mask_rng: self.mask_rng.state(),
                    elapsed_s: elapsed.as_secs_f64(),
                    examples: self.examples,
                },
            )
        })
    }
}
