//! The CI fuzz run: 100,000 mutated inputs at a fixed seed (more with `LLADA_FUZZ_INPUTS`), and
//! none may panic, hang (the watchdog ends the process) or leak.

use llada_fuzz::{alloc::CountingAlloc, run, Config};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

#[test]
fn hundred_thousand_mutants_no_panic_hang_or_leak() {
    let cfg = Config::from_env(100_000).unwrap();
    let report = run(&cfg).unwrap();
    println!("{}", report.summary());
    assert!(report.inputs >= cfg.inputs);
    // The mutants must reach past the first checks: some load and decode, many are rejected.
    assert!(
        report.loaded > 0 && report.rejected > 0,
        "{}",
        report.summary()
    );
    assert!(report.panics.is_empty(), "{}", report.summary());
    assert!(
        report.leaked.is_some(),
        "the counting allocator is installed"
    );
    assert!(
        report.clean(cfg.leak_bytes),
        "heap grew: {}",
        report.summary()
    );
}
