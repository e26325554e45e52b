//! Multi-block speculative decoding: equal to the dual cache with sliding and lookahead off, drafts
//! never committed into the cache, blocks decided strictly left to right, deterministic, and the
//! lookahead priced by the latency table.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use dllm_decode::latency::{Interpolation, LatencyPoint, LatencyTable, ModelDesc};
use dllm_decode::{
    generate, Control, Decide, DecodeParams, Decoder, MbsdParams, Outcome, StepEvent, Strategy,
};
use dllm_models::synthetic::{random_weights, tiny_llada};
use dllm_models::weights::HfWeights;
use dllm_models::{
    load, DiffusionLm, DiffusionTransformer, LoadOptions, ModelInfo, ModelSource, OpMode, Refresh,
    Rows,
};

fn shipped(name: &str) -> DiffusionTransformer {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models")
        .join(name);
    load(
        &ModelSource::parse(dir.to_str().unwrap()).unwrap(),
        &LoadOptions::default(),
    )
    .unwrap()
    .model
}

fn synthetic() -> DiffusionTransformer {
    let cfg = tiny_llada();
    let w = random_weights(&cfg, 5).unwrap();
    let src = HfWeights::from_tensors(w, cfg.arch, DType::F32, &Device::Cpu);
    DiffusionTransformer::new(cfg, &src, OpMode::Fused).unwrap()
}

/// `<bos> Tom has 23 apples. He buys 5 more. How many apples does Tom have now? <sep>` in the
/// suite tokenizer is not needed: any in-vocabulary prompt exercises the policies.
const PROMPT: &[u32] = &[2, 40, 41, 42, 43, 44, 45, 46, 4];

/// Multi-block speculative decoding alone (no staged decisions, every window row's logits, no
/// shown guess unless `mbsd` asks for one: these tests follow the windows, and a guess's shadow
/// is a forward of its own on a model without in-forward shadows): `strategy` names the policy
/// (any mbsd value means mbsd with `mbsd`).
fn params(strategy: Strategy, threshold: Option<f32>, mbsd: MbsdParams) -> DecodeParams {
    let is_mbsd = strategy.is_mbsd();
    DecodeParams {
        gen_length: 24,
        block_length: 8,
        steps: 24,
        strategy: if is_mbsd {
            Strategy::Mbsd(MbsdParams {
                show_guess: Some(mbsd.show_guess.unwrap_or(false)),
                ..mbsd
            })
        } else {
            strategy
        },
        decide: threshold.map_or(Decide::Schedule, Decide::Threshold),
        early_stop: false,
        sls: !is_mbsd,
        ..Default::default()
    }
}

/// The mbsd policy (its parameters are given to [`params`] separately).
const MBSD: fn(MbsdParams) -> Strategy = Strategy::Mbsd;

fn off() -> MbsdParams {
    MbsdParams {
        sliding: Some(false),
        lookahead: false,
        ..Default::default()
    }
}

#[test]
fn only_the_first_forward_is_a_whole_canvas_forward() {
    for name in ["tiny-llada", "tiny-dream"] {
        for threshold in [None, Some(0.9), Some(0.5)] {
            for mbsd in [
                off(),
                MbsdParams::default(),
                MbsdParams {
                    lookahead: true,
                    ..Default::default()
                },
            ] {
                let (g, spy) = checked(
                    shipped(name),
                    &params(MBSD(MbsdParams::default()), threshold, mbsd),
                );
                let len = g.canvas.len();
                assert_eq!(
                    spy.windows[0],
                    0..len,
                    "{name}: the first forward caches everything"
                );
                let plen = PROMPT.len();
                // Dream's window refreshes the prompt at each block start (from its first row with
                // logits; never the whole canvas).
                let shift = spy.info().shift_logits;
                let (_, refresh) = mbsd.resolved(shift);
                for w in &spy.windows[1..] {
                    assert!(
                        (w.start >= plen || (refresh && w.start == usize::from(shift)))
                            && w.len() < len,
                        "{name} threshold {threshold:?}: forward {w:?} after the first one"
                    );
                }
                // The dual cache runs a whole-canvas forward at every block start.
                let dual = generate(
                    &mut shipped(name),
                    PROMPT,
                    &params(Strategy::DualCache, threshold, MbsdParams::default()),
                    &mut (),
                )
                .unwrap();
                let full = |t: &[dllm_decode::ForwardTrace]| {
                    t.iter().filter(|f| f.start == 0 && f.end == len).count()
                };
                assert_eq!(full(&dual.trace), 3, "{name}");
                assert_eq!(full(&g.trace), 1, "{name}");
                if mbsd == off() {
                    assert_eq!(
                        (g.drafts, g.draft_predictions, g.lookahead_positions),
                        (0, 0, 0)
                    );
                }
            }
        }
    }
}

