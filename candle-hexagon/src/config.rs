//! Device options: [`HexagonConfig`] (every field with a named `DEFAULT_*` constant, checked
//! by [`HexagonConfig::validate`] with errors naming the field), [`TransportConfig`], and the
//! parsers of their command-line spellings (`--hexagon-transport`, `--memory-policy`,
//! `--hexagon-window`).

use std::path::PathBuf;

use crate::error::{ConfigProblem, Error, Result, Unit};

/// Why the window is at most 4 GiB, for messages.
const ADDRESS_SPACE_NOTE: &str = " (the DSP has a 32-bit address space)";
use crate::kinds::{MemoryPolicy, OpKind};

/// Default DSP worker threads (HVX contexts on a phone; pthreads on the emulated DSP).
pub const DEFAULT_WORKERS: usize = 2;
/// Default NPU address window: about what one v75 FastRPC session can map.
pub const DEFAULT_VA_WINDOW_BYTES: u64 = 3 << 30;
/// Largest window: the DSP process has a 32-bit address space.
pub const MAX_VA_WINDOW_BYTES: u64 = 4 << 30;
/// Default mapper entries of a session (an assumption: the real limit is not public).
pub const DEFAULT_MAPPER_ENTRIES: usize = 256;
/// Default scratch arena: the size of VTCM on SM8550..SM8850.
pub const DEFAULT_SCRATCH_BYTES: u64 = 8 << 20;
/// Default size of one weight chunk (packed weights share chunks to save mapper entries).
pub const DEFAULT_WEIGHT_CHUNK_BYTES: u64 = 32 << 20;
/// Default memory policy of weight-owning modules: the swap-optimized memory runtime.
pub const DEFAULT_MEMORY_POLICY: MemoryPolicy = MemoryPolicy::Somr;
/// Default staging budget of the `somr` policy: two slots of up to half of it each (the paper's
/// 256 MB).
pub const DEFAULT_STAGING_BYTES: u64 = 256 << 20;
/// The default window in MiB (`--hexagon-window`).
pub const DEFAULT_VA_WINDOW_MIB: u64 = DEFAULT_VA_WINDOW_BYTES >> 20;
/// The FastRPC library of the compute DSP.
pub const DEFAULT_FASTRPC_LIBRARY: &str = "libcdsprpc.so";
/// Largest head dimension of the FlashAttention kernel.
pub const MAX_HEAD_DIM: usize = kernels_dsp::KDSP_FA_MAX_HEAD_DIM as usize;
/// Largest dim the kernels accept.
pub const MAX_DIM: usize = kernels_dsp::KDSP_MAX_NE as usize;

/// How to reach the DSP.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum TransportConfig {
    /// A DSP thread on the host running the kernels-dsp host build.
    #[default]
    Emulated,
    /// FastRPC through the named library (`libcdsprpc.so` on a phone, or a path to the host
    /// shim, see [`crate::shim_library_path`]).
    FastRpc {
        /// Library name or path given to `dlopen`.
        library: PathBuf,
    },
}

impl TransportConfig {
    /// From command-line spellings: `emulated`, or `fastrpc` with `library` naming what to
    /// `dlopen` (`libcdsprpc.so` on a phone, a path) or `shim` for the host FastRPC shim built
    /// with this crate ([`crate::shim_library_path`]). `library` is ignored for `emulated`.
    pub fn from_names(transport: &str, library: &str) -> Result<Self> {
        match transport {
            "emulated" => Ok(Self::Emulated),
            "fastrpc" if library == "shim" => match crate::shim_library_path() {
                Some(library) => Ok(Self::FastRpc { library }),
                None => Err(Error::config("fastrpc library", ConfigProblem::NoShim)),
            },
            "fastrpc" => Ok(Self::FastRpc {
                library: PathBuf::from(library),
            }),
            t => Err(Error::config(
                "transport",
                ConfigProblem::Unknown {
                    value: t.to_string(),
                    expected: &["emulated", "fastrpc"],
                },
            )),
        }
    }
}

