//! The crate's one error type, with structured variants, converting into `candle_core::Error` at
//! the candle boundary (custom ops, `Module::forward`). Every variant carries facts (numbers,
//! names, ids, dtypes, small enums of reasons), never a prebuilt message: [`InputProblem`] (with
//! [`CacheProblem`] and [`ProgramProblem`]) says what is wrong with an op's arguments,
//! [`TransportFault`] what went wrong in the DSP transport, [`ConfigProblem`] what is wrong with
//! a configuration value and [`LibraryProblem`] why the FastRPC library cannot be used.

use std::fmt;

mod faults;
mod input;
mod program;

pub use faults::{ConfigProblem, LibraryProblem, TransportFault, Unit};
pub use input::{CacheProblem, InputProblem};
pub use program::{ProgramProblem, ProgramSite};

/// A per-op status code returned by the DSP kernels (`KDSP_STATUS_*` of `kdsp_ops.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KernelStatus(pub u32);

impl KernelStatus {
    /// `KDSP_STATUS_OK`.
    pub const OK: KernelStatus = KernelStatus(kernels_dsp::KDSP_STATUS_OK);
    /// `KDSP_STATUS_OUT_OF_BUDGET` (scratch too small).
    pub const OUT_OF_BUDGET: KernelStatus = KernelStatus(kernels_dsp::KDSP_STATUS_OUT_OF_BUDGET);

    /// The status code's name in the C header.
    pub fn name(self) -> &'static str {
        match self.0 {
            kernels_dsp::KDSP_STATUS_OK => "OK",
            kernels_dsp::KDSP_STATUS_UNSUPPORTED => "UNSUPPORTED",
            kernels_dsp::KDSP_STATUS_INVALID_PARAMS => "INVALID_PARAMS",
            kernels_dsp::KDSP_STATUS_OUT_OF_BUDGET => "OUT_OF_BUDGET",
            kernels_dsp::KDSP_STATUS_NOT_RUN => "NOT_RUN",
            _ => "unknown status",
        }
    }
}

