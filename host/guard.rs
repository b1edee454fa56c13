//! Cheap checks `run` makes before it touches the stream: every operand lives in the launch's
//! CUDA context and stays ordered with the launch stream, a checked run is not being captured
//! into a graph, and no run is captured in a context that tracks events. And, after the launch,
//! the reads it made of operands homed on other streams joined into those streams
//! ([`join_reads`]).

use cudarc::driver::sys::{CUevent_flags, CUstreamCaptureStatus};
use cudarc::driver::{CudaContext, CudaEvent, CudaStream, DevicePtr};

use crate::error::{Error, Result};
use crate::plan::{BatchPagedDecodeArgs, PagedKvAppendArgs, PagedKvAppendPairedArgs};
use crate::tensor::{TensorRef, Workspace};

/// What a stream handle is to the driver's implicit ordering and to cudarc's event tracking.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StreamHandle {
    /// The legacy default stream (`CudaContext::default_stream`): ordered with every blocking
    /// stream of the context, each thread's per-thread stream included.
    Legacy,
    /// The calling thread's default stream (`CudaContext::per_thread_stream`): ordered with the
    /// legacy stream, not with other threads' per-thread streams. The handle names the stream of
    /// whichever thread uses it, so a slice of one is freed on the stream of the thread that
    /// drops it.
    PerThread,
    /// A non-blocking stream (`CudaContext::new_stream`, `CudaStream::fork`, or one an `unsafe`
    /// `wrap_borrowed_stream` wrapped): ordered with other streams by events alone.
    Created,
}

impl StreamHandle {
    pub(crate) fn of(stream: &CudaStream) -> Self {
        // 0 is the default stream, 1 and 2 the driver's `CU_STREAM_LEGACY` / `CU_STREAM_PER_THREAD`.
        match stream.cu_stream() as usize {
            0 | 1 => Self::Legacy,
            2 => Self::PerThread,
            _ => Self::Created,
        }
    }
}

/// Whether a slice allocated on a `home` stream of a context that `manages` stream
/// synchronization stays ordered with a launch on a `launch` stream for as long as it lives.
/// cudarc orders a context's streams with events only while the context holds a stream it
/// created: dropping the last one turns the ordering off, for work already enqueued too, and a
/// slice keeps alive only its own stream. So the slice stays ordered when its own stream is a
/// created one, which keeps the ordering on (a wrapped stream does not: its operands are the
/// `unsafe` wrapper's caller's to order), or when the launch is on the legacy stream, which the
/// driver orders with every default stream the slice can later be used or freed on. A slice of
/// a default stream launched on a created stream is not, nor one launched on a per-thread
/// stream, which another thread's per-thread stream does not wait for: once the context's
/// created streams are dropped, using the slice or freeing it there no longer waits for the
/// launch.
pub(crate) fn stays_ordered(manages: bool, home: StreamHandle, launch: StreamHandle) -> bool {
    !manages || home == StreamHandle::Created || launch == StreamHandle::Legacy
}

/// [`Error::WrongDevice`] unless `found` is the driver context of `expected`.
fn same_driver_context(expected: &CudaContext, operand: &'static str, found: &CudaContext) -> Result<()> {
    if std::ptr::eq(expected, found) || expected.cu_ctx() == found.cu_ctx() {
        return Ok(());
    }
    Err(Error::WrongDevice { operand, expected: expected.ordinal(), found: found.ordinal() })
}

