//! Whether a weight-owning module can be placed under the device's memory policy, decided from
//! its packed sizes before any weight is read: a placement that cannot fit is refused with the
//! numbers at once, not after minutes of loading.
//!
//! What each policy must map at once: `naive` keeps every weight mapped, so all of them; `paging`
//! maps what one DSP batch reads, so the largest layer's weights; `somr` streams what fits its
//! staging slots, so the weights too large for a slot (resident by necessity) plus the two slots.
//! The pinned vectors (norms, rotary tables) are counted for all three. Activations and the KV
//! cache come later and are not known yet: the check is a lower bound, the forward's own errors
//! remain for what it cannot see.

use crate::device::HexagonDevice;
use crate::error::{Error, Result};
use crate::kinds::MemoryPolicy;
use crate::memory::round_up;

use super::somr::HEADROOM_DIVISOR;

/// Check that `lens` (packed weight bytes, grouped per DSP batch: each layer, then the tail)
/// and `pinned` bytes of vectors can be placed under `dev`'s policy in the window's free space.
pub(crate) fn check(dev: &HexagonDevice, lens: &[Vec<usize>], pinned: u64) -> Result<()> {
    let va = dev.memory_stats().va;
    let page = dev.mem().window.page();
    let r = |l: usize| round_up(l.max(1) as u64, page);
    let free = va.window_bytes.saturating_sub(va.mapped_bytes);
    let pinned = round_up(pinned, page);
    let cfg = dev.config();
    let policy = cfg.memory_policy;
    let all = || lens.iter().flatten().copied();
    let (what, need) = match policy {
        MemoryPolicy::Naive => (
            "every packed weight, mapped at once,",
            all().map(r).sum::<u64>() + pinned,
        ),
        MemoryPolicy::Paging => (
            "the packed weights of the largest layer (one DSP batch)",
            lens.iter()
                .map(|l| l.iter().map(|&x| r(x)).sum::<u64>())
                .max()
                .unwrap_or(0)
                + pinned,
        ),
        MemoryPolicy::Somr => {
            let total = free.saturating_sub(va.window_bytes / HEADROOM_DIVISOR);
            let slot_max = (cfg.staging_bytes / 2).min(total / 2);
            let big: u64 = all().map(r).filter(|&b| b > slot_max).sum();
            let slot = all().map(r).filter(|&b| b <= slot_max).max().unwrap_or(0);
            (
                "the weights too large to stream (resident) and the two staging slots",
                big + 2 * slot + pinned,
            )
        }
    };
    if need > free {
        return Err(Error::WontFit {
            policy: policy.name(),
            what,
            need,
            free,
            window: va.window_bytes,
        });
    }
    Ok(())
}