impl fmt::Display for KernelStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// Bytes in a human unit (`12.0 MiB`), for messages.
pub fn fmt_bytes(b: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Everything that can go wrong in the backend.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The NPU-visible address window cannot hold a mapping of `need` bytes: the largest free
    /// range is `have` bytes.
    #[error(
        "NPU address space exhausted: need {need} bytes ({}) contiguous, have {have} bytes ({}) \
         (largest free range; {in_use} of {window} bytes of the window mapped)",
        fmt_bytes(*.need),
        fmt_bytes(*.have)
    )]
    VaBudget {
        /// Bytes requested (page-rounded).
        need: u64,
        /// Largest free contiguous range.
        have: u64,
        /// Window size.
        window: u64,
        /// Bytes currently mapped.
        in_use: u64,
    },
    /// A weight-owning module the memory policy cannot place in the NPU window, found from the
    /// module's shape before any weight is read or mapped.
    #[error(
        "the `{policy}` memory policy cannot place this model in the NPU window: {what} need \
         {need} bytes ({}), and {free} bytes ({}) of the {window}-byte ({}) window are free \
         before activations and the KV cache; nothing was loaded (use the `somr` policy or a \
         larger window)",
        fmt_bytes(*.need),
        fmt_bytes(*.free),
        fmt_bytes(*.window)
    )]
    WontFit {
        /// The policy (`naive`, `paging`, `somr`).
        policy: &'static str,
        /// What must be mapped at once under that policy.
        what: &'static str,
        /// Bytes it needs (page-rounded mappings).
        need: u64,
        /// Bytes of the window free when the check ran.
        free: u64,
        /// Window size.
        window: u64,
    },
    /// Every mapper entry of the session is in use.
    #[error("NPU mapper entries exhausted: need 1 more mapping, have 0 of {limit} entries free")]
    MapperEntries {
        /// Entries of the session.
        limit: usize,
    },
    /// An invalid configuration value.
    #[error("hexagon config: `{field}`: {problem}")]
    Config {
        /// The field (or command-line spelling) at fault.
        field: &'static str,
        /// What is wrong with it.
        problem: ConfigProblem,
    },
    /// A DSP kernel rejected or failed an op.
    #[error("{op}: the DSP returned {status} for op {index} of the batch")]
    Kernel {
        /// Which op (label of the batch entry).
        op: &'static str,
        /// Index of the op in its batch.
        index: usize,
        /// The kernel status.
        status: KernelStatus,
    },
    /// A system call failed.
    #[error("{call} failed: {source}")]
    Os {
        /// The call.
        call: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The FastRPC library could not be loaded or lacks a symbol.
    #[error("FastRPC library `{library}`: {problem}")]
    Library {
        /// Library name or path.
        library: String,
        /// Why it cannot be used.
        problem: LibraryProblem,
    },
    /// A FastRPC call returned an error code (AEE codes, see `AEEStdErr.h`).
    #[error("FastRPC {call} returned error {code:#x}")]
    FastRpc {
        /// The call.
        call: &'static str,
        /// The returned code.
        code: i32,
    },
    /// A host access to a device buffer conflicts with a submitted batch that has not finished.
    #[error(
        "host {host} of bytes [{start}, {end}) of NPU buffer {buffer} conflicts with a batch in \
         flight that {dsp} [{dsp_start}, {dsp_end}) (op `{op}`); wait for its fence first"
    )]
    Busy {
        /// The buffer id.
        buffer: u32,
        /// `read` or `write`.
        host: &'static str,
        /// First byte the host asked for.
        start: u64,
        /// One past the last byte.
        end: u64,
        /// `reads` or `writes`.
        dsp: &'static str,
        /// Label of the op holding the lease.
        op: &'static str,
        /// First byte the batch may touch.
        dsp_start: u64,
        /// One past the last byte the batch may touch.
        dsp_end: u64,
    },
    /// A batch of a block-level forward failed.
    #[error("transformer block {block}: {source}")]
    InBlock {
        /// Index of the block whose batch failed.
        block: usize,
        /// What failed.
        #[source]
        source: Box<Error>,
    },
    /// The DSP queue or session failed.
    #[error("DSP transport: {0}")]
    Transport(TransportFault),
    /// Bad arguments to an op (dtypes, shapes, ranges, weights, cache use).
    #[error("{op}: {problem}")]
    InvalidInput {
        /// The op.
        op: &'static str,
        /// What is wrong (boxed: the problems carry shapes and names, and every `Result` of the
        /// crate carries this type).
        problem: Box<InputProblem>,
    },
    /// The backend cannot run on this target: it needs memfd shared memory (Linux, Android).
    /// Elsewhere the crate builds as a stub whose device never opens; use the CPU path.
    #[error(
        "{what} is unsupported on this target (OS `{os}`): candle-hexagon needs memfd shared \
         memory (Linux or Android); keep the model on the CPU"
    )]
    Unsupported {
        /// What was attempted.
        what: &'static str,
        /// The target OS (`std::env::consts::OS`).
        os: &'static str,
    },
    /// An error from candle itself.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

impl Error {
    /// What is wrong, for an [`Error::InvalidInput`]: `matches!(e.input_problem(),
    /// Some(InputProblem::DType { .. }))`.
    pub fn input_problem(&self) -> Option<&InputProblem> {
        match self {
            Error::InvalidInput { problem, .. } => Some(problem),
            _ => None,
        }
    }

    /// Bad arguments to `op`.
    pub(crate) fn input(op: &'static str, problem: impl Into<InputProblem>) -> Self {
        Error::InvalidInput {
            op,
            problem: Box::new(problem.into()),
        }
    }

    /// A bad configuration value of `field`.
    pub(crate) fn config(field: &'static str, problem: ConfigProblem) -> Self {
        Error::Config { field, problem }
    }

    /// The last OS error for `call`.
    pub(crate) fn last_os(call: &'static str) -> Self {
        Error::Os {
            call,
            source: std::io::Error::last_os_error(),
        }
    }

    /// True for the resource-exhaustion errors that make an op fall back to the CPU.
    pub fn is_resource_exhausted(&self) -> bool {
        matches!(self, Error::VaBudget { .. } | Error::MapperEntries { .. })
    }
}

