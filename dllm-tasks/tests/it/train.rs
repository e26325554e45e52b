//! Training pieces: one optimizer step lowers the SFT loss on a fixed batch (same masks), the
//! objective only scores response positions, and a trainable model's weights load into the
//! inference model unchanged.

use candle_core::Device;
use candle_nn::VarMap;
use dllm_models::lm::Arch;
use dllm_models::{DiffusionLm, Rows};
use dllm_tasks::rng::Rng;
use dllm_tasks::tokenizer::{build_suite_tokenizer, MASK_ID};
use dllm_tasks::train::{
    inference_copy, init_varmap, named_vars, sft_loss, suite_config, trainable, AdamW, AdamWConfig,
    Batcher, ModelShape,
};
use dllm_tasks::train_stream;

fn setup(
    arch: Arch,
) -> (
    VarMap,
    dllm_models::TransformerConfig,
    dllm_tasks::train::Batch,
) {
    let tok = build_suite_tokenizer().unwrap();
    let shape = ModelShape {
        arch,
        hidden: 32,
        layers: 2,
        heads: 4,
        kv_heads: if arch == Arch::Dream { 2 } else { 4 },
        ffn: 64,
    };
    let cfg = suite_config(shape, tok.get_vocab_size(true)).unwrap();
    let varmap = VarMap::new();
    init_varmap(&varmap, &cfg, 3).unwrap();
    let batch = Batcher::new(train_stream(9), 8, 20)
        .next_batch(&tok)
        .unwrap();
    (varmap, cfg, batch)
}

#[test]
fn one_step_reduces_the_loss_on_a_fixed_batch() {
    for arch in [Arch::Llada, Arch::Dream] {
        let (varmap, cfg, batch) = setup(arch);
        let model = trainable(&varmap, &cfg).unwrap();
        let lens = vec![batch.prompt_len; batch.rows.len()];
        let loss_at = |seed| {
            let mut rng = Rng::new(seed);
            sft_loss(&model, &batch.rows, &lens, MASK_ID, &mut rng, &Device::Cpu).unwrap()
        };
        let before = loss_at(5);
        assert!(before.masked > 0);
        let l0 = before.loss.to_scalar::<f32>().unwrap();
        let mut opt = AdamW::new(named_vars(&varmap).unwrap(), AdamWConfig::default()).unwrap();
        let grads = before.loss.backward().unwrap();
        let norm = opt.step(&grads, 1e-2).unwrap();
        assert!(norm > 0.0 && norm.is_finite());
        let l1 = loss_at(5).loss.to_scalar::<f32>().unwrap();
        assert!(l1 < l0, "{arch}: loss {l0} -> {l1} after one step");
    }
}

#[test]
fn the_loss_ignores_prompt_positions() {
    let (varmap, cfg, batch) = setup(Arch::Llada);
    let model = trainable(&varmap, &cfg).unwrap();
    // Prompt length = whole row: nothing can be masked, so the loss is exactly zero.
    let lens = vec![batch.rows[0].len(); batch.rows.len()];
    let out = sft_loss(
        &model,
        &batch.rows,
        &lens,
        MASK_ID,
        &mut Rng::new(1),
        &Device::Cpu,
    )
    .unwrap();
    assert_eq!(out.masked, 0);
    assert_eq!(out.loss.to_scalar::<f32>().unwrap(), 0.0);
    let bad = sft_loss(
        &model,
        &[vec![1, 2], vec![1]],
        &[1, 1],
        MASK_ID,
        &mut Rng::new(1),
        &Device::Cpu,
    );
    assert!(bad.is_err(), "ragged batches are rejected");
}

