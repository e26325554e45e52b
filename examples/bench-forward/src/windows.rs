//! Windowed forwards against a cached prefix vs full-canvas forwards, on one model.

use anyhow::Result;
use dllm_models::{DiffusionLm, DiffusionTransformer, Rows};

use crate::model::{canvas, median_ms};

/// Print the table for `m` over a canvas of `l` positions.
pub fn table(
    m: &mut DiffusionTransformer,
    l: usize,
    windows: &[usize],
    iters: usize,
) -> Result<()> {
    let x = canvas(l, m.info().vocab_size)?;
    m.clear_cache()?;
    let full = median_ms(iters, || {
        m.forward_full(&x, Rows::All)?;
        Ok(())
    })?;
    let last32: Vec<usize> = (l.saturating_sub(32)..l).collect();
    let full_rows = median_ms(iters, || {
        m.forward_full(&x, Rows::Positions(&last32))?;
        Ok(())
    })?;
    println!("| forward | rows computed | logits rows | ms | vs full | ideal (rows / {l}) |");
    println!("|---|---:|---:|---:|---:|---:|");
    println!("| full canvas | {l} | {l} | {full:.1} | 1.00 | 1.00 |");
    println!(
        "| full canvas, logits for 32 rows | {l} | 32 | {full_rows:.1} | {:.2} | — |",
        full_rows / full
    );
    for &win in windows {
        if win >= l {
            continue;
        }
        m.clear_cache()?;
        m.forward_full(&x, Rows::None)?;
        m.commit(0..l - win)?;
        let t = median_ms(iters, || {
            m.forward(&x, l - win..l, Rows::All)?;
            Ok(())
        })?;
        println!(
            "| window, prefix cached | {win} | {win} | {t:.1} | {:.2} | {:.2} |",
            t / full,
            win as f64 / l as f64
        );
    }
    Ok(())
}
