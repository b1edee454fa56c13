//! The crate's one error type.

use cudarc::driver::DriverError;

/// Everything a plan, launch or validation can report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The problem is valid but this library has no kernel for it (dtype, head_dim, arch).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The descriptor or the arguments are inconsistent; the message names the failed check.
    #[error("invalid problem: {0}")]
    InvalidProblem(String),
    /// A tensor's device address is not aligned as the kernel needs.
    #[error("misaligned operand `{operand}`: address must be a multiple of {required} bytes")]
    MisalignedOperand {
        /// Name of the misaligned argument.
        operand: &'static str,
        /// Required alignment, in bytes.
        required: usize,
    },
    /// The workspace given to `run` is missing or smaller than `workspace_size()`.
    #[error("workspace too small: needed {needed} bytes, got {got}")]
    WorkspaceTooSmall {
        /// Bytes the plan needs.
        needed: usize,
        /// Bytes the workspace provides.
        got: usize,
    },
    /// The workspace holds the split state of a plan of another configuration.
    #[error(
        "workspace in use: it holds {bound} bytes of split state of another plan, this plan needs {requested}; \
         use a workspace per plan configuration or zero it again with Workspace::zeroed"
    )]
    WorkspaceInUse {
        /// Split-state bytes the workspace is bound to.
        bound: usize,
        /// Split-state bytes this plan uses.
        requested: usize,
    },
    /// The page table (indptr / indices / last_page_len) breaks its contract.
    #[error("invalid page table: {0}")]
    InvalidPageTable(String),
    /// A tensor (or the workspace) lives in another CUDA context than the stream `run` launches
    /// on, or the stream belongs to another context than the one the plan was selected for.
    /// Launching would make the kernel dereference addresses of another device.
    #[error(
        "`{operand}` belongs to the CUDA context of device {found}, but the launch runs in a context \
         of device {expected}"
    )]
    WrongDevice {
        /// Name of the argument (`"stream"` when the stream itself is the plan's mismatch).
        operand: &'static str,
        /// Ordinal of the device the launch runs on.
        expected: usize,
        /// Ordinal of the device the argument belongs to.
        found: usize,
    },
    /// A tensor (or the workspace) lives in the launch's driver context but belongs to another
    /// cudarc `CudaContext` object than the launch stream, one of the two managing stream
    /// synchronization (event tracking with streams of its own) and the other not, or both and
    /// the launch on a default stream of the stream's object (whose last created stream another
    /// thread could drop before the launch is recorded): cudarc would then fail to order the
    /// launch after the tensor's last write, or the tensor's next write and its free after the
    /// launch. Launch on a stream of the tensor's own `CudaContext`.
    #[error(
        "`{operand}` belongs to another cudarc CudaContext object of the launch's device, whose event \
         tracking does not order it with the launch stream (one of the two manages stream \
         synchronization and the other does not, or the launch is on a default stream); launch on a \
         stream of the tensor's own CudaContext"
    )]
    UnorderedContext {
        /// Name of the argument.
        operand: &'static str,
    },
    /// A tensor (or the workspace) allocated on a default stream (`CudaContext::default_stream`
    /// or `per_thread_stream`) of a context that orders streams with events, launched on a
    /// created stream (`new_stream`, `fork`) or a per-thread stream. cudarc orders such a
    /// context's streams only while it holds a stream it created, and the tensor keeps none
    /// alive: once the context's created streams are dropped, the tensor's next use or its free
    /// on a default stream would no longer wait for the launch (a per-thread stream does not wait
    /// for another thread's). Launch on the legacy default stream, which the driver orders with
    /// every default stream, or allocate the tensor on a created stream, which keeps the ordering
    /// on for as long as the tensor lives.
    #[error(
        "`{operand}` was allocated on a default stream of a context that orders streams with events, \
         and the launch is not on the legacy default stream: cudarc stops ordering the two when the \
         context's last created stream is dropped; allocate it on a stream from \
         CudaContext::new_stream, or launch on CudaContext::default_stream"
    )]
    UnorderedStream {
        /// Name of the argument.
        operand: &'static str,
    },
    /// A `run` was called while its stream is being captured into a CUDA graph, in a context
    /// that tracks events (cudarc's default): a graph replays raw device addresses that no
    /// borrow keeps alive, so capture needs a context whose tracking was turned off by an
    /// `unsafe` call: [`Device::open_untracked`](crate::Device::open_untracked), whose contract
    /// covers the graph's buffers, or `CudaContext::disable_event_tracking`, whose caller then
    /// takes on the same graph rules.
    #[error(
        "a run cannot be captured into a CUDA graph in a context with event tracking on: a graph \
         replays raw addresses that nothing keeps alive; capture on a device opened with the unsafe \
         Device::open_untracked (or a context after CudaContext::disable_event_tracking)"
    )]
    CaptureWithTracking,
    /// A checked `run` (or `check_page_table`) was called while its stream is being captured
    /// into a CUDA graph: checking waits for the device's verdict, which capture cannot do.
    #[error(
        "checked mode cannot run while the stream is being captured into a CUDA graph (it synchronizes \
         to read the page-table verdict); validate the page table before capture and capture an \
         unchecked plan"
    )]
    CheckedUnderCapture,
    /// No CUDA driver library could be found on this machine, or the driver sees no GPU.
    #[error("no CUDA device: libcuda is not installed or not loadable, or the driver sees no GPU")]
    NoDevice,
    /// An error returned by the CUDA driver.
    #[error("CUDA driver error: {0}")]
    Driver(#[from] DriverError),
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidProblem(msg.into())
}
