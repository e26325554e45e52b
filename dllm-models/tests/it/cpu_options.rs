//! CPU options are held by each model, not by the process: two models built with different linear
//! layers and thread counts in one process each keep their own, built and run at the same time on
//! two threads; and configuring threads touches no environment variable.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use dllm_models::synthetic::{random_weights, tiny_llada};
use dllm_models::weights::HfWeights;
use dllm_models::{
    CpuLinears, CpuOptions, DiffusionLm, DiffusionTransformer, Error, OpMode, Rows,
    TransformerWeights,
};

fn build(cpu: CpuOptions) -> DiffusionTransformer {
    let cfg = tiny_llada();
    let w = random_weights(&cfg, 3).unwrap();
    let src = HfWeights::from_tensors(w, cfg.arch, DType::F32, &Device::Cpu);
    let w = TransformerWeights::new_with(cfg, &src, OpMode::Fused, &Default::default(), cpu);
    DiffusionTransformer::from_weights(Arc::new(w.unwrap())).unwrap()
}

fn logits(m: &mut DiffusionTransformer) -> Vec<u32> {
    let ids: Vec<u32> = (0..40u32).map(|i| (i * 37 + 5) % 200).collect();
    let c = Tensor::from_slice(&ids, (1, ids.len()), &Device::Cpu).unwrap();
    m.forward_full(&c, Rows::All)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .into_iter()
        .map(f32::to_bits)
        .collect()
}

const CANDLE_1: CpuOptions = CpuOptions {
    linears: CpuLinears::Candle,
    threads: Some(1),
    kv_dtype: None,
};
const PACKED_3: CpuOptions = CpuOptions {
    linears: CpuLinears::Packed,
    threads: Some(3),
    kv_dtype: None,
};

#[test]
fn two_models_with_different_options_do_not_affect_each_other() {
    // References, each built and run alone.
    let want_a = logits(&mut build(CANDLE_1));
    let want_b = logits(&mut build(PACKED_3));
    // The two implementations differ in summation order: the logits tell which one ran.
    assert_ne!(
        want_a, want_b,
        "candle's and the packed linears gave the same bits"
    );

    // Built at the same time on two threads, then run at the same time, interleaved.
    let (mut a, mut b) = std::thread::scope(|s| {
        let ha = s.spawn(|| build(CANDLE_1));
        let hb = s.spawn(|| build(PACKED_3));
        (ha.join().unwrap(), hb.join().unwrap())
    });
    assert_eq!(a.weights().cpu_options(), CANDLE_1);
    assert_eq!(b.weights().cpu_options(), PACKED_3);
    let (got_a, got_b) = std::thread::scope(|s| {
        let ha = s.spawn(|| (0..3).map(|_| logits(&mut a)).collect::<Vec<_>>());
        let hb = s.spawn(|| (0..3).map(|_| logits(&mut b)).collect::<Vec<_>>());
        (ha.join().unwrap(), hb.join().unwrap())
    });
    for (ga, gb) in got_a.iter().zip(&got_b) {
        assert!(*ga == want_a, "model A (candle linears) changed");
        assert!(*gb == want_b, "model B (packed linears) changed");
    }

    // Each runs in its own pool of its own size.
    let in_pool = |m: &DiffusionTransformer| {
        m.weights().install(|| {
            (
                rayon::current_num_threads(),
                std::thread::current().name().map(str::to_string),
            )
        })
    };
    let (na, name_a) = in_pool(&a);
    let (nb, name_b) = in_pool(&b);
    assert_eq!((na, nb), (1, 3));
    for name in [name_a, name_b] {
        assert!(
            name.as_deref().is_some_and(|n| n.starts_with("dllm-cpu-")),
            "{name:?}"
        );
    }
    // Without a pool of its own a model runs in the caller's current pool, on the caller's thread.
    let c = build(CpuOptions::default());
    let here = std::thread::current().id();
    assert_eq!(c.weights().install(|| std::thread::current().id()), here);

    // The thread count does not change a result (the kernels' order of operations is fixed).
    let mut b1 = build(CpuOptions {
        threads: Some(1),
        ..PACKED_3
    });
    assert!(logits(&mut b1) == want_b);
}

#[test]
fn a_bad_thread_count_is_an_error_naming_it() {
    for n in [0, dllm_models::threads::MAX_THREADS + 1] {
        let cfg = tiny_llada();
        let w = random_weights(&cfg, 3).unwrap();
        let src = HfWeights::from_tensors(w, cfg.arch, DType::F32, &Device::Cpu);
        let cpu = CpuOptions {
            threads: Some(n),
            ..Default::default()
        };
        match TransformerWeights::new_with(cfg, &src, OpMode::Fused, &Default::default(), cpu) {
            Err(e @ Error::Kernel(_)) => assert!(e.to_string().contains(&n.to_string()), "{e}"),
            other => panic!("expected an error for {n} threads, got {other:?}"),
        }
    }
}

#[test]
fn configuring_threads_sets_no_environment_variable() {
    let vars = ["RAYON_NUM_THREADS", "CANDLE_NUM_THREADS"];
    let before: Vec<_> = vars.iter().map(std::env::var_os).collect();
    // The global pool's current size: configuring it again is a no-op, not an error.
    let n = rayon::current_num_threads();
    dllm_models::threads::configure(n).unwrap();
    let after: Vec<_> = vars.iter().map(std::env::var_os).collect();
    assert_eq!(before, after);
    let _pool = dllm_models::threads::pool(2).unwrap();
    let again: Vec<_> = vars.iter().map(std::env::var_os).collect();
    assert_eq!(before, again);
}