impl From<Error> for candle_core::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Candle(c) => c,
            e => candle_core::Error::wrap(e),
        }
    }
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn va_budget_message_names_need_and_have() {
        let e = Error::VaBudget {
            need: 8 << 20,
            have: 3 << 20,
            window: 64 << 20,
            in_use: 61 << 20,
        };
        let m = e.to_string();
        assert!(m.contains("need 8388608 bytes (8.0 MiB)"), "{m}");
        assert!(m.contains("have 3145728 bytes (3.0 MiB)"), "{m}");
        let c: candle_core::Error = e.into();
        assert!(c.to_string().contains("need 8388608"), "{c}");
    }

    #[test]
    fn input_problems_carry_the_facts_and_name_them() {
        use candle_core::DType;
        let e = Error::input(
            "HexTransformer::submit",
            InputProblem::DType {
                what: "input",
                expected: &[DType::F32, DType::F16, DType::BF16],
                found: DType::U32,
            },
        );
        assert!(matches!(
            e,
            Error::InvalidInput {
                op: "HexTransformer::submit",
                ..
            }
        ));
        assert!(matches!(
            e.input_problem(),
            Some(InputProblem::DType {
                found: DType::U32,
                ..
            })
        ));
        assert_eq!(
            e.to_string(),
            "HexTransformer::submit: input dtype U32 (use f32, f16 or bf16)"
        );
        let e = Error::input(
            "DeviceKv",
            CacheProblem::Move {
                src: 20..21,
                dst: 3,
                filled: 14,
            },
        );
        assert!(matches!(
            e.input_problem(),
            Some(InputProblem::Cache(CacheProblem::Move { src, .. })) if *src == (20..21)
        ));
        assert_eq!(
            e.to_string(),
            "DeviceKv: move of rows 20..21 to 3: the source must lie in the filled [0, 14) and \
             the destination start at or before its end"
        );
        let e = Error::input(
            "HexTransformer program",
            InputProblem::Program {
                site: ProgramSite::Node {
                    part: "layer",
                    index: 7,
                    label: "flash_attn",
                },
                problem: ProgramProblem::ReadBeforeWrite { name: "att".into() },
            },
        );
        assert_eq!(
            e.to_string(),
            "HexTransformer program: layer node 7 (flash_attn): `att` is read before it is written"
        );
    }

    #[test]
    fn transport_config_and_library_problems_name_their_values() {
        let e = Error::Transport(TransportFault::WeightNotPrepared { weight: 12 });
        assert_eq!(e.to_string(), "DSP transport: weight 12 was not prepared");
        let e = Error::config(
            "memory_policy",
            ConfigProblem::Unknown {
                value: "lru".into(),
                expected: &["naive", "paging", "somr"],
            },
        );
        assert_eq!(
            e.to_string(),
            "hexagon config: `memory_policy`: unknown `lru` (expected naive, paging or somr)"
        );
        let e = Error::config(
            "va_window_bytes",
            ConfigProblem::NotInRange {
                value: 5 << 30,
                min: 1 << 20,
                max: 4 << 30,
                unit: Unit::Bytes,
                note: "",
            },
        );
        let m = e.to_string();
        assert!(
            m.contains("5368709120 bytes (5.0 GiB) is not in 1048576 bytes (1.0 MiB)..="),
            "{m}"
        );
        let e = Error::Library {
            library: "libx.so".into(),
            problem: LibraryProblem::MissingSymbol {
                symbol: "rpcmem_alloc",
            },
        };
        assert_eq!(
            e.to_string(),
            "FastRPC library `libx.so`: missing symbol `rpcmem_alloc`"
        );
    }

    #[test]
    fn statuses_have_names() {
        assert_eq!(KernelStatus(3).to_string(), "OUT_OF_BUDGET (3)");
        assert_eq!(KernelStatus(99).name(), "unknown status");
        assert_eq!(fmt_bytes(512), "512 B");
        assert_eq!(fmt_bytes(3 << 30), "3.0 GiB");
    }
}
