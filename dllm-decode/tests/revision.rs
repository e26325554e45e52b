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
    load, Arch, DiffusionLm, DualPathTiming, LoadOptions, ModelId, ModelInfo, ModelSource, Refresh,
    RefreshRequest, Rows, SequenceToken, SpecialTokens,
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
    /// The model and sequence ids (its epoch is `epoch`).
    id: SequenceToken,
    epoch: u64,
    pending: Option<Range<usize>>,
    /// (what happened, epoch at that moment)
    log: Vec<(String, u64)>,
    /// Every position re-scored (masked alone), in order.
    rescored: std::cell::RefCell<Vec<usize>>,
    /// Draft rule instead of the fixed script: positions beyond the current block are predicted at
    /// 0.95 by forwards 2, 6, 10, ... and 0.5 by the others, except the last block's, always at 0.95
    /// (current-block positions: 0.95 when even, 0.5 when odd); every (forward, position,
    /// confidence) of such a draft row is logged.
    fickle: Option<Vec<(usize, usize, f64)>>,
    forwards: usize,
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
            id: SequenceToken::new_sequence(ModelId::fresh()),
            epoch: 0,
            pending: None,
            log: vec![],
            rescored: Default::default(),
            fickle: None,
            forwards: 0,
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
        let k = self.forwards;
        self.forwards += 1;
        if let Some(log) = self.fickle.as_mut() {
            // The current block: the one holding the first masked generated position.
            let first = (PROMPT.len()..ids.len())
                .find(|&q| ids[q] == MASK)
                .unwrap_or(0);
            let block_end = PROMPT.len() + ((first - PROMPT.len()) / 8 + 1) * 8;
            let out: Vec<Vec<f32>> = pos
                .iter()
                .map(|&p| {
                    let conf = if p >= block_end {
                        let c = if k % 4 == 2 || p >= PROMPT.len() + 16 {
                            0.95
                        } else {
                            0.5
                        };
                        log.push((k, p, c));
                        c
                    } else if p % 2 == 0 {
                        0.95
                    } else {
                        0.5
                    };
                    row(p % 5, conf)
                })
                .collect();
            return Ok(self.logits(&out));
        }
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
    fn token(&self) -> SequenceToken {
        SequenceToken {
            epoch: self.epoch,
            ..self.id
        }
    }
    fn rescore(&self, c: &Tensor, positions: &[usize]) -> dllm_models::Result<Tensor> {
        self.rescored.borrow_mut().extend_from_slice(positions);
        // Each position masked alone, as the trait's own definition does it.
        let ids: Vec<u32> = c.get(0)?.to_vec1()?;
        let rows: Vec<Vec<f32>> = positions
            .iter()
            .map(|&p| {
                assert_ne!(
                    ids[p], MASK,
                    "a re-scored position holds its token in the canvas"
                );
                let t = if p % 3 == 0 { (p + 1) % 5 } else { p % 5 };
                row(t, 0.95)
            })
            .collect();
        Ok(self.logits(&rows))
    }
    fn compute_refresh(
        &self,
        c: &Tensor,
        positions: &[usize],
        logits: Option<&[usize]>,
    ) -> dllm_models::Result<Refresh> {
        let ids: Vec<u32> = c.get(0)?.to_vec1()?;
        let logits_at = logits.map(<[usize]>::to_vec).unwrap_or_default();
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
            token: self.token(),
            positions: positions.to_vec(),
            keys: vec![kv.clone()],
            values: vec![kv],
            logits,
            scored: logits_at,
            timing: None,
        })
    }
    fn apply_refresh(&mut self, r: &Refresh) -> dllm_models::Result<()> {
        assert_eq!(r.token, self.token(), "stale refresh merged");
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
        let mut r = req.run_with(
            c,
            |c, p, l| self.compute_refresh(c, p, l),
            |c, p| self.rescore(c, p),
        )?;
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

/// The paper's thresholds (0.7 / 0.9), which the scripted model's confidences are written around
/// (the library's defaults are higher: chosen on the shipped model, see the README).
fn paper() -> RevisionParams {
    RevisionParams {
        theta_visible: 0.7,
        theta_stable: 0.9,
        ..RevisionParams::default()
    }
}

#[test]
fn visible_tokens_are_refreshed_revised_and_stabilised() {
    let mut m = Scripted::new();
    let mut revised_seen = Vec::new();
    let mut obs = |e: &StepEvent<'_>| {
        revised_seen.extend_from_slice(e.revised);
        Control::Continue
    };
    let g = generate(&mut m, PROMPT, &mbsd(paper()), &mut obs).unwrap();
    // Odd positions are predicted at 0.8: Visible, then refreshed. Those divisible by 3 flip.
    assert!(g.refreshes > 0, "{g:?}");
    assert!(g.revised > 0);
    assert_eq!(g.revised, revised_seen.len());
    for &p in &revised_seen {
        assert_eq!(p % 3, 0, "position {p} should not have been revised");
        assert_eq!(g.canvas[p] as usize, (p + 1) % 5, "revised identity of {p}");
    }
    // Even positions are Stable at once: never re-scored, never revised.
    let rescored = m.rescored.borrow();
    assert!(!rescored.is_empty());
    assert!(
        rescored.iter().all(|p| p % 2 == 1),
        "a Stable position was re-scored: {rescored:?}"
    );
    // Visible tokens left at a block's end are counted.
    assert!(g.unstable_at_block_end > 0);
    assert_eq!(g.generated().iter().filter(|&&t| t == MASK).count(), 0);
}