/// Device options (all fields have `DEFAULT_*` constants).
#[derive(Debug, Clone, PartialEq)]
pub struct HexagonConfig {
    /// DSP worker threads, 1..=16.
    pub workers: usize,
    /// NPU address window in bytes (page multiple, at most 4 GiB).
    pub va_window_bytes: u64,
    /// Mapper entries (live mappings) of the session, >= 2.
    pub mapper_entries: usize,
    /// Scratch arena (VTCM stand-in) in bytes.
    pub scratch_bytes: u64,
    /// Size of one shared weight chunk.
    pub weight_chunk_bytes: u64,
    /// Ops forced onto the CPU (for bisecting).
    pub deny: Vec<OpKind>,
    /// Transport.
    pub transport: TransportConfig,
    /// How weight-owning modules share the window (`naive`, `paging`, `somr`; see
    /// [`MemoryPolicy`](crate::MemoryPolicy)).
    pub memory_policy: MemoryPolicy,
    /// `somr`: bytes for the two staging slots (each at most half).
    pub staging_bytes: u64,
    /// `somr`: at most this many bytes of weights stay resident (`None`: as many as the window
    /// holds). For measuring staging against the resident budget.
    pub resident_weight_bytes: Option<u64>,
}

impl Default for HexagonConfig {
    fn default() -> Self {
        HexagonConfig {
            workers: DEFAULT_WORKERS,
            va_window_bytes: DEFAULT_VA_WINDOW_BYTES,
            mapper_entries: DEFAULT_MAPPER_ENTRIES,
            scratch_bytes: DEFAULT_SCRATCH_BYTES,
            weight_chunk_bytes: DEFAULT_WEIGHT_CHUNK_BYTES,
            deny: Vec::new(),
            transport: TransportConfig::Emulated,
            memory_policy: DEFAULT_MEMORY_POLICY,
            staging_bytes: DEFAULT_STAGING_BYTES,
            resident_weight_bytes: None,
        }
    }
}

/// The window size in bytes for `--hexagon-window MIB`: 1..=4096 MiB.
pub fn window_bytes_from_mib(mib: u64) -> Result<u64> {
    if !(1..=(MAX_VA_WINDOW_BYTES >> 20)).contains(&mib) {
        return Err(Error::config(
            "hexagon window",
            ConfigProblem::NotInRange {
                value: mib,
                min: 1,
                max: MAX_VA_WINDOW_BYTES >> 20,
                unit: Unit::MiB,
                note: ADDRESS_SPACE_NOTE,
            },
        ));
    }
    Ok(mib << 20)
}

impl HexagonConfig {
    /// The memory settings from their command-line spellings: `--memory-policy`
    /// (`naive|paging|somr`) and `--hexagon-window` (MiB).
    pub fn with_memory_names(self, policy: &str, window_mib: u64) -> Result<Self> {
        Ok(HexagonConfig {
            memory_policy: MemoryPolicy::from_name(policy)?,
            va_window_bytes: window_bytes_from_mib(window_mib)?,
            ..self
        })
    }