/// Records the ids each forward saw and every commit, delegating to a real model.
struct Spy {
    inner: DiffusionTransformer,
    last_canvas: Vec<u32>,
    last_window: Range<usize>,
    commits: Vec<(Range<usize>, Vec<u32>)>,
    windows: Vec<Range<usize>>,
}

impl DiffusionLm for Spy {
    fn info(&self) -> &ModelInfo {
        self.inner.info()
    }
    fn device(&self) -> &Device {
        self.inner.device()
    }
    fn forward(
        &mut self,
        c: &Tensor,
        w: Range<usize>,
        rows: Rows<'_>,
    ) -> dllm_models::Result<Tensor> {
        self.last_canvas = c.get(0)?.to_vec1::<u32>()?;
        self.last_window = w.clone();
        self.windows.push(w.clone());
        self.inner.forward(c, w, rows)
    }
    fn commit(&mut self, r: Range<usize>) -> dllm_models::Result<()> {
        self.commits.push((r.clone(), self.last_canvas.clone()));
        self.inner.commit(r)
    }
    fn cache_len(&self) -> usize {
        self.inner.cache_len()
    }
    fn truncate_cache(&mut self, len: usize) -> dllm_models::Result<()> {
        self.inner.truncate_cache(len)
    }
    fn token(&self) -> dllm_models::SequenceToken {
        self.inner.token()
    }
    fn compute_refresh(
        &self,
        c: &Tensor,
        p: &[usize],
        l: Option<&[usize]>,
    ) -> dllm_models::Result<Refresh> {
        self.inner.compute_refresh(c, p, l)
    }
    fn apply_refresh(&mut self, r: &Refresh) -> dllm_models::Result<()> {
        self.inner.apply_refresh(r)
    }
}

/// Decode with `p`, checking after every step that decisions stay in the current block and blocks
/// complete left to right, and after the run that every commit holds positions as the forward saw
/// them undecided (the mask) or with their final token: never a draft.
fn checked(model: DiffusionTransformer, p: &DecodeParams) -> (Outcome, Spy) {
    let mut spy = Spy {
        inner: model,
        last_canvas: vec![],
        last_window: 0..0,
        commits: vec![],
        windows: vec![],
    };
    let plen = PROMPT.len();
    let bl = p.block_length;
    let mask = spy.info().special.mask;
    let mut last_block = 0;
    let mut block_of_step = Vec::new();
    let mut obs = |e: &StepEvent<'_>| {
        let block = plen + e.block * bl..plen + (e.block + 1) * bl;
        assert!(e.block >= last_block, "blocks go left to right");
        last_block = e.block;
        // A step decides inside its block; the drafts later blocks accept when this step makes
        // them current (several, when drafts fill a block) are reported with it.
        assert!(
            e.unmasked.iter().all(|&q| q >= block.start),
            "step {} decided {:?} before block {block:?}",
            e.step,
            e.unmasked
        );
        assert!(
            e.canvas[plen..block.start].iter().all(|&t| t != mask),
            "block {} is current while an earlier block is undecided",
            e.block
        );
        assert!(
            (block.end..e.canvas.len()).all(|q| e.canvas[q] == mask || e.unmasked.contains(&q)),
            "a position after the current block was decided (a draft leaked into the output)"
        );
        block_of_step.push(e.block);
        Control::Continue
    };
    let g = Decoder::new(*p).run(&mut spy, PROMPT, &mut obs).unwrap();
    let len = g.canvas.len();
    assert!(spy.commits.iter().all(|(r, _)| r.end <= len));
    for (r, seen) in &spy.commits {
        assert!(
            r.clone().all(|q| seen[q] == mask || g.canvas[q] == seen[q]),
            "commit {r:?} holds a position the forward saw with another token than its final one"
        );
    }
    (g, spy)
}

