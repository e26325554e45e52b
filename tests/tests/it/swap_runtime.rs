//! The NPU memory runtime end to end: a LLaDA whose fp16 weights (~4 MiB) do not fit a 3 MiB
//! NPU window generates at temperature 0 under `somr` with the same tokens as the CPU and as the
//! same model in a window that holds everything, while `naive` (every weight mapped when first
//! used, kept mapped) is refused at load, before any weight is read, with the numbers.

use candle_core::{DType, Device};
use candle_hexagon::{HexagonConfig, HexagonDevice, MemoryPolicy};
use dllm_decode::{generate, DecodeParams, Strategy};
use dllm_models::synthetic::{random_weights, tiny_llada};
use dllm_models::weights::HfWeights;
use dllm_models::{Backend, DiffusionTransformer, OpMode, TransformerConfig};

const MIB: u64 = 1 << 20;

/// 3 layers of d 256 (MLP 512) and a vocabulary of 512: 4.0 MiB of fp16 weights on the NPU.
fn config() -> TransformerConfig {
    let mut c = tiny_llada();
    c.hidden_size = 256;
    c.num_layers = 3;
    c.intermediate_size = 512;
    c.vocab_size = 512;
    c.special.mask = 511;
    c.special.eos = 510;
    c.special.bos = Some(509);
    c.special.pad = Some(510);
    c.max_seq_len = 256;
    c
}

fn model(cfg: &TransformerConfig, backend: &Backend) -> DiffusionTransformer {
    let w = random_weights(cfg, 5).unwrap();
    DiffusionTransformer::new_on(
        cfg.clone(),
        &HfWeights::from_tensors(w, cfg.arch, DType::F32, &Device::Cpu),
        OpMode::Fused,
        backend,
    )
    .unwrap()
}

fn hexagon(policy: MemoryPolicy, window: u64) -> HexagonDevice {
    HexagonDevice::open(HexagonConfig {
        memory_policy: policy,
        va_window_bytes: window,
        ..Default::default()
    })
    .unwrap()
}

#[test]
fn somr_generates_the_cpu_tokens_in_a_window_smaller_than_the_model() {
    let cfg = config();
    let prompt = [17u32, 42, 99, 3, 250, 7];
    for strategy in [Strategy::DualCache, Strategy::PrefixCache] {
        let p = DecodeParams {
            gen_length: 64,
            block_length: 16,
            steps: 32,
            strategy,
            early_stop: false,
            ..Default::default()
        };
        let cpu = generate(&mut model(&cfg, &Backend::Cpu), &prompt, &p, &mut ()).unwrap();

        let dev = hexagon(MemoryPolicy::Naive, 3 * MIB);
        let w = random_weights(&cfg, 5).unwrap();
        let naive = DiffusionTransformer::new_on(
            cfg.clone(),
            &HfWeights::from_tensors(w, cfg.arch, DType::F32, &Device::Cpu),
            OpMode::Fused,
            &Backend::Hexagon(dev.clone()),
        );
        match naive {
            Err(dllm_models::Error::Hexagon(e @ candle_hexagon::Error::WontFit { .. })) => {
                let candle_hexagon::Error::WontFit { need, window, .. } = &e else {
                    unreachable!()
                };
                assert!(*need > 4 * MIB && *window == 3 * MIB, "{e}");
                assert!(e.to_string().contains("`naive` memory policy"), "{e}");
            }
            r => panic!(
                "naive in a 3 MiB window: {:?}",
                r.map(|m| m.runs_blocks_on_npu())
            ),
        }
        assert_eq!(dev.memory_stats().va.maps, 0, "nothing was mapped");

        let roomy = hexagon(MemoryPolicy::Somr, 256 * MIB);
        let all = generate(
            &mut model(&cfg, &Backend::Hexagon(roomy)),
            &prompt,
            &p,
            &mut (),
        )
        .unwrap();
        let dev = hexagon(MemoryPolicy::Somr, 3 * MIB);
        let mut m = model(&cfg, &Backend::Hexagon(dev.clone()));
        let tight = generate(&mut m, &prompt, &p, &mut ()).unwrap();
        let plan = dev.last_memory_plan().expect("somr planned");
        eprintln!("{strategy:?}\n{plan}\n{}", dev.routing_report());
        assert!(
            plan.streamed() > 0,
            "the weights do not fit: some are streamed"
        );
        let c = dev.counters();
        assert!(
            c.bytes_streamed > 0 && c.forwards as usize == tight.forwards,
            "{c:?}"
        );
        assert_eq!(
            tight.generated(),
            all.generated(),
            "{strategy:?}: streaming changes nothing"
        );
        assert_eq!(
            tight.generated(),
            cpu.generated(),
            "{strategy:?}: the CPU's tokens"
        );
        assert_eq!(tight.tokens_decoded, 64);
    }
}
