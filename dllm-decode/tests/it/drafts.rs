//! Multi-block drafts: judged on the confidence of the forward that makes their block current,
//! and, under staged decisions, entered as Visible (tentative), never final at once.

use std::ops::Range;

use candle_core::{Device, Tensor};
use dllm_decode::states::TokenState;
use dllm_decode::{Control, Decide, DecodeParams, MbsdParams, Staged, StepEvent, Strategy};
use dllm_models::{DiffusionLm, ModelId, ModelInfo, Refresh, Rows, SequenceToken};

use crate::scripted::{info, row, MASK, PROMPT};

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
    /// Draft rule instead of the fixed script: positions beyond the current block are predicted at
    /// 0.95 by forwards 2, 6, 10, ... and 0.5 by the others, except the last block's, always at 0.95
    /// (current-block positions: 0.95 when even, 0.5 when odd); every (forward, position,
    /// confidence) of such a draft row is logged.
    fickle: Option<Vec<(usize, usize, f64)>>,
    forwards: usize,
    requested: Vec<(Vec<u32>, Vec<usize>)>,
}

impl Scripted {
    fn new() -> Self {
        let info = info();
        Self {
            info,
            device: Device::Cpu,
            cache_len: 0,
            id: SequenceToken::new_sequence(ModelId::fresh()),
            epoch: 0,
            pending: None,
            log: vec![],
            fickle: None,
            forwards: 0,
            requested: vec![],
        }
    }

    fn logits(&self, rows: &[Vec<f32>]) -> Tensor {
        crate::scripted::logits(rows)
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
    fn compute_refresh(
        &self,
        _: &Tensor,
        _: &[usize],
        _: Option<&[usize]>,
    ) -> dllm_models::Result<Refresh> {
        Err(dllm_models::Error::Internal {
            what: "the decoder asked for a CPU refresh",
        })
    }
    fn apply_refresh(&mut self, _: &Refresh) -> dllm_models::Result<()> {
        Err(dllm_models::Error::Internal {
            what: "the decoder merged a CPU refresh",
        })
    }
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
        gen_length: 24,
        block_length: 8,
        steps: 24,
        strategy: Strategy::Mbsd(MbsdParams {
            lookahead: true,
            ..MbsdParams::default()
        }),
        early_stop: false,
        ..Default::default()
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

#[test]
fn accepted_drafts_enter_visible_never_final_at_once() {
    let p = DecodeParams {
        gen_length: 24,
        block_length: 8,
        steps: 24,
        strategy: Strategy::Mbsd(MbsdParams {
            lookahead: true,
            ..MbsdParams::default()
        }),
        decide: Decide::Staged(Staged {
            visible: 0.9,
            stable: 0.9,
            no_adjacent: false,
            wait_left: 0,
            near_wait: None,
            verify: None,
        }),
        early_stop: false,
        ..Default::default()
    };
    let mut m = Scripted::new();
    m.fickle = Some(Vec::new());
    let mut stable_drafts = 0;
    let mut drafts_seen = 0;
    let mut obs = |e: &StepEvent<'_>| {
        for (&pos, &c) in e.unmasked.iter().zip(e.confidences) {
            // A draft is reported in the step that made its block current: outside that step's
            // block.
            let block = (pos - PROMPT.len()) / 8;
            if block != e.block {
                drafts_seen += 1;
                assert!(c >= 0.9);
                stable_drafts += usize::from(e.states[pos] == TokenState::Stable);
            }
        }
        Control::Continue
    };
    let g = dllm_decode::generate(&mut m, PROMPT, &p, &mut obs).unwrap();
    assert!(
        g.drafts_accepted > 0 && drafts_seen == g.drafts_accepted,
        "{g:?}"
    );
    assert_eq!(g.drafts_taken.len(), g.drafts_accepted);
    assert_eq!(stable_drafts, 0, "a draft at 0.95 became final at once");
}
