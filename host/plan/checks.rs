//! Host-side validation shared by the plans: descriptors, argument layouts and alignment.

use crate::error::{Error, Result, invalid};
use crate::params;
use crate::tensor::TensorLayout;
use crate::types::{BatchPagedDecodeDescriptor, ElementKind, PagedKvCacheDescriptor};

use super::config::{MAX_SPLITS, SUPPORTED_HEAD_DIMS};

/// The decode descriptor checks that do not depend on the plan's element type: element,
/// extents, grouping, scale and the grid and size limits.
pub(super) fn check_decode_descriptor(desc: &BatchPagedDecodeDescriptor) -> Result<()> {
    let kv = &desc.paged_kv;
    check_paged_kv(kv)?;
    positive("batch_size", desc.batch_size)?;
    positive("num_qo_heads", desc.num_qo_heads)?;
    if desc.num_qo_heads % kv.num_kv_heads != 0 {
        return Err(invalid(format!(
            "num_qo_heads ({}) must be a multiple of num_kv_heads ({})",
            desc.num_qo_heads, kv.num_kv_heads
        )));
    }
    if !desc.sm_scale.is_finite() {
        return Err(invalid(format!("sm_scale must be finite, got {}", desc.sm_scale)));
    }
    let group = desc.num_qo_heads / kv.num_kv_heads;
    let per_cta = params::standard_tiling(kv.head_dim as u32).heads_per_cta as u64;
    let y = kv.num_kv_heads as u64 * (group as u64).div_ceil(per_cta);
    if y > 65535 {
        return Err(Error::Unsupported(format!(
            "num_kv_heads × ceil(group / {per_cta}) = {y} exceeds the grid limit 65535"
        )));
    }
    let rows = desc.batch_size as i64 * desc.num_qo_heads as i64;
    if rows * MAX_SPLITS as i64 > u32::MAX as i64 {
        return Err(Error::Unsupported(format!("batch_size × num_qo_heads = {rows} is too large")));
    }
    Ok(())
}

pub(super) fn check_paged_kv(kv: &PagedKvCacheDescriptor) -> Result<()> {
    positive("page_size", kv.page_size)?;
    positive("num_total_pages", kv.num_total_pages)?;
    positive("num_kv_heads", kv.num_kv_heads)?;
    positive("head_dim", kv.head_dim)?;
    if !SUPPORTED_HEAD_DIMS.contains(&kv.head_dim) {
        return Err(Error::Unsupported(format!(
            "head_dim {} (supported: {SUPPORTED_HEAD_DIMS:?})",
            kv.head_dim
        )));
    }
    if !matches!(
        kv.element,
        ElementKind::F16 | ElementKind::BF16 | ElementKind::F32 | ElementKind::E4M3 | ElementKind::E5M2
    ) {
        return Err(Error::Unsupported(format!("element type {:?}", kv.element)));
    }
    let rows = kv.num_total_pages as u128 * kv.num_kv_heads as u128 * kv.page_size as u128;
    if rows > u32::MAX as u128 {
        return Err(Error::Unsupported(format!(
            "the paged K/V store has {rows} rows (pages × kv_heads × page_size); at most 2^32 - 1 are supported"
        )));
    }
    // The kernels address rows in u32 16-byte units from the view's start.
    let bytes = rows * kv.head_dim as u128 * kv.element.size_bytes() as u128;
    if bytes / 16 > u32::MAX as u128 {
        return Err(Error::Unsupported(format!(
            "the paged K/V store spans {bytes} bytes; at most 2^32 16-byte units (64 GiB) per K or V store are supported"
        )));
    }
    Ok(())
}

pub(super) fn positive(name: &str, v: i32) -> Result<()> {
    if v <= 0 {
        return Err(invalid(format!("{name} must be positive, got {v}")));
    }
    Ok(())
}

pub(super) fn expect_layout<const N: usize>(
    name: &str,
    t: &TensorLayout<N>,
    shape: [i32; N],
    meaning: &str,
) -> Result<()> {
    if t.shape != shape {
        return Err(invalid(format!("{name}: shape {:?} must be {meaning} = {shape:?}", t.shape)));
    }
    if !t.is_contiguous() {
        return Err(invalid(format!(
            "{name}: strides {:?} are not contiguous row-major for shape {:?}",
            t.stride, t.shape
        )));
    }
    if t.storage_len < t.numel() {
        return Err(invalid(format!(
            "{name}: storage holds {} elements, the shape needs {}",
            t.storage_len,
            t.numel()
        )));
    }
    Ok(())
}

