//! Lifetimed tensor views over device memory, and their data-free layouts.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaView, CudaViewMut, DeviceSlice};

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
}

impl<'a, T, const N: usize> TensorMut<'a, T, N> {
    /// A contiguous row-major view of `data` with `shape`.
    pub fn new(data: CudaViewMut<'a, T>, shape: [i32; N]) -> Self {
        Self { data, shape, stride: row_major_strides(shape) }
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

/// Device memory a plan may use as scratch.
#[derive(Debug, Default)]
pub enum Workspace<'a> {
    /// No workspace: valid only when `workspace_size()` is 0.
    #[default]
    None,
    /// Caller-owned bytes; the plan uses the first `workspace_size()` of them.
    Borrowed(CudaViewMut<'a, u8>),
}

impl Workspace<'_> {
    /// Bytes available.
    pub fn len(&self) -> usize {
        match self {
            Workspace::None => 0,
            Workspace::Borrowed(v) => v.len(),
        }
    }
    /// True when no bytes are available.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The CUDA context the workspace was allocated in (`None` without a workspace).
    pub fn context(&self) -> Option<&Arc<CudaContext>> {
        match self {
            Workspace::None => None,
            Workspace::Borrowed(v) => Some(v.stream().context()),
        }
    }
}