/// An operand allocated on `home` of a launch on `launch`: of the same driver context
/// ([`Error::WrongDevice`]); ordered with the launch by cudarc's event tracking
/// ([`Error::UnorderedContext`]); and still ordered after the launch ([`Error::UnorderedStream`],
/// [`stays_ordered`]). cudarc makes a launch wait for a slice's last write, and the slice's drop
/// wait for the launch, only when the slice's `CudaContext` object manages stream
/// synchronization, and it records the launch only when the stream's object does (when the
/// launch's guards drop, after this check). So the operand's object is the stream's, or neither
/// manages, or both do and the launch stream is a created one: `run` holds it until the launch
/// is recorded, which keeps its object managing (another thread dropping that object's last
/// created stream could otherwise turn the recording off between this check and the launch).
pub(crate) fn ordered_operand(launch: &CudaStream, operand: &'static str, home: &CudaStream) -> Result<()> {
    let (stream_ctx, found) = (launch.context(), home.context());
    same_driver_context(stream_ctx, operand, found)?;
    let manages = found.is_managing_stream_synchronization();
    if !std::ptr::eq(&**stream_ctx, &**found)
        && (stream_ctx.is_managing_stream_synchronization() != manages
            || manages && StreamHandle::of(launch) != StreamHandle::Created)
    {
        return Err(Error::UnorderedContext { operand });
    }
    if !stays_ordered(manages, StreamHandle::of(home), StreamHandle::of(launch)) {
        return Err(Error::UnorderedStream { operand });
    }
    Ok(())
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
    /// The workspace (if any) is an operand of a launch on `stream` ([`ordered_operand`]).
    pub(crate) fn check_context(&self, stream: &CudaStream) -> Result<()> {
        match self.home_stream() {
            Some(home) => ordered_operand(stream, "workspace", home),
            None => Ok(()),
        }
    }
}

/// `stream` lives in `plan_ctx`, and every operand (name, the stream it was allocated on) is an
/// operand of a launch on it ([`ordered_operand`]); the error names the first that is not.
fn launch_operands(
    plan_ctx: &CudaContext,
    stream: &CudaStream,
    operands: &[(&'static str, &CudaStream)],
) -> Result<()> {
    stream_in_plan_context(plan_ctx, stream)?;
    operands.iter().try_for_each(|&(operand, home)| ordered_operand(stream, operand, home))
}

/// A tensor a launch reads: the stream it was allocated on, and its read record.
pub(crate) trait ReadOperand {
    /// The stream the tensor's allocation was made on, where cudarc frees it.
    fn home(&self) -> &CudaStream;
    /// Records the allocation's read event on `stream` (cudarc's `device_ptr` guard, dropped at
    /// once), after `stream` waits for the allocation's last write.
    fn record_read_on(&self, stream: &CudaStream);
}

impl<T, const N: usize> ReadOperand for TensorRef<'_, T, N> {
    fn home(&self) -> &CudaStream {
        self.home_stream()
    }
    fn record_read_on(&self, stream: &CudaStream) {
        drop(self.data.device_ptr(stream));
    }
}

/// After a launch on `stream` that read `reads`: each read operand allocated on another stream
/// of a context that tracks events has that home stream wait for the launch, and records its
/// read there.
///
/// cudarc keeps one read event per allocation, shared by all its views, and records it on the
/// stream of the latest read: a read on a second stream replaces the record of a read still
/// running on a first, and the allocation's drop (on its home stream) or a write on a third
/// stream then waits for the second read only. Joined into the home stream, every read this
/// crate makes stays behind the record: the home stream waits for it, and the record, made on
/// the home stream after that wait, covers it, whichever stream this crate reads it on next. (A
/// read through cudarc's own API on a third stream moves the record there again, as cudarc
/// does for any two readers; that ordering is cudarc's and its caller's.) The cost is that
/// work enqueued on the home stream later waits for the launch; a launch on the operands' own
/// stream (the usual case) costs nothing, and a context without event tracking
/// ([`Device::open_untracked`](crate::Device::open_untracked)) leaves this ordering to its caller.
pub(crate) fn join_reads<'r>(
    stream: &CudaStream,
    reads: impl IntoIterator<Item = &'r dyn ReadOperand>,
) -> Result<()> {
    let mut launched: Option<CudaEvent> = None;
    for read in reads {
        let home = read.home();
        if home.cu_stream() == stream.cu_stream() || !home.context().is_managing_stream_synchronization() {
            continue;
        }
        let event = match &mut launched {
            Some(event) => event,
            None => launched.insert(stream.record_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))?),
        };
        home.wait(event)?;
        read.record_read_on(home);
    }
    Ok(())
}

