//! candle-style construction (`llada::Config` from serde, `llada::Model::new(&cfg, vb)`) builds the
//! same model as `load()` — same logits, same special tokens — its `forward(&ids)` / `Module`
//! forward is the plain full-canvas forward, a bad config field is named, and a checkpoint that
//! does not match the config is an error naming the tensor (and the file, through
//! `safetensors_var_builder`).

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::VarBuilder;
use dllm_models::synthetic::{random_weights, tiny_dream, tiny_llada, write_hf};
use dllm_models::{
    dream, llada, load, safetensors_var_builder, DiffusionLm, LoadOptions, ModelSource, Rows,
};

fn canvas(len: usize) -> Tensor {
    let ids: Vec<u32> = (0..len as u32).map(|i| (i * 7 + 3) % 50).collect();
    Tensor::from_vec(ids, (1, len), &Device::Cpu).unwrap()
}

fn flat(t: Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

fn logits(m: &mut dyn DiffusionLm, len: usize) -> Vec<f32> {
    flat(m.forward(&canvas(len), 0..len, Rows::All).unwrap())
}

/// A random checkpoint of `cfg` in a fresh directory.
fn checkpoint(name: &str, cfg: &dllm_models::TransformerConfig) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("candle-style-{name}-{}", std::process::id()));
    write_hf(&dir, cfg, &random_weights(cfg, 11).unwrap(), DType::F32, 1).unwrap();
    dir
}

fn var_builder(dir: &Path) -> VarBuilder<'static> {
    let files = [dir.join("model.safetensors")];
    // SAFETY: the file is written by the test and not modified while mapped.
    unsafe { VarBuilder::from_mmaped_safetensors(&files, DType::F32, &Device::Cpu) }.unwrap()
}

fn llada_config(dir: &Path) -> llada::Config {
    serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap()
}

