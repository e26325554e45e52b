//! Windowed forwards against a cached prefix vs full-canvas forwards, on one model. Each row
//! alternates its forward with a full-canvas forward (logits for every row) in one loop, so a
//! burst of load from other jobs lands on both sides of the ratio.

use anyhow::Result;
use dllm_models::{DiffusionLm, DiffusionTransformer, Rows};

use crate::model::canvas;

/// Median ms of `a` and of `b`, run alternately `iters` times after one warm-up of each.
fn paired(
    iters: usize,
    mut a: impl FnMut() -> Result<()>,
    mut b: impl FnMut() -> Result<()>,
) -> Result<(f64, f64)> {
    a()?;
    b()?;
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    for _ in 0..iters {
        let t = std::time::Instant::now();
        a()?;
        ta.push(t.elapsed().as_secs_f64() * 1e3);
        let t = std::time::Instant::now();
        b()?;
        tb.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let mid = |mut v: Vec<f64>| {
        v.sort_by(|x, y| x.total_cmp(y));
        v[v.len() / 2]
    };
    Ok((mid(ta), mid(tb)))
}

/// Print the table for `m` over a canvas of `l` positions.
pub fn table(
    m: &mut DiffusionTransformer,
    l: usize,
    windows: &[usize],
    iters: usize,
) -> Result<()> {
    let x = canvas(l, m.info().vocab_size)?;
    let last32: Vec<usize> = (l.saturating_sub(32)..l).collect();
    m.clear_cache()?;
    let m = std::cell::RefCell::new(m);
    let full = || -> Result<()> {
        m.borrow_mut().forward(&x, 0..l, Rows::All)?;
        Ok(())
    };
    let (rows32, full0) = paired(
        iters,
        || {
            m.borrow_mut().forward(&x, 0..l, Rows::Positions(&last32))?;
            Ok(())
        },
        full,
    )?;
    println!("| forward | rows computed | logits rows | ms | full canvas ms (alternated) | vs full | ideal (rows / {l}) |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    println!("| full canvas | {l} | {l} | {full0:.1} | {full0:.1} | 1.00 | 1.00 |");
    println!(
        "| full canvas, logits for 32 rows | {l} | 32 | {rows32:.1} | {full0:.1} | {:.2} | — |",
        rows32 / full0
    );
    for &win in windows {
        if win >= l {
            continue;
        }
        {
            let mut mm = m.borrow_mut();
            mm.clear_cache()?;
            mm.forward_full(&x, Rows::None)?;
            mm.commit(0..l - win)?;
        }
        // A full-canvas forward over [0, l) leaves the cached prefix as it was.
        let (t, f) = paired(
            iters,
            || {
                m.borrow_mut().forward(&x, l - win..l, Rows::All)?;
                Ok(())
            },
            full,
        )?;
        println!(
            "| window, prefix cached | {win} | {win} | {t:.1} | {f:.1} | {:.2} | {:.2} |",
            t / f,
            win as f64 / l as f64
        );
    }
    Ok(())
}
