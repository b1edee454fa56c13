//! Cheap checks `run` makes before it touches the stream: every operand lives in the launch's
//! CUDA context, and a checked run is not being captured into a graph.

use cudarc::driver::sys::CUstreamCaptureStatus;
use cudarc::driver::{CudaContext, CudaStream};

use crate::error::{Error, Result};
use crate::plan::{BatchPagedDecodeArgs, PagedKvAppendArgs, PagedKvAppendPairedArgs};
use crate::tensor::Workspace;

/// [`Error::WrongDevice`] unless `found` is the context `expected` (same driver context).
pub(crate) fn same_context(expected: &CudaContext, operand: &'static str, found: &CudaContext) -> Result<()> {
    if std::ptr::eq(expected, found) || expected.cu_ctx() == found.cu_ctx() {
        return Ok(());
    }
    Err(Error::WrongDevice { operand, expected: expected.ordinal(), found: found.ordinal() })
}

/// The launch stream belongs to `plan_ctx`, the context the plan loaded its kernels into.
fn stream_in_plan_context(plan_ctx: &CudaContext, stream: &CudaStream) -> Result<()> {
    same_context(plan_ctx, "stream", stream.context())
}

/// [`Error::CheckedUnderCapture`] while `stream` is capturing (or its capture was invalidated
/// and not yet ended): checked mode waits for the device, which capture cannot.
pub(crate) fn refuse_capture(stream: &CudaStream) -> Result<()> {
    match stream.capture_status()? {
        CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => Ok(()),
        _ => Err(Error::CheckedUnderCapture),
    }
}

impl Workspace<'_> {
    /// [`Error::WrongDevice`] unless the workspace (if any) lives in `ctx`.
    pub(crate) fn check_context(&self, ctx: &CudaContext) -> Result<()> {
        match self.context() {
            Some(c) => same_context(ctx, "workspace", c),
            None => Ok(()),
        }
    }
}

impl<T, C> BatchPagedDecodeArgs<'_, T, C> {
    /// [`Error::WrongDevice`] naming the first tensor that does not live in `ctx`.
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

    /// `stream` and every tensor live in `plan_ctx`.
    pub(crate) fn check_launch_context(&self, plan_ctx: &CudaContext, stream: &CudaStream) -> Result<()> {
        stream_in_plan_context(plan_ctx, stream)?;
        self.check_context(plan_ctx)
    }
}

impl<T, C> PagedKvAppendArgs<'_, T, C> {
    /// [`Error::WrongDevice`] naming the first tensor that does not live in `ctx`.
    pub(crate) fn check_context(&self, ctx: &CudaContext) -> Result<()> {
        same_context(ctx, "key", self.key.context())?;
        same_context(ctx, "value", self.value.context())?;
        same_context(ctx, "k_data", self.k_data.context())?;
        same_context(ctx, "v_data", self.v_data.context())?;
        same_context(ctx, "indices", self.indices.context())?;
        same_context(ctx, "indptr", self.indptr.context())?;
        same_context(ctx, "last_page_len", self.last_page_len.context())
    }

    /// `stream` and every tensor live in `plan_ctx`.
    pub(crate) fn check_launch_context(&self, plan_ctx: &CudaContext, stream: &CudaStream) -> Result<()> {
        stream_in_plan_context(plan_ctx, stream)?;
        self.check_context(plan_ctx)
    }
}

impl<T, C> PagedKvAppendPairedArgs<'_, T, C> {
    /// `stream` and every tensor live in `plan_ctx` ([`Error::WrongDevice`] naming the first
    /// that does not).
    pub(crate) fn check_launch_context(&self, plan_ctx: &CudaContext, stream: &CudaStream) -> Result<()> {
        stream_in_plan_context(plan_ctx, stream)?;
        same_context(plan_ctx, "key", self.key.context())?;
        same_context(plan_ctx, "value", self.value.context())?;
        same_context(plan_ctx, "kv_data", self.kv_data.context())?;
        same_context(plan_ctx, "indices", self.indices.context())?;
        same_context(plan_ctx, "indptr", self.indptr.context())?;
        same_context(plan_ctx, "last_page_len", self.last_page_len.context())
    }
}