impl<T, C> BatchPagedDecodeArgs<'_, T, C> {
    /// After a launch on `stream`: [`join_reads`] of every tensor the decode reads.
    pub(crate) fn join_reads(
        &self,
        stream: &CudaStream,
        sinks: Option<&TensorRef<'_, f32, 1>>,
    ) -> Result<()> {
        let reads: [&dyn ReadOperand; 6] =
            [&self.q, &self.k_data, &self.v_data, &self.indices, &self.indptr, &self.last_page_len];
        join_reads(stream, reads.into_iter().chain(sinks.map(|s| s as &dyn ReadOperand)))
    }

    /// [`launch_operands`] of every tensor.
    pub(crate) fn check_launch_context(&self, plan_ctx: &CudaContext, stream: &CudaStream) -> Result<()> {
        let operands = [
            ("q", self.q.home_stream()),
            ("k_data", self.k_data.home_stream()),
            ("v_data", self.v_data.home_stream()),
            ("indices", self.indices.home_stream()),
            ("indptr", self.indptr.home_stream()),
            ("last_page_len", self.last_page_len.home_stream()),
            ("o", self.o.home_stream()),
            ("lse", self.lse.home_stream()),
        ];
        launch_operands(plan_ctx, stream, &operands)
    }
}

impl<T, C> PagedKvAppendArgs<'_, T, C> {
    /// After a launch on `stream`: [`join_reads`] of every tensor the append reads.
    pub(crate) fn join_reads(&self, stream: &CudaStream) -> Result<()> {
        let reads: [&dyn ReadOperand; 5] =
            [&self.key, &self.value, &self.indices, &self.indptr, &self.last_page_len];
        join_reads(stream, reads)
    }

    /// [`launch_operands`] of every tensor.
    pub(crate) fn check_launch_context(&self, plan_ctx: &CudaContext, stream: &CudaStream) -> Result<()> {
        let operands = [
            ("key", self.key.home_stream()),
            ("value", self.value.home_stream()),
            ("k_data", self.k_data.home_stream()),
            ("v_data", self.v_data.home_stream()),
            ("indices", self.indices.home_stream()),
            ("indptr", self.indptr.home_stream()),
            ("last_page_len", self.last_page_len.home_stream()),
        ];
        launch_operands(plan_ctx, stream, &operands)
    }
}

impl<T, C> PagedKvAppendPairedArgs<'_, T, C> {
    /// After a launch on `stream`: [`join_reads`] of every tensor the append reads.
    pub(crate) fn join_reads(&self, stream: &CudaStream) -> Result<()> {
        let reads: [&dyn ReadOperand; 5] =
            [&self.key, &self.value, &self.indices, &self.indptr, &self.last_page_len];
        join_reads(stream, reads)
    }

    /// [`launch_operands`] of every tensor.
    pub(crate) fn check_launch_context(&self, plan_ctx: &CudaContext, stream: &CudaStream) -> Result<()> {
        let operands = [
            ("key", self.key.home_stream()),
            ("value", self.value.home_stream()),
            ("kv_data", self.kv_data.home_stream()),
            ("indices", self.indices.home_stream()),
            ("indptr", self.indptr.home_stream()),
            ("last_page_len", self.last_page_len.home_stream()),
        ];
        launch_operands(plan_ctx, stream, &operands)
    }
}

#[cfg(test)]
mod tests {
    use super::StreamHandle::{Created, Legacy, PerThread};
    use super::stays_ordered;

    /// In a context that orders streams with events, a slice of a default stream stays ordered
    /// only when launched on the legacy stream; a context that does not is ordered by its streams
    /// alone (the caller's to order across threads and, untracked, across streams).
    #[test]
    fn a_default_stream_slice_stays_ordered_on_the_legacy_stream_alone() {
        for home in [Legacy, PerThread, Created] {
            for launch in [Legacy, PerThread, Created] {
                assert!(stays_ordered(false, home, launch), "{home:?} on {launch:?} without tracking");
                let lost = home != Created && launch != Legacy;
                assert_eq!(stays_ordered(true, home, launch), !lost, "{home:?} on {launch:?}");
            }
        }
    }
}