#[test]
fn drafts_never_enter_the_cache_and_blocks_commit_left_to_right() {
    // (threshold, sliding, lookahead, trigger, allowance)
    let table: &[(Option<f32>, bool, bool, usize, f64)] = &[
        (Some(0.9), true, false, 4, 0.1),
        (Some(0.9), true, true, 4, 0.1),
        (Some(0.5), true, true, 8, 0.0),
        (Some(0.9), false, true, 16, 1.0),
        (None, true, true, 4, 0.1),
        (Some(0.7), true, true, 0, 0.5),
    ];
    for &(threshold, sliding, lookahead, trigger, allowance) in table {
        let mbsd = MbsdParams {
            sliding: Some(sliding),
            lookahead,
            trigger,
            allowance,
            ..Default::default()
        };
        for model in [shipped("tiny-llada"), synthetic()] {
            let p = params(MBSD(MbsdParams::default()), threshold, mbsd);
            let (g, spy) = checked(model, &p);
            assert!(g.generated().iter().all(|&t| t != spy.info().special.mask));
            assert_eq!(g.drafts, g.drafts_accepted + g.drafts_rejected);
            // The trace is the forwards the model saw.
            assert_eq!(g.trace.len(), g.forwards);
            assert_eq!(
                g.trace.iter().map(|t| t.active).sum::<usize>(),
                g.active_positions
            );
            let seen: Vec<Range<usize>> = g.trace.iter().map(|t| t.start..t.end).collect();
            assert_eq!(seen, spy.windows);
            let plen = PROMPT.len();
            let block_ends = [plen + 8, plen + 16, plen + 24];
            for (w, t) in spy.windows.iter().zip(&g.trace).skip(1) {
                // A window ends at its block's end unless lookahead extended it (drafts).
                assert!(block_ends.contains(&(w.end - t.lookahead)), "{w:?} {t:?}");
                if !lookahead {
                    assert_eq!(t.lookahead, 0);
                }
            }
            assert_eq!(
                g.trace.iter().map(|t| t.lookahead).sum::<usize>(),
                g.lookahead_positions
            );
        }
    }
}

#[test]
fn temperature_zero_is_deterministic_and_sliding_produces_accepted_drafts() {
    // Lookahead on (off by default): drafts come from the lookahead rows.
    let look = MbsdParams {
        lookahead: true,
        ..Default::default()
    };
    let p = params(MBSD(look), Some(0.9), look);
    let a = generate(&mut shipped("tiny-llada"), PROMPT, &p, &mut ()).unwrap();
    let b = generate(&mut shipped("tiny-llada"), PROMPT, &p, &mut ()).unwrap();
    assert_eq!(a, b);
    assert!(a.draft_predictions > 0);
    assert!(a.mean_active_per_forward() > 0.0);
    // Shown as context, drafts change what later forwards see but not the invariants.
    let ctx = MbsdParams {
        draft_context: Some(0.9),
        ..look
    };
    let (g, _) = checked(
        shipped("tiny-llada"),
        &params(MBSD(MbsdParams::default()), Some(0.9), ctx),
    );
    let again = generate(
        &mut shipped("tiny-llada"),
        PROMPT,
        &params(MBSD(MbsdParams::default()), Some(0.9), ctx),
        &mut (),
    )
    .unwrap();
    assert_eq!(g, again);
}

