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
    /// AArch64 Advanced SIMD (NEON), 4 lanes; int8 dots through `smull` + `addp` + `sadalp`.
    Neon,
    /// NEON with the dot-product extension (`sdot`, Armv8.2 FEAT_DotProd).
    NeonDotprod,
    /// NEON with dotprod and the int8 matrix multiply (`smmla`, Armv8.6 FEAT_I8MM).
    NeonI8mm,
}

impl Isa {
    /// Every path, narrowest first within each architecture.
    pub const ALL: [Isa; 8] = [
        Isa::Portable,
        Isa::Avx2,
        Isa::AvxVnni,
        Isa::Avx512,
        Isa::Avx512Vnni,
        Isa::Neon,
        Isa::NeonDotprod,
        Isa::NeonI8mm,
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
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[cfg(target_arch = "aarch64")]
            Isa::NeonDotprod => {
                Isa::Neon.is_available() && std::arch::is_aarch64_feature_detected!("dotprod")
            }
            #[cfg(target_arch = "aarch64")]
            Isa::NeonI8mm => {
                Isa::NeonDotprod.is_available() && std::arch::is_aarch64_feature_detected!("i8mm")
            }
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The paths this CPU runs, narrowest first (always starts with [`Isa::Portable`]; on x86-64
    /// the AVX paths follow, on AArch64 the NEON ones).
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

    /// A short lower-case name (`portable`, `avx2`, `avx-vnni`, `avx512`, `avx512-vnni`, `neon`,
    /// `neon-dotprod`, `neon-i8mm`).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::AvxVnni => "avx-vnni",
            Isa::Avx512 => "avx512",
            Isa::Avx512Vnni => "avx512-vnni",
            Isa::Neon => "neon",
            Isa::NeonDotprod => "neon-dotprod",
            Isa::NeonI8mm => "neon-i8mm",
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