#[test]
fn the_dual_path_runs_in_a_one_thread_pool() {
    // The refresh's thread and the forward's both queue their kernels in the model's single
    // thread: no deadlock, and the result is the sequential one.
    let ids: Vec<u32> = (0..40u32).map(|i| (i * 37 + 5) % 200).collect();
    let c = Tensor::from_slice(&ids, (1, ids.len()), &Device::Cpu).unwrap();
    let one = CpuOptions {
        threads: Some(1),
        ..Default::default()
    };
    let run = |dual: bool| {
        let mut m = build(one);
        m.forward(&c, 0..32, Rows::None).unwrap();
        m.commit(0..32).unwrap();
        let rows: Vec<usize> = (32..40).collect();
        let (l, r) = if dual {
            m.forward_with_refresh(
                &c,
                32..40,
                Rows::Positions(&rows),
                dllm_models::RefreshRequest {
                    positions: &[2, 9, 17],
                    logits: Some(&[9]),
                    score_masked: true,
                },
            )
            .unwrap()
        } else {
            let r = m
                .compute_refresh(&c, &[2, 9, 17], None)
                .map(|mut r| {
                    r.logits = Some(m.rescore(&c, &[9]).unwrap());
                    r
                })
                .unwrap();
            (m.forward(&c, 32..40, Rows::Positions(&rows)).unwrap(), r)
        };
        let bits = |t: &Tensor| -> Vec<u32> {
            let v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
            v.into_iter().map(f32::to_bits).collect()
        };
        (bits(&l), bits(r.logits.as_ref().unwrap()), bits(&r.keys[0]))
    };
    assert_eq!(run(true), run(false));
}

#[test]
fn load_options_threads_give_the_loaded_model_its_pool() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/tiny-llada");
    let src = dllm_models::ModelSource::parse(dir).unwrap();
    let opts = dllm_models::LoadOptions {
        threads: Some(2),
        cpu_linears: CpuLinears::Candle,
        ..Default::default()
    };
    let m = dllm_models::load(&src, &opts).unwrap().model;
    assert_eq!(
        m.weights().cpu_options(),
        CpuOptions {
            linears: CpuLinears::Candle,
            threads: Some(2),
            kv_dtype: None,
        }
    );
    assert_eq!(m.weights().install(rayon::current_num_threads), 2);
    // Its sequences share the weights, and with them the pool.
    let s = m.new_sequence().unwrap();
    assert_eq!(s.weights().install(rayon::current_num_threads), 2);
    let bad = dllm_models::LoadOptions {
        threads: Some(0),
        ..Default::default()
    };
    assert!(dllm_models::load(&src, &bad).is_err());
}

#[test]
fn the_kv_cache_dtype_is_the_models_option_and_a_bad_one_is_an_error() {
    let cfg = tiny_llada();
    let w = random_weights(&cfg, 5).unwrap();
    let build = |kv: Option<DType>| {
        let src = HfWeights::from_tensors(w.clone(), cfg.arch, DType::F32, &Device::Cpu);
        let cpu = CpuOptions {
            kv_dtype: kv,
            ..Default::default()
        };
        TransformerWeights::new_with(cfg.clone(), &src, OpMode::Fused, &Default::default(), cpu)
            .map(|w| DiffusionTransformer::from_weights(std::sync::Arc::new(w)).unwrap())
    };
    let ids: Vec<u32> = (0..24u32).map(|i| (i * 37 + 5) % 200).collect();
    let c = Tensor::from_slice(&ids, (1, ids.len()), &Device::Cpu).unwrap();
    // A cached prefix of 16 positions, then a window over the rest that reads it.
    let run = |m: &mut DiffusionTransformer| {
        m.forward(&c, 0..16, Rows::None).unwrap();
        m.commit(0..16).unwrap();
        let l = m.forward(&c, 16..24, Rows::All).unwrap();
        (
            l.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            m.cache_bytes(),
        )
    };
    let (f32_logits, f32_bytes) = run(&mut build(None).unwrap());
    for (dt, bytes_per) in [(DType::F16, 2), (DType::BF16, 2)] {
        let (l, bytes) = run(&mut build(Some(dt)).unwrap());
        // Half the bytes of the f32 cache, and logits that moved only by the rounding of K/V.
        assert_eq!(bytes * 4, f32_bytes * bytes_per, "{dt:?}");
        let worst = l
            .iter()
            .zip(&f32_logits)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let tol = if dt == DType::F16 { 1e-2 } else { 5e-2 };
        assert!(worst > 0.0 && worst < tol, "{dt:?}: {worst}");
    }
    // `Some(F32)` is the default's cache exactly.
    assert_eq!(
        run(&mut build(Some(DType::F32)).unwrap()),
        (f32_logits, f32_bytes)
    );
    match build(Some(DType::U8)) {
        Err(e @ Error::UnsupportedDtype { .. }) => {
            assert!(e.to_string().contains("KV cache"), "{e}")
        }
        other => panic!(
            "expected an error for a u8 cache, got {:?}",
            other.map(|_| ())
        ),
    }
}
