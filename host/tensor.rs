//! Lifetimed tensor views over device memory, and their data-free layouts.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, CudaView, CudaViewMut, DevicePtrMut, DeviceSlice, SyncOnDrop};

/// Shape and strides of a tensor plus the number of elements its storage holds.
///
/// Validation works on layouts, so it runs (and is tested) without a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorLayout<const N: usize> {
    /// Extent of each dimension.
    pub shape: [i32; N],
    /// Strides in elements; 0 means broadcast.
    pub stride: [i64; N],
    /// Elements available in the underlying storage.
    pub storage_len: usize,
}

impl<const N: usize> TensorLayout<N> {
    /// A contiguous row-major layout of `shape` over exactly enough storage.
    pub fn contiguous(shape: [i32; N]) -> Self {
        let stride = row_major_strides(shape);
        let storage_len = shape.iter().fold(1usize, |acc, &d| acc.saturating_mul(d.max(0) as usize));
        Self { shape, stride, storage_len }
    }

    /// Number of elements (0 if any extent is non-positive).
    pub fn numel(&self) -> usize {
        numel(self.shape)
    }

    /// Row-major with no gaps; a zero stride (broadcast) is not contiguous.
    pub fn is_contiguous(&self) -> bool {
        is_contiguous(self.shape, self.stride)
    }
}

/// Read-only device tensor view.
#[derive(Debug)]
pub struct TensorRef<'a, T, const N: usize> {
    /// The device memory viewed.
    pub data: CudaView<'a, T>,
    /// Extent of each dimension.
    pub shape: [i32; N],
    /// Strides in elements; 0 means broadcast.
    pub stride: [i64; N],
}

/// Mutable device tensor view.
#[derive(Debug)]
pub struct TensorMut<'a, T, const N: usize> {
    /// The device memory viewed.
    pub data: CudaViewMut<'a, T>,
    /// Extent of each dimension.
    pub shape: [i32; N],
    /// Strides in elements; 0 means broadcast.
    pub stride: [i64; N],
}

impl<'a, T, const N: usize> TensorRef<'a, T, N> {
    /// A contiguous row-major view of `data` with `shape`.
    pub fn new(data: CudaView<'a, T>, shape: [i32; N]) -> Self {
        Self { data, shape, stride: row_major_strides(shape) }
    }
    /// A view of `data` with `shape` and element strides `stride` (the K/V stores of the plans
    /// take any page, head and token strides; see [`crate::KvLayout`]).
    pub fn strided(data: CudaView<'a, T>, shape: [i32; N], stride: [i64; N]) -> Self {
        Self { data, shape, stride }
    }
    /// Number of elements (0 if any extent is non-positive).
    pub fn numel(&self) -> usize {
        numel(self.shape)
    }
    /// Row-major with no gaps; a zero stride (broadcast) is not contiguous.
    pub fn is_contiguous(&self) -> bool {
        is_contiguous(self.shape, self.stride)
    }
    /// Shape, strides and storage length of this view, without the data.
    pub fn layout(&self) -> TensorLayout<N> {
        TensorLayout { shape: self.shape, stride: self.stride, storage_len: self.data.len() }
    }
    /// The CUDA context the viewed memory was allocated in.
    pub fn context(&self) -> &Arc<CudaContext> {
        self.data.stream().context()
    }
    /// The stream the viewed memory was allocated on (and is freed on).
    pub(crate) fn home_stream(&self) -> &CudaStream {
        self.data.stream()
    }
}

impl<'a, T, const N: usize> TensorMut<'a, T, N> {
    /// A contiguous row-major view of `data` with `shape`.
    pub fn new(data: CudaViewMut<'a, T>, shape: [i32; N]) -> Self {
        Self { data, shape, stride: row_major_strides(shape) }
    }
    /// A view of `data` with `shape` and element strides `stride`.
    pub fn strided(data: CudaViewMut<'a, T>, shape: [i32; N], stride: [i64; N]) -> Self {
        Self { data, shape, stride }
    }
    /// Number of elements (0 if any extent is non-positive).
    pub fn numel(&self) -> usize {
        numel(self.shape)
    }
    /// Row-major with no gaps; a zero stride (broadcast) is not contiguous.
    pub fn is_contiguous(&self) -> bool {
        is_contiguous(self.shape, self.stride)
    }
    /// Shape, strides and storage length of this view, without the data.
    pub fn layout(&self) -> TensorLayout<N> {
        TensorLayout { shape: self.shape, stride: self.stride, storage_len: self.data.len() }
    }
    /// The CUDA context the viewed memory was allocated in.
    pub fn context(&self) -> &Arc<CudaContext> {
        self.data.stream().context()
    }
    /// The stream the viewed memory was allocated on (and is freed on).
    pub(crate) fn home_stream(&self) -> &CudaStream {
        self.data.stream()
    }
}

/// Row-major strides of `shape`, in elements.
pub fn row_major_strides<const N: usize>(shape: [i32; N]) -> [i64; N] {
    let mut stride = [0i64; N];
    let mut acc = 1i64;
    for i in (0..N).rev() {
        stride[i] = acc;
        acc = acc.saturating_mul(shape[i].max(0) as i64);
    }
    stride
}