fn flat_table(bucket: usize, ms: f64) -> LatencyTable {
    // Step-shaped: every window up to `bucket` costs `ms`, the next bucket twice as much.
    LatencyTable {
        version: 1,
        device: "test".into(),
        model: ModelDesc::default(),
        provenance: "measured".into(),
        interpolation: Interpolation::Step,
        threads: None,
        runs: 1,
        points: [(bucket, ms), (2 * bucket, 2.0 * ms)]
            .iter()
            .map(|&(w, ms)| LatencyPoint {
                window: w,
                rows: w,
                cached: 0,
                ms,
                min_ms: None,
                max_ms: None,
            })
            .collect(),
    }
}

/// The rows each forward after the first computes (window, verification and guess rows), and
/// the guesses shown, in one generation on the synthetic model, threshold 0.9.
fn computed_rows(table: LatencyTable, mbsd: MbsdParams) -> (Vec<usize>, usize) {
    let p = params(MBSD(MbsdParams::default()), Some(0.9), mbsd);
    let out = Decoder::new(p)
        .latency_table(Arc::new(table))
        .run(&mut synthetic(), PROMPT, &mut ())
        .unwrap();
    let rows = out.trace.iter().skip(1).map(|f| f.computed).collect();
    (rows, out.guesses_shown)
}

#[test]
fn the_guess_rows_fit_the_bucket_when_asked_or_with_a_span() {
    // Without a span the bucket fit leaves the shown guess's shadow row out of the forward it
    // fits by default: a window cut to the 8-position edge plus the guess's row pays for the next
    // bucket. With `fit_guess` the window gives up a position for the row instead.
    let shown = MbsdParams {
        lookahead: false,
        show_guess: Some(true),
        ..Default::default()
    };
    let fitted = MbsdParams {
        fit_guess: Some(true),
        ..shown
    };
    let (rows, guesses) = computed_rows(flat_table(8, 100.0), shown);
    assert!(guesses > 0 && rows.iter().any(|&r| r > 8), "{rows:?}");
    let (rows, guesses) = computed_rows(flat_table(8, 100.0), fitted);
    assert!(guesses > 0 && rows.iter().all(|&r| r <= 8), "{rows:?}");
    // The family's default (this model has no shifted logits, like LLaDA): with a span the rows
    // are fitted as when asked, and asking for none leaves them out again.
    let spanned = |fit_guess| MbsdParams {
        span: Some(8),
        fit_guess,
        ..shown
    };
    let (rows, _) = computed_rows(flat_table(8, 100.0), spanned(None));
    assert!(rows.iter().all(|&r| r <= 8), "{rows:?}");
    assert_eq!(
        computed_rows(flat_table(8, 100.0), spanned(None)),
        computed_rows(flat_table(8, 100.0), spanned(Some(true)))
    );
    let (rows, _) = computed_rows(flat_table(8, 100.0), spanned(Some(false)));
    assert!(rows.iter().any(|&r| r > 8), "{rows:?}");
}

#[test]
fn fitting_the_guess_needs_the_bucket_fit_and_the_guess() {
    for (m, what) in [
        (
            MbsdParams {
                fit_guess: Some(true),
                fit_bucket: Some(false),
                show_guess: Some(true),
                ..Default::default()
            },
            "bucket fit",
        ),
        (
            MbsdParams {
                fit_guess: Some(true),
                show_guess: Some(false),
                ..Default::default()
            },
            "shown guess",
        ),
    ] {
        let p = params(MBSD(MbsdParams::default()), Some(0.9), m);
        let e = Decoder::new(p)
            .run(&mut synthetic(), PROMPT, &mut ())
            .unwrap_err()
            .to_string();
        assert!(e.contains("fit_guess") && e.contains(what), "{e}");
        // Left to the family, it is off where it cannot apply: never an error.
        let family = MbsdParams {
            fit_guess: None,
            span: Some(8),
            ..m
        };
        let p = params(MBSD(MbsdParams::default()), Some(0.9), family);
        Decoder::new(p)
            .run(&mut synthetic(), PROMPT, &mut ())
            .unwrap();
    }
}

