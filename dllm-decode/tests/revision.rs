//! Dual-path progressive revision: staged stabilization, the sparse refresh merged only at step
//! boundaries, revision of a token whose masked re-score changes, skipped logits rows never read,
//! determinism with the refresh really concurrent.

use std::ops::Range;
use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use dllm_decode::{
    generate, Control, DecodeParams, Generation, MbsdParams, RevisionParams, StepEvent, Strategy,
};
use dllm_models::{
    load, Arch, DiffusionLm, DualPathTiming, LoadOptions, ModelInfo, ModelSource, Refresh,
    RefreshRequest, Rows, SpecialTokens,
};

const VOCAB: usize = 8;
const MASK: u32 = 7;

/// A scripted model: a masked position `p` is predicted as `p % 5` with confidence 0.95 when `p`
/// is even, 0.5 when `p % 4 == 3` (promoted one per step) and 0.8 otherwise; a *masked re-score*
/// (a refresh with `score_masked`) predicts `p % 5` again at 0.95 — except positions divisible by
/// 3, which flip to `(p + 1) % 5`. Nothing depends on attention, so every decision of the decoder
/// is known in advance.
struct Scripted {
    info: ModelInfo,
    device: Device,
    cache_len: usize,
    epoch: u64,
    pending: Option<Range<usize>>,
    /// (what happened, epoch at that moment)
    log: Vec<(String, u64)>,
    requested: Vec<(Vec<u32>, Vec<usize>)>,
}

fn row(token: usize, conf: f64) -> Vec<f32> {
    // softmax: p(token) = e^x / (e^x + VOCAB - 1) = conf
    let x = (conf * (VOCAB - 1) as f64 / (1.0 - conf)).ln() as f32;
    (0..VOCAB)
        .map(|t| if t == token { x } else { 0.0 })
        .collect()
}

impl Scripted {
    fn new() -> Self {
        let info = ModelInfo {
            arch: Arch::Llada,
            vocab_size: VOCAB,
            hidden_size: 8,
            num_layers: 1,
            num_heads: 1,
            num_kv_heads: 1,
            head_dim: 8,
            intermediate_size: 8,
            max_seq_len: 128,
            shift_logits: false,
            special: SpecialTokens {
                mask: MASK,
                eos: 6,
                eot: None,
                bos: None,
                pad: None,
            },
            dtype: DType::F32,
            num_params: 0,
        };
        Self {
            info,
            device: Device::Cpu,
            cache_len: 0,
            epoch: 0,
            pending: None,
            log: vec![],
            requested: vec![],
        }
    }

    fn logits(&self, rows: &[Vec<f32>]) -> Tensor {
        let flat: Vec<f32> = rows.concat();
        Tensor::from_vec(flat, (1, rows.len(), VOCAB), &self.device).unwrap()
    }
}

