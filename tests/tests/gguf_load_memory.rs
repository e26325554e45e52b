//! A GGUF load's peak heap is the packed weights plus a few rows: dense (F32/F16) matrices are
//! streamed from the file into the kernels-cpu tiles, never held whole in another layout on the
//! way (the earlier loader read a matrix whole, dequantized it and then packed it: two or three
//! copies of the largest matrix on top of the model). Counted with a global allocator, in a test
//! binary of its own (one test, so no other test allocates meanwhile).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use candle_core::quantized::GgmlDType;
use dllm_models::synthetic::tiny_llada;
use llada_tests::fixtures::{full_logits, ids, load_default, tiny_dir, TempDir};
use llada_tests::gguf_fixture::write_gguf;

struct Tracking;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let now = LIVE.fetch_add(by, Ordering::SeqCst) + by;
    PEAK.fetch_max(now, Ordering::SeqCst);
}

// SAFETY: forwards to the system allocator; the counters are atomics.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        grew(l.size());
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Ordering::SeqCst);
        System.dealloc(p, l)
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        grew(l.size());
        System.alloc_zeroed(l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if new >= l.size() {
            grew(new - l.size());
        } else {
            LIVE.fetch_sub(l.size() - new, Ordering::SeqCst);
        }
        System.realloc(p, l, new)
    }
}

#[global_allocator]
static GLOBAL: Tracking = Tracking;

const MIB: usize = 1 << 20;

#[test]
fn a_gguf_load_holds_the_packed_weights_plus_a_few_rows() {
    // A vocabulary large enough that the embedding and the head (32768 x 64) are the largest
    // matrices by far: 8 MiB each as F32, 4 MiB as F16, against a 1 MiB read buffer.
    let mut cfg = tiny_llada();
    cfg.vocab_size = 32768;
    let dir = tiny_dir("gguf-mem", &cfg, 3).unwrap();
    for (ty, elem) in [(GgmlDType::F32, 4), (GgmlDType::F16, 2)] {
        let out = TempDir::new("gguf-mem-file").unwrap();
        let path = out.join("model.gguf");
        write_gguf(dir.path(), &path, ty).unwrap();
        let largest = cfg.vocab_size * cfg.hidden_size * elem;

        let before = LIVE.load(Ordering::SeqCst);
        PEAK.store(before, Ordering::SeqCst);
        let mut loaded = load_default(&path).unwrap();
        let (after, peak) = (LIVE.load(Ordering::SeqCst), PEAK.load(Ordering::SeqCst));
        let (resident, transient) = (after - before, peak - after);
        println!(
            "{ty:?}: resident {:.2} MiB, transient peak {:.2} MiB, largest matrix {:.2} MiB",
            resident as f64 / MIB as f64,
            transient as f64 / MIB as f64,
            largest as f64 / MIB as f64
        );
        // Both tables are held once each, packed (plus the small layers).
        assert!(resident >= 2 * largest && resident < 2 * largest + 2 * MIB);
        // On top of them, at most the read buffer and small things: not a copy of a table.
        assert!(
            transient < largest / 4 + MIB / 2,
            "{ty:?}: a load held {transient} bytes beyond its weights (largest matrix {largest})"
        );
        // And the streamed model computes.
        let x = ids(24, 250, cfg.special.mask, 1);
        let logits = full_logits(&mut loaded.model, &x).unwrap();
        assert!(logits.iter().flatten().all(|v| v.is_finite()));
    }
}