#[test]
fn new_from_var_builder_equals_load() {
    for (name, cfg) in [("llada", tiny_llada()), ("dream", tiny_dream())] {
        let dir = checkpoint(name, &cfg);
        let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
        let vb = var_builder(&dir);
        let mut loaded = load(&ModelSource::Dir(dir.clone()), &LoadOptions::default()).unwrap();
        let want = logits(&mut loaded.model, 12);
        // Both models, through every way of calling them: the windowed trait forward, the
        // inherent full-canvas forward and candle's `Module`.
        let (mut built, full, module): (Box<dyn DiffusionLm>, Vec<f32>, Vec<f32>) = match name {
            "llada" => {
                let cfg: llada::Config = serde_json::from_str(&text).unwrap();
                assert_eq!(cfg.n_layers, loaded.model.info().num_layers);
                let m = llada::Model::new(&cfg, vb).unwrap();
                let full = flat(m.forward(&canvas(12)).unwrap());
                let module = flat(Module::forward(&m, &canvas(12)).unwrap());
                (Box::new(m), full, module)
            }
            _ => {
                let cfg: dream::Config = serde_json::from_str(&text).unwrap();
                assert_eq!(cfg.num_hidden_layers, loaded.model.info().num_layers);
                let m = dream::Model::new(&cfg, vb).unwrap();
                let full = flat(m.forward(&canvas(12)).unwrap());
                let module = flat(Module::forward(&m, &canvas(12)).unwrap());
                (Box::new(m), full, module)
            }
        };
        assert_eq!(built.info().special, loaded.model.info().special, "{name}");
        assert_eq!(logits(built.as_mut(), 12), want, "{name}");
        assert_eq!(full, want, "{name}: the inherent forward");
        assert_eq!(module, want, "{name}: Module::forward");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn the_full_forward_leaves_the_cache_alone() {
    let dir = checkpoint("cache", &tiny_llada());
    let mut m = llada::Model::new(&llada_config(&dir), var_builder(&dir)).unwrap();
    DiffusionLm::forward(&mut m, &canvas(8), 0..8, Rows::None).unwrap();
    m.commit(0..8).unwrap();
    let epoch = m.epoch();
    let a = flat(m.forward(&canvas(6)).unwrap());
    assert_eq!((m.cache_len(), m.epoch()), (8, epoch));
    // The same as a model with an empty cache.
    let fresh = llada::Model::new(&llada_config(&dir), var_builder(&dir)).unwrap();
    assert_eq!(a, flat(fresh.forward(&canvas(6)).unwrap()));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_refresh_from_another_model_is_rejected() {
    // Two `llada::Model`s of one checkpoint are two models: a refresh of one does not merge into
    // the other, and the other's cache is left as it was.
    let dir = checkpoint("token", &tiny_llada());
    let mut a = llada::Model::new(&llada_config(&dir), var_builder(&dir)).unwrap();
    let mut b = llada::Model::new(&llada_config(&dir), var_builder(&dir)).unwrap();
    for m in [&mut a, &mut b] {
        DiffusionLm::forward(m, &canvas(8), 0..8, Rows::None).unwrap();
        m.commit(0..8).unwrap();
    }
    assert_eq!(a.epoch(), b.epoch());
    let r = a.compute_refresh(&canvas(8), &[2, 5], None).unwrap();
    assert_eq!(r.token, DiffusionLm::token(&a));
    let before = flat(DiffusionLm::forward(&mut b, &canvas(10), 8..10, Rows::All).unwrap());
    let snapshot = b.cache_snapshot().unwrap();
    match b.apply_refresh(&r) {
        Err(dllm_models::Error::RefreshFromOtherModel { computed, current }) => {
            assert_eq!(computed, a.weights().id());
            assert_eq!(current, b.weights().id());
        }
        other => panic!("expected RefreshFromOtherModel, got {other:?}"),
    }
    let after = flat(DiffusionLm::forward(&mut b, &canvas(10), 8..10, Rows::All).unwrap());
    assert_eq!(before, after);
    for ((k0, v0), (k1, v1)) in snapshot.iter().zip(&b.cache_snapshot().unwrap()) {
        assert_eq!(flat(k0.clone()), flat(k1.clone()));
        assert_eq!(flat(v0.clone()), flat(v1.clone()));
    }
    a.apply_refresh(&r).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_field_is_named() {
    let mut v = dllm_models::llada::config_to_json(&tiny_llada());
    v["n_layers"] = serde_json::json!("four");
    let e = serde_json::from_value::<llada::Config>(v)
        .unwrap_err()
        .to_string();
    assert!(e.contains("n_layers"), "{e}");
    let e = serde_json::from_str::<dream::Config>("[1, 2]")
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a JSON object"), "{e}");
    // A field edited after parsing is checked when the model is built.
    let dir = checkpoint("edited", &tiny_llada());
    let mut cfg = llada_config(&dir);
    cfg.n_kv_heads = 3;
    let e = llada::Model::new(&cfg, var_builder(&dir))
        .unwrap_err()
        .to_string();
    assert!(e.contains("n_kv_heads"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_checkpoint_that_does_not_match_is_named() {
    let dir = checkpoint("mismatch", &tiny_llada());
    let base = llada_config(&dir);
    let err = |cfg: &llada::Config| {
        llada::Model::new(cfg, var_builder(&dir))
            .unwrap_err()
            .to_string()
    };
    // A wider MLP than the checkpoint's: the tensor and both shapes.
    let mut cfg = base.clone();
    cfg.mlp_hidden_size += 8;
    let e = err(&cfg);
    assert!(
        e.contains("model.transformer.blocks.0.ff_proj.weight")
            && e.contains(&format!("{}", base.mlp_hidden_size)),
        "{e}"
    );
    // Fewer and more layers than the checkpoint holds.
    for n in [base.n_layers - 1, base.n_layers + 1] {
        let mut cfg = base.clone();
        cfg.n_layers = n;
        let e = err(&cfg);
        assert!(
            e.contains("n_layers") && e.contains(&format!("holds {}", base.n_layers)),
            "{e}"
        );
    }
    // An untied head under a tied config.
    let mut cfg = base.clone();
    cfg.weight_tying = true;
    let e = err(&cfg);
    assert!(
        e.contains("model.transformer.ff_out.weight") && e.contains("weight_tying"),
        "{e}"
    );
    // Dream's config over LLaDA's tensors: no block of Dream's spelling.
    let dream_cfg: dream::Config =
        serde_json::from_value(dllm_models::dream::config_to_json(&tiny_dream())).unwrap();
    let e = dream::Model::new(&dream_cfg, var_builder(&dir))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("num_hidden_layers") && e.contains("holds 0"),
        "{e}"
    );

    // Through safetensors_var_builder the message names the file too.
    let file = dir.join("model.safetensors");
    let mut cfg = base.clone();
    cfg.mlp_hidden_size += 8;
    // SAFETY: the file is written by the test and not modified while mapped.
    let vb = unsafe { safetensors_var_builder(&[&file], DType::F32, &Device::Cpu) }.unwrap();
    let e = llada::Model::new(&cfg, vb).unwrap_err().to_string();
    assert!(
        e.contains(&file.display().to_string())
            && e.contains("model.transformer.blocks.0.ff_proj.weight"),
        "{e}"
    );
    // SAFETY: as above.
    let vb = unsafe { safetensors_var_builder(&[&file], DType::F32, &Device::Cpu) }.unwrap();
    assert!(llada::Model::new(&base, vb).is_ok());
    let _ = std::fs::remove_dir_all(&dir);
}