#[test]
fn trainable_and_inference_models_agree() {
    let (varmap, cfg, batch) = setup(Arch::Dream);
    let train_model = trainable(&varmap, &cfg).unwrap();
    let mut infer = inference_copy(&varmap, &cfg).unwrap();
    let ids = candle_core::Tensor::from_vec(
        batch.rows[0].clone(),
        (1, batch.rows[0].len()),
        &Device::Cpu,
    )
    .unwrap();
    let a = train_model.forward_train(&ids).unwrap();
    let b = infer.forward_full(&ids, Rows::All).unwrap();
    let d: f32 = (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar()
        .unwrap();
    assert!(d < 1e-4, "differentiable vs fused forward differ by {d}");
}

#[test]
fn task_weights_shift_the_mix_and_uniform_weights_change_nothing() {
    use dllm_tasks::TaskKind;
    let uniform: Vec<String> = train_stream(4).take(200).map(|e| e.prompt).collect();
    let same: Vec<String> = train_stream(4)
        .with_weights([1; 4])
        .unwrap()
        .take(200)
        .map(|e| e.prompt)
        .collect();
    assert_eq!(uniform, same);
    let n = 20_000;
    let yes = train_stream(4)
        .with_weights([1, 2, 1, 1])
        .unwrap()
        .take(n)
        .filter(|e| e.kind == TaskKind::YesNo)
        .count() as f64
        / n as f64;
    assert!((yes - 0.4).abs() < 0.02, "yes/no share {yes}");
    assert!(train_stream(4).with_weights([0; 4]).is_err());
}

/// Warm start: a short-suite checkpoint initialises a long-suite model (whose vocabulary extends
/// the short one) row for row; other shapes and foreign vocabularies are named errors.
#[test]
fn warm_start_extends_the_vocabulary_and_refuses_mismatches() {
    use candle_core::{DType, IndexOp};
    use dllm_tasks::tokenizer::{build_long_suite_tokenizer, save};
    use dllm_tasks::train::init_from;

    let short = build_suite_tokenizer().unwrap();
    let long = build_long_suite_tokenizer().unwrap();
    let shape = |hidden| ModelShape {
        arch: Arch::Llada,
        hidden,
        layers: 1,
        heads: 2,
        kv_heads: 2,
        ffn: 64,
    };
    let dir = std::env::temp_dir().join(format!("dllm-warm-{}", std::process::id()));
    let src_cfg = suite_config(shape(32), short.get_vocab_size(true)).unwrap();
    let src = dllm_models::synthetic::random_weights(&src_cfg, 11).unwrap();
    dllm_models::synthetic::write_hf(&dir, &src_cfg, &src, DType::F32, 1).unwrap();
    save(&short, dir.join("tokenizer.json")).unwrap();

    let cfg = suite_config(shape(32), long.get_vocab_size(true)).unwrap();
    let varmap = VarMap::new();
    init_varmap(&varmap, &cfg, 1).unwrap();
    let w = init_from(&varmap, &dir, &long).unwrap();
    assert_eq!(
        (w.extended, w.old_vocab, w.moved),
        (2, short.get_vocab_size(true), 0)
    );
    assert_eq!(w.copied + w.extended, src.len());
    let data = varmap.data().lock().unwrap();
    let emb = data["model.transformer.wte.weight"].as_tensor();
    assert_eq!(emb.dims(), [long.get_vocab_size(true), 32]);
    let diff = (emb.i(..w.old_vocab).unwrap() - &src["model.transformer.wte.weight"])
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert_eq!(diff, 0.0);
    drop(data);

    // Another width: the error names a tensor and both shapes.
    let wide = suite_config(shape(64), long.get_vocab_size(true)).unwrap();
    let vm = VarMap::new();
    init_varmap(&vm, &wide, 1).unwrap();
    let err = init_from(&vm, &dir, &long).unwrap_err().to_string();
    assert!(err.contains("has shape") && err.contains("needs"), "{err}");
    // A vocabulary that does not extend the checkpoint's.
    let err = init_from(
        &varmap,
        &dir,
        &dllm_tasks::tokenizer::train_tokenizer(300, ["a b c".to_string()].into_iter()).unwrap(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("must extend"), "{err}");

    // The same tokens under other ids (two swapped): rows follow their tokens.
    let mut json: serde_json::Value =
        serde_json::from_str(&dllm_tasks::tokenizer::to_json(&short).unwrap()).unwrap();
    let vocab = json["model"]["vocab"].as_object_mut().unwrap();
    let (a, b) = ("Ġapple", "Ġred");
    let (ia, ib) = (vocab[a].as_u64().unwrap(), vocab[b].as_u64().unwrap());
    vocab.insert(a.into(), ib.into());
    vocab.insert(b.into(), ia.into());
    let swapped: tokenizers::Tokenizer = json.to_string().parse().unwrap();
    let vm = VarMap::new();
    init_varmap(&vm, &src_cfg, 1).unwrap();
    let w = init_from(&vm, &dir, &swapped).unwrap();
    assert_eq!((w.moved, w.extended), (2, 2));
    let data = vm.data().lock().unwrap();
    for name in [
        "model.transformer.wte.weight",
        "model.transformer.ff_out.weight",
    ] {
        let got = data[name].as_tensor();
        let want = &src[name];
        let row =
            |t: &candle_core::Tensor, i: u64| t.i(i as usize).unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(row(got, ib), row(want, ia), "{name}");
        assert_eq!(row(got, ia), row(want, ib), "{name}");
        assert_eq!(row(got, 7), row(want, 7), "{name}");
    }
    drop(data);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn block_masking_leaves_earlier_blocks_clean_and_later_positions_masked() {
    use dllm_tasks::train::{mask_row, BlockMasking};
    let (t_len, pl, bl) = (10 + 4 * 8, 10, 8);
    let block = Some(BlockMasking {
        fraction: 1.0,
        block_length: bl,
    });
    let mut rng = Rng::new(3);
    let mut seen_block = [0usize; 4];
    for _ in 0..400 {
        let m = mask_row(t_len, pl, &mut rng, block);
        assert!(m[..pl].iter().all(Option::is_none), "prompt never masked");
        // The current block is the first with a masked position; every earlier response
        // position is clean and everything after the block is masked with probability 1.
        let first = (pl..t_len).find(|&j| m[j].is_some()).unwrap_or(t_len);
        let k = (first - pl) / bl;
        let hi = (pl + (k + 1) * bl).min(t_len);
        assert!(m[hi..].iter().all(|x| *x == Some(1.0)), "{m:?}");
        let p = m[first..hi].iter().flatten().next().copied();
        assert!(m[first..hi].iter().all(|x| x.is_none() || *x == p), "{m:?}");
        if first < t_len {
            seen_block[k] += 1;
        }
    }
    assert!(seen_block.iter().all(|&n| n > 50), "{seen_block:?}");
    // Without block rows every response position is masked with one ratio.
    let mut rng = Rng::new(4);
    for _ in 0..100 {
        let m = mask_row(t_len, pl, &mut rng, None);
        let ps: Vec<f64> = m.iter().flatten().copied().collect();
        assert!(ps.windows(2).all(|w| w[0] == w[1]) && ps.iter().all(|&p| p < 1.0));
    }
}