impl DiffusionLm for Scripted {
    fn info(&self) -> &ModelInfo {
        &self.info
    }
    fn device(&self) -> &Device {
        &self.device
    }
    fn forward(
        &mut self,
        c: &Tensor,
        w: Range<usize>,
        rows: Rows<'_>,
    ) -> dllm_models::Result<Tensor> {
        assert!(
            w.start <= self.cache_len,
            "window {w:?} after the cache {}",
            self.cache_len
        );
        let ids: Vec<u32> = c.get(0)?.to_vec1()?;
        let pos: Vec<usize> = match rows {
            Rows::All => w.clone().collect(),
            Rows::Positions(p) => p.to_vec(),
            Rows::None => vec![],
        };
        self.log.push((format!("forward {w:?}"), self.epoch));
        self.requested.push((ids.clone(), pos.clone()));
        self.pending = Some(w);
        let out: Vec<Vec<f32>> = pos
            .iter()
            .map(|&p| {
                let conf = match p {
                    _ if p % 2 == 0 => 0.95,
                    _ if p % 4 == 3 => 0.5,
                    _ => 0.8,
                };
                row(p % 5, conf)
            })
            .collect();
        Ok(self.logits(&out))
    }
    fn commit(&mut self, r: Range<usize>) -> dllm_models::Result<()> {
        let w = self.pending.clone().expect("commit after a forward");
        assert!(r.start >= w.start && r.end <= w.end && r.start <= self.cache_len);
        self.cache_len = self.cache_len.max(r.end);
        self.epoch += 1;
        self.log.push((format!("commit {r:?}"), self.epoch));
        Ok(())
    }
    fn cache_len(&self) -> usize {
        self.cache_len
    }
    fn truncate_cache(&mut self, len: usize) -> dllm_models::Result<()> {
        self.cache_len = len;
        self.pending = None;
        self.epoch += 1;
        Ok(())
    }
    fn epoch(&self) -> u64 {
        self.epoch
    }
    fn compute_refresh(
        &self,
        c: &Tensor,
        positions: &[usize],
        logits: Option<&[usize]>,
    ) -> dllm_models::Result<Refresh> {
        let ids: Vec<u32> = c.get(0)?.to_vec1()?;
        let n = positions.len();
        let kv = Tensor::zeros((1, n, 1, 8), DType::F32, &self.device)?;
        let logits = logits.map(|want| {
            let rows: Vec<Vec<f32>> = want
                .iter()
                .map(|&p| {
                    assert_eq!(ids[p], MASK, "the re-score must see position {p} masked");
                    let t = if p % 3 == 0 { (p + 1) % 5 } else { p % 5 };
                    row(t, 0.95)
                })
                .collect();
            self.logits(&rows)
        });
        Ok(Refresh {
            epoch: self.epoch,
            positions: positions.to_vec(),
            keys: vec![kv.clone()],
            values: vec![kv],
            logits,
            timing: None,
        })
    }
    fn apply_refresh(&mut self, r: &Refresh) -> dllm_models::Result<()> {
        assert_eq!(r.epoch, self.epoch, "stale refresh merged");
        self.epoch += 1;
        self.log
            .push((format!("merge {:?}", r.positions), self.epoch));
        Ok(())
    }
    fn forward_with_refresh(
        &mut self,
        c: &Tensor,
        w: Range<usize>,
        rows: Rows<'_>,
        req: RefreshRequest<'_>,
    ) -> dllm_models::Result<(Tensor, Refresh)> {
        let mask = self.info.special.mask;
        let mut r = req.run_with(c, mask, |c, l| self.compute_refresh(c, req.positions, l))?;
        let t = std::time::Instant::now();
        r.timing = Some(DualPathTiming {
            forward: (t, t),
            refresh: (t, t),
        });
        let out = self.forward(c, w, rows)?;
        Ok((out, r))
    }
}

fn mbsd(revision: RevisionParams) -> DecodeParams {
    DecodeParams {
        gen_length: 24,
        block_length: 8,
        steps: 24,
        strategy: Strategy::Mbsd,
        early_stop: false,
        mbsd: MbsdParams {
            lookahead: false,
            ..Default::default()
        },
        revision,
        ..Default::default()
    }
}

const PROMPT: &[u32] = &[1, 2, 3];

#[test]
fn visible_tokens_are_refreshed_revised_and_stabilised() {
    let mut m = Scripted::new();
    let mut revised_seen = Vec::new();
    let mut obs = |e: &StepEvent<'_>| {
        revised_seen.extend_from_slice(e.revised);
        Control::Continue
    };
    let g = generate(&mut m, PROMPT, &mbsd(RevisionParams::default()), &mut obs).unwrap();
    // Odd positions are predicted at 0.8: Visible, then refreshed. Those divisible by 3 flip.
    assert!(g.refreshes > 0, "{g:?}");
    assert!(g.revised > 0);
    assert_eq!(g.revised, revised_seen.len());
    for &p in &revised_seen {
        assert_eq!(p % 3, 0, "position {p} should not have been revised");
        assert_eq!(g.canvas[p] as usize, (p + 1) % 5, "revised identity of {p}");
    }
    // Even positions are Stable at once: never refreshed, never revised.
    for (what, _) in &m.log {
        if let Some(rest) = what.strip_prefix("merge ") {
            let pos: Vec<usize> = rest
                .trim_matches(|c| c == '[' || c == ']')
                .split(", ")
                .map(|x| x.parse().unwrap())
                .collect();
            assert!(
                pos.iter().all(|p| p % 2 == 1),
                "a Stable position was refreshed: {pos:?}"
            );
        }
    }
    // Visible tokens left at a block's end are counted.
    assert!(g.unstable_at_block_end > 0);
    assert_eq!(g.generated().iter().filter(|&&t| t == MASK).count(), 0);
}

