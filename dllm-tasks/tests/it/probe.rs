//! The long-math skill probe scores the positions it claims to: checked with scripted models
//! (an oracle that always answers the reference token, and one that always answers `2`) whose
//! expected scores are derived here from the reference texts, independently of the probe.

use std::ops::Range;

use candle_core::{Device, Tensor};
use dllm_models::lm::{ModelId, ModelInfo, Refresh, SequenceToken};
use dllm_models::{load, DiffusionLm, LoadOptions, ModelSource, Rows};
use dllm_tasks::eval::questions;
use dllm_tasks::probe::probe_long_math;
use dllm_tasks::tokenizer::build_long_suite_tokenizer;
use dllm_tasks::{encode_prompt, encode_response, TaskKind, EOS_ID};

const GEN: usize = 128;

/// Answers every requested position with `answer(canvas, position)` (logit 10, else 0); the
/// shipped long model only lends its `ModelInfo`.
struct Scripted<F: FnMut(&[u32], usize) -> u32 + Send> {
    info: ModelInfo,
    token: SequenceToken,
    answer: F,
}

impl<F: FnMut(&[u32], usize) -> u32 + Send> DiffusionLm for Scripted<F> {
    fn info(&self) -> &ModelInfo {
        &self.info
    }
    fn device(&self) -> &Device {
        &Device::Cpu
    }
    fn forward(
        &mut self,
        c: &Tensor,
        w: Range<usize>,
        rows: Rows<'_>,
    ) -> dllm_models::Result<Tensor> {
        let canvas = c.get(0)?.to_vec1::<u32>()?;
        let pos: Vec<usize> = match rows {
            Rows::Positions(p) => p.to_vec(),
            Rows::All => w.collect(),
            Rows::None => vec![],
        };
        let v = self.info.vocab_size;
        let mut out = vec![0f32; pos.len() * v];
        for (i, &p) in pos.iter().enumerate() {
            out[i * v + (self.answer)(&canvas, p) as usize] = 10.0;
        }
        Ok(Tensor::from_vec(out, (1, pos.len(), v), &Device::Cpu)?)
    }
    fn commit(&mut self, _: Range<usize>) -> dllm_models::Result<()> {
        Ok(())
    }
    fn cache_len(&self) -> usize {
        0
    }
    fn truncate_cache(&mut self, _: usize) -> dllm_models::Result<()> {
        Ok(())
    }
    fn token(&self) -> SequenceToken {
        self.token
    }
    fn compute_refresh(
        &self,
        _: &Tensor,
        _: &[usize],
        _: Option<&[usize]>,
    ) -> dllm_models::Result<Refresh> {
        unreachable!("the probe never refreshes")
    }
    fn apply_refresh(&mut self, _: &Refresh) -> dllm_models::Result<()> {
        unreachable!("the probe never refreshes")
    }
}

fn info() -> ModelInfo {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/tiny-llada-long");
    let m = load(&ModelSource::parse(dir).unwrap(), &LoadOptions::default()).unwrap();
    m.model.info().clone()
}

/// `(first operand, operator, operand, result)` of every worked line, from the text.
fn lines(response: &str) -> Vec<(char, char, char, char)> {
    response
        .lines()
        .filter_map(|l| l.split_once(": ").map(|(_, rhs)| rhs))
        .filter(|rhs| rhs.contains('='))
        .map(|rhs| {
            let c: Vec<char> = rhs.chars().collect();
            (c[0], c[1], c[2], c[4])
        })
        .collect()
}

#[test]
fn the_probe_scores_copy_lookup_and_arithmetic_where_it_says() {
    let tok = build_long_suite_tokenizer().unwrap();
    let qs = questions(&[TaskKind::LongMath], Some(6));
    let all: Vec<_> = qs.iter().map(|q| lines(&q.response)).collect();
    let n_lines: usize = all.iter().map(Vec::len).sum();
    assert!(n_lines >= 6 * 8, "8-12 lines per problem: {n_lines}");

    // The oracle knows every reference canvas: all three skills are perfect.
    let refs: Vec<Vec<u32>> = qs
        .iter()
        .map(|q| {
            let mut r = encode_response(&tok, &q.response).unwrap();
            r.resize(GEN, EOS_ID);
            encode_prompt(&tok, &q.prompt)
                .unwrap()
                .into_iter()
                .chain(r)
                .collect()
        })
        .collect();
    let mut oracle = Scripted {
        token: SequenceToken::new_sequence(ModelId::fresh()),
        info: info(),
        answer: |c: &[u32], p: usize| {
            let r = refs
                .iter()
                .find(|r| r.len() == c.len() && r[..20] == c[..20])
                .unwrap();
            r[p]
        },
    };
    let s = probe_long_math(&mut oracle, &tok, &qs, GEN).unwrap();
    assert_eq!(
        (s.copy.right, s.copy.total),
        (n_lines - qs.len(), n_lines - qs.len())
    );
    assert_eq!((s.lookup.right, s.lookup.total), (n_lines, n_lines));
    assert_eq!((s.arithmetic.right, s.arithmetic.total), (n_lines, n_lines));

    // Always `2`: right exactly where the reference token is `2`, and never for a lookup (an
    // operator is never `2`).
    let two = tok.token_to_id("2").unwrap();
    let mut twos = Scripted {
        token: SequenceToken::new_sequence(ModelId::fresh()),
        info: info(),
        answer: |_: &[u32], _: usize| two,
    };
    let s = probe_long_math(&mut twos, &tok, &qs, GEN).unwrap();
    let copy_twos: usize = all
        .iter()
        .map(|l| l[1..].iter().filter(|x| x.0 == '2').count())
        .sum();
    let result_twos: usize = all.iter().flatten().filter(|x| x.3 == '2').count();
    assert_eq!(s.copy.right, copy_twos);
    assert_eq!(s.arithmetic.right, result_twos);
    assert_eq!(s.lookup.right, 0);
    assert!(
        result_twos > 0 && result_twos < n_lines,
        "{result_twos} of {n_lines}"
    );

    // Other tasks are refused by name.
    let other = questions(&[TaskKind::LongYesNo], Some(1));
    let e = probe_long_math(&mut twos, &tok, &other, GEN).unwrap_err();
    assert!(e.to_string().contains("long-math"), "{e}");
}