/// The forward windows of one generation on the synthetic model, threshold 0.9.
fn windows(table: LatencyTable, mbsd: MbsdParams) -> Vec<Range<usize>> {
    let mut spy = Spy {
        inner: synthetic(),
        last_canvas: vec![],
        last_window: 0..0,
        commits: vec![],
        windows: vec![],
    };
    let p = params(MBSD(MbsdParams::default()), Some(0.9), mbsd);
    Decoder::new(p)
        .latency_table(Arc::new(table))
        .run(&mut spy, PROMPT, &mut ())
        .unwrap();
    spy.windows
}

#[test]
fn a_window_just_past_a_bucket_edge_is_cut_back_to_it() {
    // An 8-position bucket and 8-position blocks: at a block start the window holds the previous
    // block's last decided positions (their K/V are stale) plus the whole block, a few positions
    // past the edge.
    let fit = MbsdParams {
        lookahead: false,
        ..Default::default()
    };
    let unfit = MbsdParams {
        fit_bucket: Some(false),
        ..fit
    };
    let plen = PROMPT.len();
    let w = windows(flat_table(8, 100.0), unfit);
    assert!(
        w.iter().skip(1).any(|r| r.len() > 8),
        "without the fit some window pays for a second bucket: {w:?}"
    );
    let w = windows(flat_table(8, 100.0), fit);
    assert!(w.iter().skip(1).all(|r| r.len() <= 8), "{w:?}");
    // Some window was cut: without lookahead only a cut ends a window inside its block (the
    // block ends are plen + 8k).
    assert!(
        w.iter().skip(1).any(|r| !(r.end - plen).is_multiple_of(8)),
        "{w:?}"
    );
    // A linear table has no bucket edge: nothing is cut.
    let mut linear = flat_table(8, 100.0);
    linear.interpolation = Interpolation::Linear;
    let a = windows(linear.clone(), fit);
    let b = windows(linear, unfit);
    assert_eq!(a, b);
}

#[test]
fn the_block_start_refresh_recomputes_everything_before_the_block_once_per_block() {
    let plen = PROMPT.len();
    let base = MbsdParams {
        sliding: Some(false),
        lookahead: false,
        fit_bucket: Some(false),
        ..Default::default()
    };
    let refresh = MbsdParams {
        refresh: Some(true),
        ..base
    };
    let plain = windows(flat_table(8, 100.0), base);
    // After the whole-canvas first forward no window reaches back into the prompt.
    assert!(plain.iter().skip(1).all(|r| r.start >= plen), "{plain:?}");
    let w = windows(flat_table(8, 100.0), refresh);
    for b in 1..3 {
        let end = plen + 8 * (b + 1);
        let in_block: Vec<&Range<usize>> = w.iter().skip(1).filter(|r| r.end == end).collect();
        assert!(!in_block.is_empty(), "block {b}: {w:?}");
        // The block's first window starts at the canvas start, its later ones at the block.
        assert_eq!(in_block[0].start, 0, "block {b}: {w:?}");
        assert!(
            in_block[1..].iter().all(|r| r.start >= plen + 8 * b),
            "block {b}: {w:?}"
        );
    }
}

