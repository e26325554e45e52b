//! Which SIMD instruction set the kernels use, detected at run time.
//!
//! Every kernel exists once, generic over a vector abstraction (`simd`), and is
//! instantiated for each path below; [`Isa::best`] picks the widest path the CPU runs, and the
//! `*_with` entry points take an explicit [`Isa`] so tests and benchmarks can run every path
//! the machine has (and the portable one, which every target has).

use std::fmt;
use std::sync::OnceLock;

/// A kernel path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Isa {
    /// Plain Rust over 8-lane arrays (auto-vectorised for the target's baseline). Any CPU.
    Portable,
    /// x86-64 AVX2 + FMA + F16C, 8 lanes; int8 dots through `vpmaddubsw`/`vpmaddwd`.
    Avx2,
    /// AVX2 with AVX-VNNI (`vpdpbusd` on 256-bit vectors).
    AvxVnni,
    /// AVX-512 F/BW/VL, 16 lanes; int8 dots through `vpmaddubsw`/`vpmaddwd`.
    Avx512,
    /// AVX-512 with VNNI (`vpdpbusd` on 512-bit vectors).
    Avx512Vnni,
}

impl Isa {
    /// Every path, narrowest first.
    pub const ALL: [Isa; 5] = [
        Isa::Portable,
        Isa::Avx2,
        Isa::AvxVnni,
        Isa::Avx512,
        Isa::Avx512Vnni,
    ];

    /// Whether this CPU runs the path.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                    && std::arch::is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::AvxVnni => {
                Isa::Avx2.is_available() && std::arch::is_x86_feature_detected!("avxvnni")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.is_available()
                    && std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512vl")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => {
                Isa::Avx512.is_available() && std::arch::is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The paths this CPU runs, narrowest first (always starts with [`Isa::Portable`]).
    pub fn available() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| i.is_available()).collect()
    }

    /// The widest path this CPU runs (detected once).
    pub fn best() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| {
            *Isa::available()
                .last()
                .expect("portable is always available")
        })
    }

    /// A short lower-case name (`portable`, `avx2`, `avx-vnni`, `avx512`, `avx512-vnni`).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::AvxVnni => "avx-vnni",
            Isa::Avx512 => "avx512",
            Isa::Avx512Vnni => "avx512-vnni",
        }
    }

    /// Parse [`Isa::name`].
    pub fn from_name(s: &str) -> Option<Isa> {
        Isa::ALL.into_iter().find(|i| i.name() == s)
    }

    /// An error unless this CPU runs the path.
    pub(crate) fn require(self) -> crate::Result<()> {
        if self.is_available() {
            Ok(())
        } else {
            Err(crate::Error::IsaUnavailable(self))
        }
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
