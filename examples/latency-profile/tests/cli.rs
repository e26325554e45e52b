//! `latency-profile` writes a table the decoders' reader accepts, over the requested grid.

use std::process::Command;

use dllm_decode::LatencyTable;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_latency-profile"))
}

#[test]
fn writes_a_typed_table_over_window_rows_and_cached_length() {
    let dir = std::env::temp_dir().join(format!("latency-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("cpu.json");
    let o = bin()
        .args([
            "--synthetic",
            "tiny",
            "--tokens",
            "1,8,32",
            "--rows",
            "4,all",
        ])
        .args([
            "--cached",
            "16,64",
            "--runs",
            "1",
            "--threads",
            "1",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let t = LatencyTable::load(&out).unwrap();
    // Windows 1 (rows 1), 8 (rows 4, 8), 32 (rows 4, 32), each at two cached lengths.
    assert_eq!(t.points.len(), 2 * (1 + 2 + 2));
    assert_eq!(t.provenance, "measured");
    assert_eq!(t.threads, Some(1));
    assert!(t.points.iter().all(|p| p.rows <= p.window && p.ms > 0.0));
    for (w, r, c) in [(1, 1, 16), (8, 4, 64), (32, 32, 16)] {
        assert!(t
            .points
            .iter()
            .any(|p| (p.window, p.rows, p.cached) == (w, r, c)));
    }
    assert!(t.cost_ms(16, 8, 40) > 0.0);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn impossible_grids_are_named_errors() {
    for (args, want) in [
        (vec!["--rows", "0"], "--rows"),
        (vec!["--cached", "64,16"], "--cached"),
        (vec!["--cached", "100000"], "exceeds"),
        (vec!["--tokens", "0"], "--tokens"),
    ] {
        let o = bin()
            .args(["--synthetic", "tiny"])
            .args(&args)
            .output()
            .unwrap();
        assert!(!o.status.success());
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(e.contains(want), "{args:?}: {e}");
    }
}