#[test]
fn lookahead_fills_a_free_bucket_and_stops_at_its_edge_or_the_budget() {
    let look = MbsdParams {
        sliding: Some(false),
        lookahead: true,
        trigger: 8,
        allowance: 0.0,
        ..Default::default()
    };
    // A 16-position bucket: a window ending at its block's end grows to 16 for free, never beyond.
    let w = windows(flat_table(16, 100.0), look);
    let plen = PROMPT.len();
    let block_ends = [plen + 8, plen + 16, plen + 24];
    let grown: Vec<&Range<usize>> = w
        .iter()
        .skip(1)
        .filter(|r| !block_ends.contains(&r.end))
        .collect();
    assert!(!grown.is_empty(), "{w:?}");
    assert!(grown.iter().all(|r| r.len() <= 16), "{w:?}");
    assert!(w.iter().all(|r| r.end <= plen + 24));
    // No allowance on a linear table: nothing is free, no growth.
    let mut linear = flat_table(16, 100.0);
    linear.interpolation = Interpolation::Linear;
    let w = windows(linear, look);
    assert!(
        w.iter().skip(1).all(|r| block_ends.contains(&r.end)),
        "{w:?}"
    );
    // A zero memory budget stops lookahead too.
    let w = windows(
        flat_table(16, 100.0),
        MbsdParams {
            budget_mib: 0.0,
            ..look
        },
    );
    assert!(
        w.iter().skip(1).all(|r| block_ends.contains(&r.end)),
        "{w:?}"
    );
}

/// (mbsd's options live in `Strategy::Mbsd`: another strategy cannot carry them.)
/// Each forward's window after the first, and the commit frontier it started from (the first
/// undecided position after the previous step), in one generation on the synthetic model,
/// threshold 0.9, with one block as long as the generation unless `block` is given.
fn spans(mbsd: MbsdParams, block: Option<usize>) -> Vec<(Range<usize>, usize)> {
    let mut p = params(MBSD(MbsdParams::default()), Some(0.9), mbsd);
    p.block_length = block.unwrap_or(p.gen_length);
    let mask = synthetic().info().special.mask;
    let mut frontiers = Vec::new();
    let mut obs = |e: &StepEvent<'_>| {
        let f = (PROMPT.len()..e.canvas.len()).find(|&q| e.canvas[q] == mask);
        frontiers.push(f.unwrap_or(e.canvas.len()));
        Control::Continue
    };
    let g = Decoder::new(p)
        .run(&mut synthetic(), PROMPT, &mut obs)
        .unwrap();
    g.trace
        .iter()
        .skip(1)
        .zip(&frontiers)
        .map(|(t, &f)| (t.start..t.end, f))
        .collect()
}

#[test]
fn a_span_caps_the_window_past_the_frontier() {
    let free = MbsdParams {
        lookahead: false,
        sliding: Some(true),
        ..Default::default()
    };
    let w = spans(free, None);
    assert!(w.iter().any(|(r, f)| r.end > f + 4), "{w:?}");
    // Lookahead past blocks of 8 stays inside the span too.
    let ahead = MbsdParams {
        lookahead: true,
        trigger: 8,
        allowance: 10.0,
        ..free
    };
    let wide = spans(ahead, Some(8));
    assert!(wide.iter().any(|(r, f)| r.end > f + 4), "{wide:?}");
    for (m, block) in [(free, None), (ahead, Some(8))] {
        let w = spans(MbsdParams { span: Some(4), ..m }, block);
        assert!(w.len() > 1, "{w:?}");
        for (r, f) in &w {
            assert!(
                r.end <= f + 4 && r.end > *f,
                "window {r:?} from frontier {f}"
            );
        }
    }
    let e = generate(
        &mut synthetic(),
        PROMPT,
        &params(
            MBSD(MbsdParams::default()),
            Some(0.9),
            MbsdParams {
                span: Some(0),
                ..free
            },
        ),
        &mut (),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("mbsd.span"), "{e}");
}

#[test]
fn bad_mbsd_options_are_errors_naming_them() {
    let bad = MbsdParams {
        allowance: f64::NAN,
        ..Default::default()
    };
    let e = generate(
        &mut synthetic(),
        PROMPT,
        &params(MBSD(MbsdParams::default()), None, bad),
        &mut (),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("mbsd.allowance"), "{e}");
}
