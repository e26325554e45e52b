//! candle-style construction (`llada::Config` from serde, `llada::new(&cfg, vb)`) builds the same
//! model as `load()` — same logits, same special tokens — and a bad config field is named.

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use dllm_models::synthetic::{random_weights, tiny_dream, tiny_llada, write_hf};
use dllm_models::{dream, llada, load, DiffusionLm, LoadOptions, ModelSource, Rows};

fn logits(m: &mut dyn DiffusionLm, len: usize) -> Vec<f32> {
    let ids: Vec<u32> = (0..len as u32).map(|i| (i * 7 + 3) % 50).collect();
    let canvas = Tensor::from_vec(ids, (1, len), &Device::Cpu).unwrap();
    m.forward(&canvas, 0..len, Rows::All)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

#[test]
fn new_from_var_builder_equals_load() {
    for (name, cfg) in [("llada", tiny_llada()), ("dream", tiny_dream())] {
        let dir = std::env::temp_dir().join(format!("candle-style-{name}-{}", std::process::id()));
        write_hf(
            &dir,
            &cfg,
            &random_weights(&cfg, 11).unwrap(),
            DType::F32,
            1,
        )
        .unwrap();
        let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
        let files = vec![dir.join("model.safetensors")];
        // SAFETY: the file is written above and not modified while mapped.
        let vb = unsafe { VarBuilder::from_mmaped_safetensors(&files, DType::F32, &Device::Cpu) }
            .unwrap();
        let mut built = match name {
            "llada" => llada::new(&serde_json::from_str::<llada::Config>(&text).unwrap(), vb),
            _ => dream::new(&serde_json::from_str::<dream::Config>(&text).unwrap(), vb),
        }
        .unwrap();
        let mut loaded = load(&ModelSource::Dir(dir.clone()), &LoadOptions::default()).unwrap();
        assert_eq!(built.info().special, loaded.model.info().special, "{name}");
        assert_eq!(
            logits(&mut built, 12),
            logits(&mut loaded.model, 12),
            "{name}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
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
}
