//! `llada-fuzz`: run the harness from the command line (`LLADA_FUZZ_INPUTS`, `LLADA_FUZZ_SEED`,
//! `LLADA_FUZZ_BOUND_SECS`; see the README) and exit non-zero on any failure.

use anyhow::{bail, Result};
use llada_fuzz::{alloc::CountingAlloc, run, Config};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

fn main() -> Result<()> {
    let cfg = Config::from_env(100_000)?;
    eprintln!(
        "llada-fuzz: {} inputs, seed {}, per-input bound {:?}",
        cfg.inputs, cfg.seed, cfg.per_input
    );
    let report = run(&cfg)?;
    print!("{}", report.summary());
    if !report.clean(cfg.leak_bytes) {
        bail!("failures found");
    }
    Ok(())
}