fn numel<const N: usize>(shape: [i32; N]) -> usize {
    if shape.iter().any(|&d| d <= 0) {
        return 0;
    }
    shape.iter().fold(1usize, |acc, &d| acc.saturating_mul(d as usize))
}

fn is_contiguous<const N: usize>(shape: [i32; N], stride: [i64; N]) -> bool {
    stride == row_major_strides(shape) && stride.iter().all(|&s| s > 0)
}

/// Device memory a plan may use as scratch: the split-KV partials and the split state.
///
/// A decode plan that splits requests keeps its split state (arrival counters) at the start of
/// the workspace. The counters must be zero before a plan's first launch, and every launch
/// leaves them zero again, so a workspace is made zero once ([`Workspace::zeroed`]) and can
/// then be reused by every launch, eager or replayed from a CUDA graph. The workspace remembers
/// the size of the split state the first splitting plan used it with, and a plan with a
/// different split state refuses it ([`crate::Error::WorkspaceInUse`]) rather than read another
/// plan's partials as counters: give each configuration its own workspace, or zero it again.
#[derive(Debug, Default)]
pub struct Workspace<'a> {
    bytes: Option<CudaViewMut<'a, u8>>,
    /// Bytes of split state the workspace is bound to (set by the first splitting launch).
    split_state_bytes: Option<usize>,
}

impl<'a> Workspace<'a> {
    /// No workspace: valid only for plans whose `workspace_size()` is 0.
    pub fn none() -> Self {
        Self::default()
    }

    /// Zeroes `bytes` on `stream` (stream-ordered, no synchronization) and returns them as a
    /// workspace. The bytes are an operand of `stream` as a launch's are: of its driver context,
    /// and ordered with it by cudarc's event tracking ([`crate::Error::WrongDevice`],
    /// [`crate::Error::UnorderedContext`], [`crate::Error::UnorderedStream`]); and, as a run,
    /// refused on a stream that is capturing
    /// in a context that tracks events ([`crate::Error::CaptureWithTracking`]: a captured zeroing
    /// would run again at each replay, into bytes nothing keeps alive).
    pub fn zeroed(stream: &Arc<CudaStream>, mut bytes: CudaViewMut<'a, u8>) -> crate::Result<Self> {
        crate::guard::ordered_operand(stream, "workspace", bytes.stream())?;
        crate::guard::refuse_tracked_capture(stream)?;
        stream.memset_zeros(&mut bytes)?;
        Ok(Self { bytes: Some(bytes), split_state_bytes: None })
    }

    /// `bytes` as a workspace, without zeroing them.
    ///
    /// # Safety
    /// The bytes must be zero when the first launch that uses them runs (for example a fresh
    /// `alloc_zeros` allocation, or memory last used as a workspace by plans with the same
    /// configuration, whose launches all completed). Otherwise split requests may be merged
    /// from partials that are not written yet, or never, and a launch may never finish.
    pub unsafe fn assume_zeroed(bytes: CudaViewMut<'a, u8>) -> Self {
        Self { bytes: Some(bytes), split_state_bytes: None }
    }

    /// Bytes available.
    pub fn len(&self) -> usize {
        self.bytes.as_ref().map_or(0, |b| b.len())
    }

    /// True when no bytes are available.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The device address of the bytes for a splitting launch on `stream` (the guard records
    /// that launch's use of them once it is enqueued), after checking that they start 16-byte
    /// aligned and are unbound or bound to a split state of `state_bytes`. The launch binds them
    /// once enqueued ([`Self::bind_split_state`]), so a refused one leaves them as they were.
    /// `(0, None)` without bytes.
    pub(crate) fn split_state_ptr<'s>(
        &'s mut self,
        stream: &'s CudaStream,
        state_bytes: usize,
    ) -> crate::Result<(u64, Option<SyncOnDrop<'s>>)> {
        if let Some(bound) = self.split_state_bytes.filter(|&bound| bound != state_bytes) {
            return Err(crate::Error::WorkspaceInUse { bound, requested: state_bytes });
        }
        let Some(bytes) = self.bytes.as_mut() else { return Ok((0, None)) };
        let (base, guard) = bytes.device_ptr_mut(stream);
        crate::plan::checks::aligned("workspace", base, 16)?;
        Ok((base, Some(guard)))
    }

    /// Binds the bytes to a split state of `state_bytes`, once a splitting launch that
    /// [`Self::split_state_ptr`] admitted is enqueued: its counters live at that layout's
    /// offsets until the bytes are zeroed again.
    pub(crate) fn bind_split_state(&mut self, state_bytes: usize) {
        if self.bytes.is_some() {
            self.split_state_bytes = Some(state_bytes);
        }
    }

    /// The CUDA context the workspace was allocated in (`None` without a workspace).
    pub fn context(&self) -> Option<&Arc<CudaContext>> {
        self.home_stream().map(|s| s.context())
    }

    /// The stream the workspace was allocated on (`None` without a workspace).
    pub(crate) fn home_stream(&self) -> Option<&CudaStream> {
        self.bytes.as_ref().map(|v| &**v.stream())
    }
}
