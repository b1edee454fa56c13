//! Cheap checks `run` makes before it touches the stream: every operand lives in the launch's
//! CUDA context and is ordered with the launch stream by cudarc's event tracking, a checked run
//! is not being captured into a graph, and no run is captured in a context that tracks events.

use cudarc::driver::sys::CUstreamCaptureStatus;
use cudarc::driver::{CudaContext, CudaStream};

use crate::error::{Error, Result};
use crate::plan::{BatchPagedDecodeArgs, PagedKvAppendArgs, PagedKvAppendPairedArgs};
use crate::tensor::Workspace;

/// [`Error::WrongDevice`] unless `found` is the driver context of `expected`.
fn same_driver_context(expected: &CudaContext, operand: &'static str, found: &CudaContext) -> Result<()> {
    if std::ptr::eq(expected, found) || expected.cu_ctx() == found.cu_ctx() {
        return Ok(());
    }
    Err(Error::WrongDevice { operand, expected: expected.ordinal(), found: found.ordinal() })
}

/// An operand (`found`, the context of its memory) of a launch on a stream of `stream_ctx`: of
/// the same driver context ([`Error::WrongDevice`]), and ordered with the launch by cudarc's
/// event tracking ([`Error::UnorderedContext`]). cudarc makes a launch wait for a slice's last
/// write, and the slice's drop wait for the launch, only when the slice's `CudaContext` object
/// manages stream synchronization, and it records the launch only when the stream's object
/// does: so the operand's object is the stream's, or another that manages synchronization
/// exactly when the stream's does.
pub(crate) fn same_context(
    stream_ctx: &CudaContext,
    operand: &'static str,
    found: &CudaContext,
) -> Result<()> {
    same_driver_context(stream_ctx, operand, found)?;
    if std::ptr::eq(stream_ctx, found)
        || stream_ctx.is_managing_stream_synchronization() == found.is_managing_stream_synchronization()
    {
        return Ok(());
    }
    Err(Error::UnorderedContext { operand })
}

/// The launch stream belongs to `plan_ctx`, the context the plan loaded its kernels into.
fn stream_in_plan_context(plan_ctx: &CudaContext, stream: &CudaStream) -> Result<()> {
    same_driver_context(plan_ctx, "stream", stream.context())
}

/// [`Error::CheckedUnderCapture`] while `stream` is capturing (or its capture was invalidated
/// and not yet ended): checked mode waits for the device, which capture cannot.
pub(crate) fn refuse_capture(stream: &CudaStream) -> Result<()> {
    match stream.capture_status()? {
        CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => Ok(()),
        _ => Err(Error::CheckedUnderCapture),
    }
}

/// [`Error::CaptureWithTracking`] while `stream` is capturing in a context that tracks events: a
/// graph replays raw addresses no borrow keeps alive, so capture needs a context whose tracking
/// an `unsafe` call turned off, whose caller takes on the graph's rules
/// ([`Device::open_untracked`](crate::Device::open_untracked)). One driver query per call in a
/// tracking context, none in another.
pub(crate) fn refuse_tracked_capture(stream: &CudaStream) -> Result<()> {
    if !stream.context().is_event_tracking() {
        return Ok(());
    }
    match stream.capture_status()? {
        CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => Ok(()),
        _ => Err(Error::CaptureWithTracking),
    }
}

impl Workspace<'_> {
    /// The workspace (if any) is an operand of a launch in `ctx` ([`same_context`]).
    pub(crate) fn check_context(&self, ctx: &CudaContext) -> Result<()> {
        match self.context() {
            Some(c) => same_context(ctx, "workspace", c),
            None => Ok(()),
        }
    }
}

impl<T, C> BatchPagedDecodeArgs<'_, T, C> {
    /// Every tensor is an operand of a launch in `ctx` ([`same_context`]); the error names the
    /// first that is not.
    pub(crate) fn check_context(&self, ctx: &CudaContext) -> Result<()> {
        same_context(ctx, "q", self.q.context())?;
        same_context(ctx, "k_data", self.k_data.context())?;
        same_context(ctx, "v_data", self.v_data.context())?;
        same_context(ctx, "indices", self.indices.context())?;
        same_context(ctx, "indptr", self.indptr.context())?;
        same_context(ctx, "last_page_len", self.last_page_len.context())?;
        same_context(ctx, "o", self.o.context())?;
        same_context(ctx, "lse", self.lse.context())
    }

    /// `stream` lives in `plan_ctx`, and every tensor is an operand of a launch on it.
    pub(crate) fn check_launch_context(&self, plan_ctx: &CudaContext, stream: &CudaStream) -> Result<()> {
        stream_in_plan_context(plan_ctx, stream)?;
        self.check_context(stream.context())
    }
}

impl<T, C> PagedKvAppendArgs<'_, T, C> {
    /// Every tensor is an operand of a launch in `ctx` ([`same_context`]); the error names the
    /// first that is not.
    pub(crate) fn check_context(&self, ctx: &CudaContext) -> Result<()> {
        same_context(ctx, "key", self.key.context())?;
        same_context(ctx, "value", self.value.context())?;
        same_context(ctx, "k_data", self.k_data.context())?;
        same_context(ctx, "v_data", self.v_data.context())?;
        same_context(ctx, "indices", self.indices.context())?;
        same_context(ctx, "indptr", self.indptr.context())?;
        same_context(ctx, "last_page_len", self.last_page_len.context())
    }

    /// `stream` lives in `plan_ctx`, and every tensor is an operand of a launch on it.
    pub(crate) fn check_launch_context(&self, plan_ctx: &CudaContext, stream: &CudaStream) -> Result<()> {
        stream_in_plan_context(plan_ctx, stream)?;
        self.check_context(stream.context())
    }
}

impl<T, C> PagedKvAppendPairedArgs<'_, T, C> {
    /// `stream` lives in `plan_ctx`, and every tensor is an operand of a launch on it
    /// ([`same_context`]; the error names the first that is not).
    pub(crate) fn check_launch_context(&self, plan_ctx: &CudaContext, stream: &CudaStream) -> Result<()> {
        stream_in_plan_context(plan_ctx, stream)?;
        let ctx = stream.context();
        same_context(ctx, "key", self.key.context())?;
        same_context(ctx, "value", self.value.context())?;
        same_context(ctx, "kv_data", self.kv_data.context())?;
        same_context(ctx, "indices", self.indices.context())?;
        same_context(ctx, "indptr", self.indptr.context())?;
        same_context(ctx, "last_page_len", self.last_page_len.context())
    }
}