    /// Check every field; errors name the field.
    pub fn validate(&self) -> Result<()> {
        let bad = |field, problem| Err(Error::config(field, problem));
        let range = |value: u64, min: u64, max: u64, unit, note| ConfigProblem::NotInRange {
            value,
            min,
            max,
            unit,
            note,
        };
        if !(1..=kernels_dsp::KDSP_MAX_WORKERS as usize).contains(&self.workers) {
            let max = kernels_dsp::KDSP_MAX_WORKERS as u64;
            return bad(
                "workers",
                range(self.workers as u64, 1, max, Unit::Count, ""),
            );
        }
        if self.va_window_bytes < (1 << 20) || self.va_window_bytes > MAX_VA_WINDOW_BYTES {
            let (v, max) = (self.va_window_bytes, MAX_VA_WINDOW_BYTES);
            let p = range(v, 1 << 20, max, Unit::Bytes, ADDRESS_SPACE_NOTE);
            return bad("va_window_bytes", p);
        }
        if !(2..=kernels_dsp::KDSP_MAX_BUFFERS as usize).contains(&self.mapper_entries) {
            let (v, max) = (
                self.mapper_entries as u64,
                kernels_dsp::KDSP_MAX_BUFFERS as u64,
            );
            let note = " (one staging buffer plus at least one weight chunk)";
            return bad("mapper_entries", range(v, 2, max, Unit::Count, note));
        }
        // FlashAttention needs ~280 KiB per worker at head dim 256; keep 1 MiB on top.
        let min_scratch = self.workers as u64 * (320 << 10) + (1 << 20);
        if self.scratch_bytes < min_scratch {
            return bad(
                "scratch_bytes",
                ConfigProblem::ScratchForWorkers {
                    bytes: self.scratch_bytes,
                    min: min_scratch,
                    workers: self.workers,
                },
            );
        }
        if self.staging_bytes < 2 * crate::memory::page_size() {
            return bad(
                "staging_bytes",
                ConfigProblem::Below {
                    value: self.staging_bytes,
                    min: 2 * crate::memory::page_size(),
                    unit: Unit::Bytes,
                    note: " (two pages)",
                },
            );
        }
        if self.weight_chunk_bytes < (64 << 10) {
            return bad(
                "weight_chunk_bytes",
                ConfigProblem::Below {
                    value: self.weight_chunk_bytes,
                    min: 64 << 10,
                    unit: Unit::Bytes,
                    note: "",
                },
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HexagonDevice;

    #[test]
    fn transports_from_their_command_line_names() {
        use TransportConfig as T;
        assert_eq!(T::from_names("emulated", "shim").unwrap(), T::Emulated);
        assert_eq!(
            T::from_names("fastrpc", "libcdsprpc.so").unwrap(),
            T::FastRpc {
                library: "libcdsprpc.so".into()
            }
        );
        match (T::from_names("fastrpc", "shim"), crate::shim_library_path()) {
            (Ok(T::FastRpc { library }), Some(p)) => assert_eq!(library, p),
            (Err(e), None) => assert!(e.to_string().contains("shim"), "{e}"),
            (r, p) => panic!("{r:?} with shim {p:?}"),
        }
        let e = T::from_names("usb", "shim").unwrap_err().to_string();
        assert!(e.contains("`usb`") && e.contains("transport"), "{e}");
    }

    #[test]
    fn memory_settings_from_their_command_line_names() {
        let c = HexagonConfig::default()
            .with_memory_names("paging", 96)
            .unwrap();
        assert_eq!(
            (c.memory_policy, c.va_window_bytes),
            (MemoryPolicy::Paging, 96 << 20)
        );
        for p in MemoryPolicy::ALL {
            assert_eq!(MemoryPolicy::from_name(p.name()).unwrap(), p);
        }
        assert_eq!(HexagonConfig::default().memory_policy, MemoryPolicy::Somr);
        let e = HexagonConfig::default()
            .with_memory_names("lru", 96)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`lru`") && e.contains("naive, paging or somr"),
            "{e}"
        );
        for mib in [0, 4097] {
            let e = HexagonConfig::default()
                .with_memory_names("somr", mib)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("hexagon window") && e.contains(&format!("{mib} MiB")),
                "{e}"
            );
        }
    }

    #[test]
    fn config_errors_name_the_field() {
        let cases: Vec<(HexagonConfig, &str)> = vec![
            (
                HexagonConfig {
                    workers: 0,
                    ..Default::default()
                },
                "workers",
            ),
            (
                HexagonConfig {
                    va_window_bytes: 5 << 30,
                    ..Default::default()
                },
                "va_window_bytes",
            ),
            (
                HexagonConfig {
                    mapper_entries: 1,
                    ..Default::default()
                },
                "mapper_entries",
            ),
            (
                HexagonConfig {
                    scratch_bytes: 4096,
                    ..Default::default()
                },
                "scratch_bytes",
            ),
            (
                HexagonConfig {
                    weight_chunk_bytes: 1,
                    ..Default::default()
                },
                "weight_chunk_bytes",
            ),
            (
                HexagonConfig {
                    staging_bytes: 0,
                    ..Default::default()
                },
                "staging_bytes",
            ),
        ];
        for (cfg, field) in cases {
            let e = HexagonDevice::open(cfg).unwrap_err().to_string();
            assert!(e.contains(&format!("`{field}`")), "{e}");
        }
        HexagonConfig::default().validate().unwrap();
    }
}