#[test]
fn refreshes_merge_only_at_step_boundaries() {
    let mut m = Scripted::new();
    generate(&mut m, PROMPT, &mbsd(RevisionParams::default()), &mut ()).unwrap();
    // Every merge follows the forward it ran beside and precedes the next forward: the forward of
    // a step never sees the refresh computed beside it.
    let log = &m.log;
    let mut merges = 0;
    for (i, (what, _)) in log.iter().enumerate() {
        if what.starts_with("merge") {
            merges += 1;
            assert!(log[i - 1].0.starts_with("forward"), "{:?}", &log[i - 1..=i]);
            assert_eq!(
                log[i].1,
                log[i - 1].1 + 1,
                "merged against the epoch the forward read"
            );
        }
    }
    assert!(merges > 0);
}

#[test]
fn skipped_logits_rows_are_never_requested_and_switching_off_works() {
    let mut m = Scripted::new();
    let g = generate(&mut m, PROMPT, &mbsd(RevisionParams::default()), &mut ()).unwrap();
    assert!(g.logits_rows_skipped > 0);
    for (ids, rows) in &m.requested {
        assert!(
            rows.iter().all(|&p| ids[p] == MASK),
            "logits asked for a decided position"
        );
    }
    // Without SLS every window row is requested; nothing is skipped and the output is the same.
    let mut m2 = Scripted::new();
    let no_sls = RevisionParams {
        sls: false,
        ..Default::default()
    };
    let g2 = generate(&mut m2, PROMPT, &mbsd(no_sls), &mut ()).unwrap();
    assert_eq!(g2.logits_rows_skipped, 0);
    assert_eq!(g2.canvas, g.canvas);
    // Without STS nothing is Visible: no refresh, no revision.
    let no_sts = RevisionParams {
        sts: false,
        ..Default::default()
    };
    let mut m3 = Scripted::new();
    let g3 = generate(&mut m3, PROMPT, &mbsd(no_sts), &mut ()).unwrap();
    assert_eq!(
        (g3.refreshes, g3.revised, g3.unstable_at_block_end),
        (0, 0, 0)
    );
    // Without SCR, visible tokens stay visible and unrevised.
    let no_scr = RevisionParams {
        scr: false,
        ..Default::default()
    };
    let mut m4 = Scripted::new();
    let g4 = generate(&mut m4, PROMPT, &mbsd(no_scr), &mut ()).unwrap();
    assert_eq!((g4.refreshes, g4.revised), (0, 0));
}

#[test]
fn threshold_with_sts_and_bad_thetas_are_named_errors() {
    let mut p = mbsd(RevisionParams::default());
    p.threshold = Some(0.9);
    let e = generate(&mut Scripted::new(), PROMPT, &p, &mut ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("threshold") && e.contains("revision.sts"), "{e}");
    let p = mbsd(RevisionParams {
        theta_visible: 0.95,
        ..Default::default()
    });
    let e = generate(&mut Scripted::new(), PROMPT, &p, &mut ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("revision.theta_visible"), "{e}");
    let p = DecodeParams {
        strategy: Strategy::DualCache,
        revision: RevisionParams {
            scr: false,
            ..Default::default()
        },
        ..mbsd(RevisionParams::default())
    };
    let e = generate(&mut Scripted::new(), PROMPT, &p, &mut ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("revision.scr"), "{e}");
}

fn shipped() -> dllm_models::DiffusionTransformer {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/tiny-llada");
    load(
        &ModelSource::parse(dir.to_str().unwrap()).unwrap(),
        &LoadOptions::default(),
    )
    .unwrap()
    .model
}

#[test]
fn deterministic_over_runs_and_thread_counts_with_a_concurrent_refresh() {
    // High thresholds make blocks take several steps (one promoted token each) and leave visible
    // tokens to refresh on the real model.
    let p = DecodeParams {
        revision: RevisionParams {
            theta_visible: 0.999,
            theta_stable: 0.9999,
            ..Default::default()
        },
        ..mbsd(RevisionParams::default())
    };
    let prompt: &[u32] = &[2, 40, 41, 42, 43, 44, 45, 46, 4];
    let run = |threads: usize| -> Generation {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| generate(&mut shipped(), prompt, &p, &mut ()).unwrap())
    };
    let first = run(1);
    assert!(first.refreshes > 0, "{first:?}");
    // Wall time (`refresh_ms`) is reported, not asserted: it may read 0 on a coarse clock.
    assert!(first.refresh_ms.is_finite() && first.refresh_ms >= 0.0);
    for k in 0..20 {
        let t = 1 + k % 3;
        let g = run(t);
        assert_eq!(g.canvas, first.canvas, "run {k} with {t} threads");
        assert_eq!(
            (g.forwards, g.revised, g.refreshes),
            (first.forwards, first.revised, first.refreshes)
        );
    }
}
