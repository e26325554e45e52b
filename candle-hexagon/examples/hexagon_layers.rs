//! Put a small candle model's layers on the (emulated) Hexagon device with `candle_hexagon::nn`
//! — the candle-nn builders with the device as the last argument — and print the routing report.
//!
//! `cargo run --release -p candle-hexagon --example hexagon_layers`
use candle_core::{DType, Device, Module, Tensor};
use candle_hexagon::nn::{self, AttnOptions};
use candle_hexagon::HexagonDevice;
use candle_nn::{VarBuilder, VarMap};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dev = HexagonDevice::emulated()?;
    // A VarMap-backed builder initialises the weights the way candle-nn does; a checkpoint's
    // `VarBuilder::from_mmaped_safetensors` works the same way.
    let vars = VarMap::new();
    let vb = VarBuilder::from_varmap(&vars, DType::F32, &Device::Cpu);
    let (hidden, heads, hd, seq) = (64, 4, 16, 10);
    let norm = nn::rms_norm(hidden, 1e-5, vb.pp("norm"), &dev)?;
    let qkv = nn::linear_no_bias(hidden, 3 * heads * hd, vb.pp("qkv"), &dev)?;
    let out = nn::linear(heads * hd, hidden, vb.pp("out"), &dev)?;
    let mlp = nn::linear(hidden, hidden, vb.pp("mlp"), &dev)?;

    let x = Tensor::randn(0f32, 1.0, (1, seq, hidden), &Device::Cpu)?;
    // (b, s, 3, h, d): q, k and v are already in the op's (b, s, h, d) layout, no transpose.
    let qkv_x = qkv
        .forward(&norm.forward(&x)?)?
        .reshape((1, seq, 3, heads, hd))?;
    let part = |i| qkv_x.narrow(2, i, 1)?.squeeze(2);
    let opts = AttnOptions::for_head_dim(hd).with_causal(true);
    let a = nn::flash_attn(&dev, &part(0)?, &part(1)?, &part(2)?, &opts)?;
    let h = (&x + out.forward(&a.reshape((1, seq, heads * hd))?)?)?;
    let y = (&h + mlp.forward(&h)?.gelu()?)?;

    println!("output {:?}; qkv on the NPU: {}", y.dims(), qkv.is_on_npu());
    println!("{}", dev.routing_report());
    Ok(())
}
