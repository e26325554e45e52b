//! The `naive` and `paging` policies: one mapping per weight, made when a batch first needs it.
//! Both map the weight's range of the module's weight file in place (no copy, no second copy of
//! the weights held) when the transport can, else map a buffer of its own and copy. `naive` keeps
//! every mapping; `paging` replaces the least recently used mapping not needed by the batch being
//! prepared when the window or the mapper table is full, and every miss is a synchronous map (the
//! baseline the `somr` policy is measured against).
//! Neither knows the graph: there is no plan and no prefetch.

use std::collections::HashMap;
use std::time::Instant;

use super::{Loc, Runtime, State};
use crate::error::Result;
use crate::memory::DeviceBuffer;

/// Mapped weights and their last use.
pub(crate) struct Pager {
    replace: bool,
    mapped: HashMap<usize, (DeviceBuffer, u64)>,
    tick: u64,
}

impl Pager {
    pub(crate) fn new(replace: bool) -> Self {
        Pager {
            replace,
            mapped: HashMap::new(),
            tick: 0,
        }
    }

    /// Make `needed` visible to the DSP (mapping and copying the missing ones) and return where
    /// they are.
    pub(crate) fn prepare(
        rt: &Runtime,
        st: &mut State,
        needed: &[usize],
    ) -> Result<Vec<(usize, Loc)>> {
        let super::Policy::Pager(p) = &mut st.policy else {
            unreachable!("pager state")
        };
        p.tick += 1;
        let mut out = Vec::with_capacity(needed.len());
        for &w in needed {
            if let Some((buf, used)) = p.mapped.get_mut(&w) {
                *used = p.tick;
                out.push((
                    w,
                    Loc {
                        buffer: buf.id(),
                        offset: 0,
                    },
                ));
                continue;
            }
            let start = Instant::now();
            let bytes = &rt.weights[w].bytes;
            // The weight's range of the module's weight file, mapped in place when the transport
            // can (no copy: the NPU reads the host's pages); else a mapping of its own + a copy.
            let in_place = bytes.file().shared();
            let map = || {
                if in_place {
                    rt.dev
                        .mem()
                        .map_weights(bytes.file(), bytes.file_offset(), bytes.len())
                } else {
                    rt.dev.map_buffer(bytes.len())
                }
            };
            let mut buf = loop {
                match map() {
                    Ok(b) => break b,
                    Err(e) if e.is_resource_exhausted() && p.replace => {
                        if !p.evict_lru(rt, needed) {
                            return Err(e);
                        }
                    }
                    Err(e) => return Err(e),
                }
            };
            let copied = if in_place {
                0
            } else {
                buf.write(0, bytes)?;
                // A copy beside the host bytes (a transport that cannot map them in place).
                buf.hold_weight_copy(bytes.len() as u64);
                bytes.len() as u64
            };
            rt.stats()
                .staged(copied, start, Instant::now(), st.last.as_ref());
            out.push((
                w,
                Loc {
                    buffer: buf.id(),
                    offset: 0,
                },
            ));
            p.mapped.insert(w, (buf, p.tick));
        }
        Ok(out)
    }

    /// Unmap the least recently used weight not in `keep` (after the batches reading it: the
    /// buffer detaches through the DSP queue). False when there is none.
    fn evict_lru(&mut self, rt: &Runtime, keep: &[usize]) -> bool {
        let victim = self
            .mapped
            .iter()
            .filter(|(w, _)| !keep.contains(w))
            .min_by_key(|(w, (_, used))| (*used, **w))
            .map(|(w, _)| *w);
        match victim {
            Some(w) => {
                drop(self.mapped.remove(&w));
                rt.stats().count_evictions(1);
                true
            }
            None => false,
        }
    }

    /// Unmap every weight (`paging` only: `naive` keeps what it mapped). True when anything was
    /// freed.
    pub(crate) fn evict_all(&mut self, rt: &Runtime) -> bool {
        if !self.replace || self.mapped.is_empty() {
            return false;
        }
        let n = self.mapped.len() as u64;
        self.mapped.clear();
        rt.stats().count_evictions(n);
        true
    }
}
