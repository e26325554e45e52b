//! What went wrong in the DSP transport ([`TransportFault`]), in a configuration value
//! ([`ConfigProblem`]) and in loading the FastRPC library ([`LibraryProblem`]).

use std::fmt;

use super::input::one_of;
use super::{fmt_bytes, KernelStatus};

/// A DSP queue or session failure (the payload of [`crate::Error::Transport`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportFault {
    /// The queue stopped before it ran a job it had accepted.
    #[error("the DSP queue stopped before running the job")]
    QueueStopped,
    /// The queue's thread died while it started.
    #[error("the DSP queue thread died during start-up")]
    QueueDiedAtStart,
    /// A job was submitted after the queue shut down.
    #[error("the DSP queue is shut down")]
    QueueShutDown,
    /// The queue's thread is gone.
    #[error("the DSP queue thread is gone")]
    QueueThreadGone,
    /// A weight referenced by a batch was never prepared by the memory runtime.
    #[error("weight {weight} was not prepared")]
    WeightNotPrepared {
        /// The weight's index.
        weight: usize,
    },
    /// A weight the memory plan gives no place in a stage that reads it.
    #[error("weight `{weight}` has no place in stage {stage} of the plan")]
    WeightUnplaced {
        /// The weight's name.
        weight: String,
        /// The stage.
        stage: usize,
    },
    /// The emulated DSP's context could not be allocated.
    #[error("cannot allocate {bytes} bytes for the DSP context")]
    ContextAlloc {
        /// Bytes asked for.
        bytes: usize,
    },
    /// A buffer attached to the emulated DSP outside a reserved window.
    #[error(
        "the emulated DSP needs buffers mapped into a reserved window (buffer {buffer} is not)"
    )]
    NotInWindow {
        /// The buffer id.
        buffer: u32,
    },
    /// The DSP rejected a batch's header.
    #[error("the DSP rejected the batch header: {status}")]
    BatchHeader {
        /// The status of the header.
        status: KernelStatus,
    },
    /// `rpcmem_alloc` returned NULL.
    #[error("rpcmem_alloc of {bytes} bytes failed")]
    RpcmemAlloc {
        /// Bytes asked for.
        bytes: usize,
    },
    /// A batch returned another number of statuses than it has ops.
    #[error("{statuses} statuses for a batch of {ops} ops")]
    StatusCount {
        /// Statuses returned.
        statuses: usize,
        /// Ops of the batch.
        ops: usize,
    },
}

/// The unit of a configuration value, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// A plain count.
    Count,
    /// Bytes (shown with a human unit too).
    Bytes,
    /// Mebibytes.
    MiB,
}

impl Unit {
    /// `v` in this unit.
    pub fn show(self, v: u64) -> String {
        match self {
            Unit::Count => v.to_string(),
            Unit::Bytes => format!("{v} bytes ({})", fmt_bytes(v)),
            Unit::MiB => format!("{v} MiB"),
        }
    }
}

/// The configuration names the `Unknown` problem lists.
struct Names(&'static [&'static str]);

impl fmt::Display for Names {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&one_of(self.0))
    }
}

/// What is wrong with a configuration value (the `problem` of [`crate::Error::Config`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigProblem {
    /// A name that is none of the accepted ones.
    #[error("unknown `{value}` (expected {})", Names(.expected))]
    Unknown {
        /// The name given.
        value: String,
        /// The accepted names.
        expected: &'static [&'static str],
    },
    /// The `shim` FastRPC library in a build without the host shim.
    #[error("`shim`: this build has no host FastRPC shim")]
    NoShim,
    /// The `fastrpc` transport in a build without the `fastrpc` feature.
    #[error("this build of candle-hexagon has no `fastrpc` feature")]
    NoFastRpc,
    /// A value outside its range.
    #[error("{} is not in {}..={}{note}", .unit.show(*.value), .unit.show(*.min), .unit.show(*.max))]
    NotInRange {
        /// The value.
        value: u64,
        /// Smallest accepted.
        min: u64,
        /// Largest accepted.
        max: u64,
        /// Its unit.
        unit: Unit,
        /// Why the range (` (the DSP has a 32-bit address space)`), or empty.
        note: &'static str,
    },
    /// A value below its minimum.
    #[error("{} is below {}{note}", .unit.show(*.value), .unit.show(*.min))]
    Below {
        /// The value.
        value: u64,
        /// Smallest accepted.
        min: u64,
        /// Its unit.
        unit: Unit,
        /// Why the minimum (` (two pages)`), or empty.
        note: &'static str,
    },
    /// A DSP scratch arena too small for its workers.
    #[error("{bytes} bytes is below the {min} bytes {workers} workers need")]
    ScratchForWorkers {
        /// The scratch size.
        bytes: u64,
        /// The minimum for `workers`.
        min: u64,
        /// Workers.
        workers: usize,
    },
    /// A size that cannot be allocated with the alignment it needs.
    #[error("{bytes} bytes cannot be allocated with {align}-byte alignment")]
    Unallocatable {
        /// Bytes.
        bytes: usize,
        /// Alignment.
        align: usize,
    },
    /// Worker and buffer counts the DSP kernels reject.
    #[error("kernels-dsp rejects {workers} workers / {buffers} buffers")]
    KernelsReject {
        /// Workers.
        workers: usize,
        /// Buffers.
        buffers: usize,
    },
    /// A window larger than the host's address space.
    #[error("{bytes} bytes do not fit the host address space")]
    HostAddressSpace {
        /// The window's size.
        bytes: u64,
    },
}

/// Why the FastRPC library cannot be used (the `problem` of [`crate::Error::Library`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LibraryProblem {
    /// The path contains a NUL byte.
    #[error("the name contains a NUL byte")]
    NulInName,
    /// `dlopen` failed.
    #[error("cannot be loaded: {system_message}")]
    Dlopen {
        /// `dlerror()`'s message.
        system_message: String,
    },
    /// A symbol the backend calls is missing.
    #[error("missing symbol `{symbol}`")]
    MissingSymbol {
        /// The symbol.
        symbol: &'static str,
    },
}