pub(crate) fn aligned(name: &'static str, ptr: u64, required: usize) -> Result<()> {
    if !ptr.is_multiple_of(required as u64) {
        return Err(Error::MisalignedOperand { operand: name, required });
    }
    Ok(())
}

/// Strides of a validated K/V view, in 16-byte units (the kernels' `kv_*_stride`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct KvStrides {
    pub(super) page: u32,
    pub(super) head: u32,
    pub(super) token: u32,
}

/// Checks a K or V store view of `shape` (`[num_total_pages, num_kv_heads, page_size,
/// head_dim]`) over elements of `elem_bytes` bytes: the shape, `head_dim` contiguous, the other
/// strides non-negative multiples of 16 bytes, every row inside the storage, and the farthest
/// row within 2^32 16-byte units of the view's start (the kernels' offsets are u32). Returns
/// the strides in 16-byte units.
pub(super) fn expect_kv_view(
    name: &str,
    t: &TensorLayout<4>,
    shape: [i32; 4],
    elem_bytes: usize,
) -> Result<KvStrides> {
    let meaning = "[num_total_pages, num_kv_heads, page_size, head_dim]";
    if t.shape != shape {
        return Err(invalid(format!("{name}: shape {:?} must be {meaning} = {shape:?}", t.shape)));
    }
    if t.stride[3] != 1 {
        return Err(invalid(format!(
            "{name}: the head_dim axis must be contiguous (stride 1), got {}",
            t.stride[3]
        )));
    }
    let mut far = 0u128; // element offset of the farthest row
    let mut units = [0u32; 3];
    for (axis, unit) in units.iter_mut().enumerate() {
        let (stride, extent) = (t.stride[axis], shape[axis]);
        if stride < 0 {
            return Err(invalid(format!("{name}: stride {stride} of axis {axis} is negative")));
        }
        let bytes = stride as u128 * elem_bytes as u128;
        if !bytes.is_multiple_of(16) {
            return Err(invalid(format!(
                "{name}: stride {stride} of axis {axis} is not a multiple of 16 bytes ({elem_bytes}-byte elements)"
            )));
        }
        far += stride as u128 * (extent.max(1) - 1) as u128;
        *unit = u32::try_from(bytes / 16).unwrap_or(u32::MAX);
    }
    let end = far + shape[3].max(0) as u128;
    if end > t.storage_len as u128 {
        return Err(invalid(format!(
            "{name}: storage holds {} elements, the view (strides {:?}) needs {end}",
            t.storage_len, t.stride
        )));
    }
    if far * elem_bytes as u128 / 16 > u32::MAX as u128 {
        return Err(Error::Unsupported(format!(
            "{name}: rows more than 2^32 16-byte units (64 GiB) from the view's start"
        )));
    }
    Ok(KvStrides { page: units[0], head: units[1], token: units[2] })
}

/// Checks that no two elements of a view the kernels write share an address: with its axes
/// (and `extra`, a further `(stride, extent)` axis such as a paired V store's offset) sorted by
/// stride, each axis of more than one element starts past the span of the axes inside it. Every
/// nested layout meets this (HND, NHD, vLLM's and FlashInfer's interleaved stores, pools of
/// several layers); a broadcast axis (stride 0) or interleaved rows do not, and would have two
/// CTAs write one address.
pub(super) fn expect_disjoint_rows(
    name: &str,
    t: &TensorLayout<4>,
    extra: Option<(u128, u128)>,
) -> Result<()> {
    let mut axes: Vec<(u128, u128)> =
        (0..4).map(|a| (t.stride[a].max(0) as u128, t.shape[a].max(0) as u128)).collect();
    axes.extend(extra);
    axes.retain(|&(_, extent)| extent > 1);
    axes.sort_unstable();
    let mut span = 0u128; // farthest element offset the axes so far reach
    for (stride, extent) in axes {
        if stride <= span {
            return Err(invalid(format!(
                "{name}: strides {:?} over shape {:?}{} give two elements one address; a view the \
                 kernel writes must not overlap itself",
                t.stride,
                t.shape,
                extra.map_or(String::new(), |(s, _)| format!(" with V {s} elements after K")),
            )));
        }
        span += stride * (extent - 1);
    }
    Ok(())
}

/// The strides K and V share: the kernels address both stores with one row offset.
pub(super) fn same_kv_strides(k: KvStrides, v: KvStrides) -> Result<KvStrides> {
    if k != v {
        return Err(Error::Unsupported(format!(
            "k_data and v_data have different strides ({k:?} and {v:?}, in 16-byte units); they must match"
        )));
    }
    Ok(k)
}