#[test]
fn refreshes_merge_only_at_step_boundaries() {
    let mut m = Scripted::new();
    generate(&mut m, PROMPT, &mbsd(paper()), &mut ()).unwrap();
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
    let g = generate(&mut m, PROMPT, &mbsd(paper()), &mut ()).unwrap();
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
        ..paper()
    };
    let g2 = generate(&mut m2, PROMPT, &mbsd(no_sls), &mut ()).unwrap();
    assert_eq!(g2.logits_rows_skipped, 0);
    assert_eq!(g2.canvas, g.canvas);
    // Without STS nothing is Visible: no refresh, no revision.
    let no_sts = RevisionParams {
        sts: false,
        ..paper()
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
        ..paper()
    };
    let mut m4 = Scripted::new();
    let g4 = generate(&mut m4, PROMPT, &mbsd(no_scr), &mut ()).unwrap();
    assert_eq!((g4.refreshes, g4.revised), (0, 0));
}

#[test]
fn threshold_with_sts_and_bad_thetas_are_named_errors() {
    let mut p = mbsd(paper());
    p.threshold = Some(0.9);
    let e = generate(&mut Scripted::new(), PROMPT, &p, &mut ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("threshold") && e.contains("revision.sts"), "{e}");
    // theta_visible above theta_stable.
    let p = mbsd(RevisionParams {
        theta_visible: 0.9,
        theta_stable: 0.8,
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
        ..mbsd(paper())
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
        ..mbsd(paper())
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
    assert!(first.refreshes + first.rescored > 0, "{first:?}");
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

/// A model whose masked prediction at `p` copies the token at `p + 1` (token 0, wrong, when that
/// position is masked too): a worked line's result restated on the next line.
struct Neighbour(Scripted);

impl DiffusionLm for Neighbour {
    fn info(&self) -> &ModelInfo {
        &self.0.info
    }
    fn device(&self) -> &Device {
        &self.0.device
    }
    fn forward(&mut self, c: &Tensor, w: Range<usize>, r: Rows<'_>) -> dllm_models::Result<Tensor> {
        self.0.forward(c, w, r)
    }
    fn commit(&mut self, r: Range<usize>) -> dllm_models::Result<()> {
        self.0.commit(r)
    }
    fn cache_len(&self) -> usize {
        self.0.cache_len
    }
    fn truncate_cache(&mut self, len: usize) -> dllm_models::Result<()> {
        self.0.truncate_cache(len)
    }
    fn token(&self) -> SequenceToken {
        self.0.token()
    }
    fn compute_refresh(
        &self,
        c: &Tensor,
        positions: &[usize],
        logits: Option<&[usize]>,
    ) -> dllm_models::Result<Refresh> {
        let ids: Vec<u32> = c.get(0)?.to_vec1()?;
        let rows: Vec<Vec<f32>> = logits
            .unwrap_or(&[])
            .iter()
            .map(|&p| {
                let next = ids[p + 1];
                row(if next == MASK { 0 } else { next as usize }, 0.95)
            })
            .collect();
        Ok(Refresh {
            token: self.0.token(),
            positions: positions.to_vec(),
            keys: vec![],
            values: vec![],
            logits: logits.map(|_| self.0.logits(&rows)),
            scored: logits.map(<[usize]>::to_vec).unwrap_or_default(),
            timing: None,
        })
    }
    fn apply_refresh(&mut self, r: &Refresh) -> dllm_models::Result<()> {
        self.0.apply_refresh(r)
    }
}

#[test]
fn a_re_score_masks_each_position_alone_where_joint_masking_is_wrong() {
    let m = Neighbour(Scripted::new());
    // Positions 4 and 5 hold 3, 3 and position 6 holds 3: each is the copy of its neighbour.
    let ids: Vec<u32> = vec![1, 2, 3, 4, 3, 3, 3, 0];
    let c = Tensor::from_vec(ids.clone(), (1, ids.len()), &Device::Cpu).unwrap();
    let argmax = |t: &Tensor| -> Vec<usize> {
        t.get(0)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap()
            .iter()
            .map(|r| {
                r.iter()
                    .enumerate()
                    .fold((0, f32::MIN), |a, (i, &x)| if x > a.1 { (i, x) } else { a })
                    .0
            })
            .collect()
    };
    // Each masked alone: both see their neighbour and keep token 3.
    let alone = m.rescore(&c, &[4, 5]).unwrap();
    assert_eq!(argmax(&alone), vec![3, 3]);
    // Masked jointly (the old refresh): position 4 no longer sees position 5 and predicts 0.
    let mut joint = ids.clone();
    joint[4] = MASK;
    joint[5] = MASK;
    let jt = Tensor::from_vec(joint, (1, ids.len()), &Device::Cpu).unwrap();
    let j = m.compute_refresh(&jt, &[4, 5], Some(&[4, 5])).unwrap();
    assert_eq!(argmax(&j.logits.unwrap()), vec![0, 3]);
}

/// One offer of drafts (position, confidence) and the positions accepted.
type Offer = (Vec<(usize, f64)>, Vec<usize>);

/// Records every offer of drafts and answers with the threshold rule.
struct Recording {
    offers: std::rc::Rc<std::cell::RefCell<Vec<Offer>>>,
}

impl dllm_decode::Selector for Recording {
    fn select(&mut self, c: &[(usize, f64)], _: usize) -> Vec<usize> {
        dllm_decode::select::above_threshold(c, 0.9)
    }
    fn accept_drafts(&mut self, drafts: &[(usize, f64)]) -> Vec<usize> {
        let acc: Vec<usize> = drafts.iter().filter(|d| d.1 >= 0.9).map(|d| d.0).collect();
        self.offers
            .borrow_mut()
            .push((drafts.to_vec(), acc.clone()));
        acc
    }
}

#[test]
fn drafts_are_judged_on_the_confidence_of_the_forward_that_makes_their_block_current() {
    let p = DecodeParams {
        revision: RevisionParams {
            sts: false,
            scr: false,
            ..Default::default()
        },
        mbsd: MbsdParams::default(),
        ..mbsd(paper())
    };
    let mut m = Scripted::new();
    m.fickle = Some(Vec::new());
    let offers = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let g = dllm_decode::Decoder::new(p)
        .selector(Recording {
            offers: offers.clone(),
        })
        .run(&mut m, PROMPT, &mut ())
        .unwrap();
    let log = m.fickle.take().unwrap();
    let offers = offers.borrow();
    assert!(!offers.is_empty() && g.lookahead_positions > 0, "{g:?}");
    let mut stale_confident_rejected = 0;
    for (offered, accepted) in offers.iter() {
        for &(pos, conf) in offered {
            // The offered confidence is the one of the last forward that predicted the draft (a
            // position is a draft only before its block is current).
            let last = log
                .iter()
                .filter(|l| l.1 == pos)
                .max_by_key(|l| l.0)
                .unwrap();
            assert!(
                (conf - last.2).abs() < 0.05,
                "position {pos}: {conf} vs {}",
                last.2
            );
            let earlier_confident = log.iter().any(|l| l.1 == pos && l.0 < last.0 && l.2 >= 0.9);
            if conf < 0.9 {
                assert!(
                    !accepted.contains(&pos),
                    "a draft below the criterion was accepted"
                );
                stale_confident_rejected += usize::from(earlier_confident);
            }
        }
    }
    assert!(g.drafts_accepted > 0, "{g:?}");
    assert!(
        stale_confident_rejected > 0,
        "no draft was confident earlier and below the criterion at the end: {log:?}"
    );
}
