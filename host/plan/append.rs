//! The append plan: [`PagedKvAppendPlan`] writes one new K/V token per request into the paged
//! store.

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg,
};

use crate::device::{self, DeviceProps};
use crate::error::{Error, Result, invalid};
use crate::guard;
use crate::params::AppendParams;
use crate::ptx::{self, entry};
use crate::tensor::{TensorLayout, TensorMut, TensorRef, Workspace};
use crate::types::*;

use super::checks::{
    KvStrides, aligned, check_paged_kv, expect_disjoint_rows, expect_kv_view, expect_layout, positive,
    same_kv_strides,
};
use super::table_check::{PageTableView, check_on_device};

/// Arguments of [`PagedKvAppendPlan::run`]: tokens of type `T` into a store of `C` (`T` itself,
/// or 8-bit codes).
#[derive(Debug)]
pub struct PagedKvAppendArgs<'a, T, C = T> {
    /// `[batch, num_kv_heads, head_dim]`: the new token's keys.
    pub key: TensorRef<'a, T, 3>,
    /// `[batch, num_kv_heads, head_dim]`: the new token's values.
    pub value: TensorRef<'a, T, 3>,
    /// `[num_total_pages, num_kv_heads, page_size, head_dim]`: the key store written to, HND
    /// when contiguous, else a view with any page, head and token strides as the decode plan
    /// takes ([`BatchPagedDecodeArgs::k_data`](super::BatchPagedDecodeArgs::k_data)). K and V
    /// interleaved in one allocation: [`PagedKvAppendPairedArgs`].
    pub k_data: TensorMut<'a, C, 4>,
    /// The value store written to, a view of the same shape and strides as `k_data`.
    pub v_data: TensorMut<'a, C, 4>,
    /// `[total_used_pages]`: page ids of all requests, concatenated (including the new token's page).
    pub indices: TensorRef<'a, i32, 1>,
    /// `[batch + 1]`: request `b` owns `indices[indptr[b]..indptr[b + 1]]`.
    pub indptr: TensorRef<'a, i32, 1>,
    /// `[batch]`: tokens in each request's last page, counting the new token (so at least 1).
    pub last_page_len: TensorRef<'a, i32, 1>,
}

/// Layouts of [`PagedKvAppendArgs`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PagedKvAppendArgsLayout {
    /// Layout of `key`.
    pub key: TensorLayout<3>,
    /// Layout of `value`.
    pub value: TensorLayout<3>,
    /// Layout of `k_data`.
    pub k_data: TensorLayout<4>,
    /// Layout of `v_data`.
    pub v_data: TensorLayout<4>,
    /// Layout of `indices`.
    pub indices: TensorLayout<1>,
    /// Layout of `indptr`.
    pub indptr: TensorLayout<1>,
    /// Layout of `last_page_len`.
    pub last_page_len: TensorLayout<1>,
}

impl<T, C> PagedKvAppendArgs<'_, T, C> {
    /// The data-free layouts of these arguments.
    pub fn layout(&self) -> PagedKvAppendArgsLayout {
        PagedKvAppendArgsLayout {
            key: self.key.layout(),
            value: self.value.layout(),
            k_data: self.k_data.layout(),
            v_data: self.v_data.layout(),
            indices: self.indices.layout(),
            indptr: self.indptr.layout(),
            last_page_len: self.last_page_len.layout(),
        }
    }
}

/// Arguments of [`PagedKvAppendPlan::run_paired`]: K and V stores in one allocation, such as
/// vLLM's `[blocks, 2, block_size, kv_heads, head_dim]` or FlashInfer's `[pages, 2, …]` tensor
/// (see [`KvLayout::interleaved_strides`]), which two mutable views cannot share.
#[derive(Debug)]
pub struct PagedKvAppendPairedArgs<'a, T, C = T> {
    /// `[batch, num_kv_heads, head_dim]`: the new token's keys.
    pub key: TensorRef<'a, T, 3>,
    /// `[batch, num_kv_heads, head_dim]`: the new token's values.
    pub value: TensorRef<'a, T, 3>,
    /// The K store as a `[num_total_pages, num_kv_heads, page_size, head_dim]` view with
    /// strides, over the allocation from K's row (0, 0, 0) on; the V store is the view of the
    /// same strides `v_offset` elements further, inside the same storage.
    pub kv_data: TensorMut<'a, C, 4>,
    /// Element offset of V's row (0, 0, 0) from K's (16-byte aligned).
    pub v_offset: usize,
    /// `[total_used_pages]`: page ids of all requests, concatenated (including the new token's page).
    pub indices: TensorRef<'a, i32, 1>,
    /// `[batch + 1]`: request `b` owns `indices[indptr[b]..indptr[b + 1]]`.
    pub indptr: TensorRef<'a, i32, 1>,
    /// `[batch]`: tokens in each request's last page, counting the new token (so at least 1).
    pub last_page_len: TensorRef<'a, i32, 1>,
}

impl PagedKvAppendArgsLayout {
    /// Contiguous layouts for `desc` with `num_indices` page ids.
    pub fn contiguous(desc: &PagedKvAppendDescriptor, num_indices: i32) -> Self {
        let kv = &desc.paged_kv;
        let b = desc.batch_size;
        let store = [kv.num_total_pages, kv.num_kv_heads, kv.page_size, kv.head_dim];
        Self {
            key: TensorLayout::contiguous([b, kv.num_kv_heads, kv.head_dim]),
            value: TensorLayout::contiguous([b, kv.num_kv_heads, kv.head_dim]),
            k_data: TensorLayout::contiguous(store),
            v_data: TensorLayout::contiguous(store),
            indices: TensorLayout::contiguous([num_indices]),
            indptr: TensorLayout::contiguous([b.saturating_add(1)]),
            last_page_len: TensorLayout::contiguous([b]),
        }
    }
}

/// Writes one new K/V token per request into the paged store.
///
/// Convention: the caller advances the page table *before* `run` — allocates a new page when
/// the request's last page is full and increments `last_page_len[b]` — so the token lands in
/// slot `last_page_len[b] - 1` of page `indices[indptr[b + 1] - 1]`. A request without pages
/// appends nothing (a free slot of a batch padded to a fixed size, as a captured graph needs);
/// one with `last_page_len[b]` outside `[1, page_size]` breaks the contract and is left
/// untouched too.
///
/// Tokens of type `T` go into a store of `C`: the same type (a copy; 8-bit codes included), or
/// f16 / bf16 tokens quantized into an 8-bit store ([`float8::F8E4M3`], [`float8::F8E5M2`]; sm_90
/// and newer) by [`Self::run_scaled`]: element `x` becomes the code nearest `x / scale` (the
/// quotient rounded to f32, then to the code, ties to even, saturating to the largest finite
/// code; NaN stays NaN), bit for bit [`crate::reference::append_fp8`].
#[derive(Debug)]
pub struct PagedKvAppendPlan<T: CacheElement, C: CacheElement = T> {
    desc: PagedKvAppendDescriptor,
    pref: PlanPreference,
    arch: ArchSku,
    append_fn: CudaFunction,
    check_fn: CudaFunction,
    /// The context the kernels were loaded into: `run` launches only on its streams.
    ctx: Arc<CudaContext>,
    _t: PhantomData<(T, C)>,
}

impl<T: CacheElement, C: CacheElement> PagedKvAppendPlan<T, C> {
    /// Whether the tokens are quantized into an 8-bit store (rather than copied).
    const QUANTIZES: bool = T::CACHE_KIND as u8 != C::CACHE_KIND as u8;

    /// Validates `desc` for tokens of type `T` into a store of `C` (no GPU needed).
    pub fn check_descriptor(desc: &PagedKvAppendDescriptor) -> Result<()> {
        if desc.paged_kv.element != C::CACHE_KIND {
            return Err(invalid(format!(
                "descriptor element {:?} does not match the plan's store element type {:?}",
                desc.paged_kv.element,
                C::CACHE_KIND
            )));
        }
        if Self::QUANTIZES
            && !(C::CACHE_KIND.fp8_layout().is_some() && entry::FP8_Q_ELEMENTS.contains(&T::CACHE_KIND))
        {
            return Err(Error::Unsupported(format!(
                "appending {:?} tokens to a {:?} store (a store of the tokens' type, or f16 / bf16 into 8-bit codes)",
                T::CACHE_KIND,
                C::CACHE_KIND
            )));
        }
        check_paged_kv(&desc.paged_kv)?;
        positive("batch_size", desc.batch_size)?;
        if desc.batch_size == i32::MAX {
            return Err(invalid("batch_size + 1 (the length of indptr) overflows i32"));
        }
        if desc.paged_kv.num_kv_heads > 65535 {
            return Err(Error::Unsupported("num_kv_heads above 65535".into()));
        }
        Ok(())
    }

    /// Checks every argument's shape, contiguity (strides of the K/V views) and storage size
    /// (no GPU needed).
    pub fn check_layout(desc: &PagedKvAppendDescriptor, args: &PagedKvAppendArgsLayout) -> Result<()> {
        Self::kv_strides(desc, args).map(|_| ())
    }

    /// [`Self::check_layout`] of paired arguments ([`PagedKvAppendPairedArgs`]): `kv_data` is
    /// the K view, and the V view of its strides at `v_offset` elements must fit the storage too.
    pub fn check_paired_layout(
        desc: &PagedKvAppendDescriptor,
        args: &PagedKvAppendArgsLayout,
        v_offset: usize,
    ) -> Result<()> {
        Self::paired_strides(desc, &Self::paired_layout(args, v_offset)?, v_offset).map(|_| ())
    }

    /// [`Self::kv_strides`] of a paired layout ([`Self::paired_layout`]), whose K and V views
    /// must not share an address either.
    fn paired_strides(
        desc: &PagedKvAppendDescriptor,
        layout: &PagedKvAppendArgsLayout,
        v_offset: usize,
    ) -> Result<KvStrides> {
        let strides = Self::kv_strides(desc, layout)?;
        expect_disjoint_rows("kv_data", &layout.k_data, Some((v_offset as u128, 2)))?;
        Ok(strides)
    }

    /// `args` with `v_data` the V view of a paired store: `k_data`'s strides, `v_offset`
    /// elements further into its storage.
    fn paired_layout(args: &PagedKvAppendArgsLayout, v_offset: usize) -> Result<PagedKvAppendArgsLayout> {
        let storage_len = args.k_data.storage_len.checked_sub(v_offset).ok_or_else(|| {
            invalid(format!(
                "v_offset {v_offset} lies past the storage of {} elements",
                args.k_data.storage_len
            ))
        })?;
        if !(v_offset as u128 * std::mem::size_of::<C>() as u128).is_multiple_of(16) {
            return Err(invalid(format!("v_offset {v_offset} is not a multiple of 16 bytes")));
        }
        Ok(PagedKvAppendArgsLayout { v_data: TensorLayout { storage_len, ..args.k_data }, ..*args })
    }

    /// [`Self::check_layout`], returning the K/V views' strides in 16-byte units.
    fn kv_strides(desc: &PagedKvAppendDescriptor, args: &PagedKvAppendArgsLayout) -> Result<KvStrides> {
        let kv = &desc.paged_kv;
        let b = desc.batch_size;
        let store = [kv.num_total_pages, kv.num_kv_heads, kv.page_size, kv.head_dim];
        let row = [b, kv.num_kv_heads, kv.head_dim];
        expect_layout("key", &args.key, row, "[batch_size, num_kv_heads, head_dim]")?;
        expect_layout("value", &args.value, row, "[batch_size, num_kv_heads, head_dim]")?;
        let size = C::CACHE_KIND.size_bytes();
        let k = expect_kv_view("k_data", &args.k_data, store, size)?;
        let strides = same_kv_strides(k, expect_kv_view("v_data", &args.v_data, store, size)?)?;
        expect_disjoint_rows("k_data", &args.k_data, None)?;
        expect_disjoint_rows("v_data", &args.v_data, None)?;
        if args.indices.shape[0] < 0 {
            return Err(invalid(format!("indices: extent {} must be ≥ 0", args.indices.shape[0])));
        }
        expect_layout("indices", &args.indices, [args.indices.shape[0]], "[total_used_pages]")?;
        let b1 =
            b.checked_add(1).ok_or_else(|| invalid("batch_size + 1 (the length of indptr) overflows i32"))?;
        expect_layout("indptr", &args.indptr, [b1], "[batch_size + 1]")?;
        expect_layout("last_page_len", &args.last_page_len, [b], "[batch_size]")?;
        Ok(strides)
    }

    /// Validates `desc` and loads the append kernel for `stream`'s device.
    pub fn select(
        stream: &Arc<CudaStream>,
        desc: &PagedKvAppendDescriptor,
        pref: PlanPreference,
    ) -> Result<Self> {
        Self::check_descriptor(desc)?;
        if pref.prefer_backend.is_some_and(|b| b != BackendKind::RustPtx) {
            return Err(Error::Unsupported(format!("backend {:?}", pref.prefer_backend)));
        }
        let ctx = stream.context();
        let props = DeviceProps::query(ctx)?;
        let arch = ptx::build_for_preference(props.compute_capability, pref.allow_sm90a);
        let name = if Self::QUANTIZES {
            if arch != ArchSku::Sm90 {
                return Err(Error::Unsupported(format!(
                    "quantizing into an 8-bit store on compute capability {}.{}{}; the sm_90 build (sm_90 or newer) is required",
                    props.compute_capability.0,
                    props.compute_capability.1,
                    if pref.allow_sm90a { "" } else { " with allow_sm90a off" }
                )));
            }
            entry::append_quantized(T::CACHE_KIND, C::CACHE_KIND)
        } else if C::CACHE_KIND.fp8_layout().is_some() {
            entry::append(ElementKind::U8)
        } else {
            entry::append(T::CACHE_KIND)
        };
        device::preload(ctx, arch, &[&name, entry::CHECK_PAGE_TABLE])?;
        Ok(Self {
            desc: *desc,
            pref,
            arch,
            append_fn: device::function(ctx, arch, &name, 0)?,
            check_fn: device::function(ctx, arch, entry::CHECK_PAGE_TABLE, 0)?,
            ctx: ctx.clone(),
            _t: PhantomData,
        })
    }

    /// Checks the arguments against the plan's descriptor.
    pub fn can_implement(&self, args: &PagedKvAppendArgs<'_, T, C>) -> Result<()> {
        Self::check_layout(&self.desc, &args.layout())
    }

    /// Always 0: appending needs no scratch memory.
    pub fn workspace_size(&self) -> usize {
        0
    }

    /// Identity of the selected kernel.
    pub fn sku(&self) -> KernelSku {
        KernelSku {
            category: OpCategory::KvCache,
            op: AttentionKind::PagedKvAppend,
            element: C::CACHE_KIND,
            aux_element: ElementKind::I32,
            layout: KvLayout::Strided,
            epilogue: Epilogue::None,
            arch: self.arch,
            backend: BackendKind::RustPtx,
            precision_guarantee: self.precision_guarantee(),
        }
    }

    /// What this plan promises about its numbers (exact copies, or correctly rounded codes).
    pub fn precision_guarantee(&self) -> PrecisionGuarantee {
        PrecisionGuarantee {
            math_precision: MathPrecision::Exact,
            accumulator: T::CACHE_KIND,
            bit_stable_on_same_hardware: true,
            deterministic: true,
        }
    }

    /// Validates the device page table of `args` against the append contract (see
    /// [`crate::page_table`]: `last_page_len ∈ [1, page_size]` on every request with pages, no two
    /// requests append to the same slot, and the page a request appends to appears once in the
    /// table; a request without pages appends nothing) on the GPU, the last two rules on the host from a copy of the table; synchronizes
    /// `stream` and reports the first violation as [`Error::InvalidPageTable`]. Refused with
    /// [`Error::CheckedUnderCapture`] while `stream` is being captured into a graph, and, as
    /// [`Self::run`], with [`Error::WrongDevice`], [`Error::UnorderedContext`] or
    /// [`Error::UnorderedStream`] for operands the stream cannot use.
    pub fn check_page_table(
        &self,
        stream: &Arc<CudaStream>,
        args: &PagedKvAppendArgs<'_, T, C>,
    ) -> Result<()> {
        args.check_launch_context(&self.ctx, stream)?;
        self.can_implement(args)?;
        let table = PageTableView::of(&args.indices, &args.indptr, &args.last_page_len);
        check_on_device(stream, &self.check_fn, table, self.desc.batch_size as u32, &self.desc.paged_kv, true)
    }

    /// Launches the append on `stream` (no allocation, no synchronization unless
    /// [`PlanPreference::checked`], which first runs [`Self::check_page_table`] and writes
    /// nothing when it fails).
    ///
    /// Unchecked, the kernel trusts the table as far as the append contract goes but never
    /// writes outside the store: it skips a request with no page (as the contract says), with
    /// `last_page_len` outside `[1, page_size]` or with a last page id outside the store (its
    /// token is dropped); two requests appending to the same slot both write it (with relaxed
    /// GPU-scope stores, so without a data race: each 4-byte word of the row ends up one of the
    /// two tokens'); and an append page that appears elsewhere in the table is written as the
    /// table says, over a token another reference to it counts.
    ///
    /// Refused as [`BatchPagedDecodePlan::run`](super::BatchPagedDecodePlan::run) is: operands of
    /// another context ([`Error::WrongDevice`]) or of an unordered `CudaContext` object
    /// ([`Error::UnorderedContext`]), default-stream operands off the legacy stream
    /// ([`Error::UnorderedStream`]), capture in a context that tracks events
    /// ([`Error::CaptureWithTracking`]), and a checked run while `stream` captures
    /// ([`Error::CheckedUnderCapture`]).
    ///
    /// A quantizing plan divides by scales of 1 here; [`Self::run_scaled`] takes others.
    pub fn run(
        &self,
        stream: &Arc<CudaStream>,
        workspace: &mut Workspace<'_>,
        args: &mut PagedKvAppendArgs<'_, T, C>,
    ) -> Result<()> {
        self.run_scaled(stream, workspace, args, KvScales::ONE)
    }

    /// [`Self::run`] quantizing with `scales` (key elements divided by `k_scale`, values by
    /// `v_scale`): finite and positive, and 1 for a plan that copies.
    pub fn run_scaled(
        &self,
        stream: &Arc<CudaStream>,
        _workspace: &mut Workspace<'_>,
        args: &mut PagedKvAppendArgs<'_, T, C>,
        scales: KvScales,
    ) -> Result<()> {
        let scales = Self::checked_scales(scales)?;
        if self.pref.checked {
            self.check_page_table(stream, args)?;
        }
        guard::refuse_tracked_capture(stream)?;
        args.check_launch_context(&self.ctx, stream)?;
        let strides = Self::kv_strides(&self.desc, &args.layout())?;
        let (k, _k) = args.k_data.data.device_ptr_mut(stream);
        let (v, _v) = args.v_data.data.device_ptr_mut(stream);
        let table = [&args.key, &args.value].map(|t| t.data.device_ptr(stream));
        let page_table =
            [&args.indices, &args.indptr, &args.last_page_len].map(|t| t.data.device_ptr(stream));
        let page_table_ptrs = [page_table[0].0, page_table[1].0, page_table[2].0];
        let tokens = [table[0].0, table[1].0];
        self.launch(stream, tokens, [k, v], strides, (page_table_ptrs, args.indices.shape[0]), scales)?;
        drop((_k, _v, table, page_table));
        args.join_reads(stream)
    }

    /// `scales` when finite and positive, and 1 for a plan that copies.
    fn checked_scales(scales: KvScales) -> Result<KvScales> {
        let scales = scales.check()?;
        if !Self::QUANTIZES && scales != KvScales::ONE {
            return Err(invalid(format!("{scales:?}: scales apply to quantizing appends only")));
        }
        Ok(scales)
    }

    /// [`Self::run`] into K and V stores that share one allocation ([`PagedKvAppendPairedArgs`]:
    /// vLLM's and FlashInfer's interleaved `[pages, 2, …]` tensors).
    pub fn run_paired(
        &self,
        stream: &Arc<CudaStream>,
        workspace: &mut Workspace<'_>,
        args: &mut PagedKvAppendPairedArgs<'_, T, C>,
    ) -> Result<()> {
        self.run_paired_scaled(stream, workspace, args, KvScales::ONE)
    }

    /// [`Self::run_paired`] quantizing with `scales`, as [`Self::run_scaled`] (an 8-bit cache in
    /// vLLM's interleaved layout with its per-tensor K and V scales).
    pub fn run_paired_scaled(
        &self,
        stream: &Arc<CudaStream>,
        _workspace: &mut Workspace<'_>,
        args: &mut PagedKvAppendPairedArgs<'_, T, C>,
        scales: KvScales,
    ) -> Result<()> {
        let scales = Self::checked_scales(scales)?;
        let layout = PagedKvAppendArgsLayout {
            key: args.key.layout(),
            value: args.value.layout(),
            k_data: args.kv_data.layout(),
            v_data: args.kv_data.layout(),
            indices: args.indices.layout(),
            indptr: args.indptr.layout(),
            last_page_len: args.last_page_len.layout(),
        };
        let layout = Self::paired_layout(&layout, args.v_offset)?;
        guard::refuse_tracked_capture(stream)?;
        args.check_launch_context(&self.ctx, stream)?;
        let strides = Self::paired_strides(&self.desc, &layout, args.v_offset)?;
        if self.pref.checked {
            let table = PageTableView::of(&args.indices, &args.indptr, &args.last_page_len);
            check_on_device(
                stream,
                &self.check_fn,
                table,
                self.desc.batch_size as u32,
                &self.desc.paged_kv,
                true,
            )?;
        }
        let (k, _k) = args.kv_data.data.device_ptr_mut(stream);
        let v = k + (args.v_offset * std::mem::size_of::<C>()) as u64;
        let table = [&args.key, &args.value].map(|t| t.data.device_ptr(stream));
        let page_table =
            [&args.indices, &args.indptr, &args.last_page_len].map(|t| t.data.device_ptr(stream));
        let page_table_ptrs = [page_table[0].0, page_table[1].0, page_table[2].0];
        let tokens = [table[0].0, table[1].0];
        self.launch(stream, tokens, [k, v], strides, (page_table_ptrs, args.indices.shape[0]), scales)?;
        drop((_k, table, page_table));
        args.join_reads(stream)
    }

    /// Launches the append kernel on device addresses whose tensors were checked against the
    /// descriptor (`key`/`value`, the K/V views, `indices`/`indptr`/`last_page_len` with the
    /// extent of `indices`), taken on `stream` just before: the capture check runs again here,
    /// since a wait for an operand's event recorded in another stream's capture draws `stream`
    /// into that capture.
    fn launch(
        &self,
        stream: &Arc<CudaStream>,
        [key, value]: [u64; 2],
        [k, v]: [u64; 2],
        strides: KvStrides,
        ([indices, indptr, last], num_indices): ([u64; 3], i32),
        scales: KvScales,
    ) -> Result<()> {
        guard::refuse_tracked_capture(stream)?;
        let kv = &self.desc.paged_kv;
        for (name, ptr) in [("key", key), ("value", value), ("k_data", k), ("v_data", v)] {
            aligned(name, ptr, 16)?;
        }
        let p = AppendParams {
            key,
            value,
            k_data: k,
            v_data: v,
            indices,
            indptr,
            last_page_len: last,
            batch: self.desc.batch_size as u32,
            num_kv_heads: kv.num_kv_heads as u32,
            page_size: kv.page_size as u32,
            head_dim: kv.head_dim as u32,
            num_total_pages: kv.num_total_pages as u32,
            num_indices: num_indices as u32,
            k_scale: scales.k_scale,
            v_scale: scales.v_scale,
            kv_page_stride: strides.page,
            kv_head_stride: strides.head,
            kv_token_stride: strides.token,
        };
        let cfg = LaunchConfig {
            grid_dim: (self.desc.batch_size as u32, kv.num_kv_heads as u32, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: every tensor lives in the stream's context, which is the plan's (checked by the
        // callers), and holds its shape and every row of the K/V views (`kv_strides`); the kernel
        // bounds-checks the page table before it writes, and the callers' view guards, alive
        // until this returns, order the launch after earlier uses of the tensors.
        unsafe { stream.launch_builder(&self.append_fn).arg(&p).launch(cfg)? };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use half::{bf16, f16};

    use super::*;

    #[test]
    fn every_entry_select_loads_is_in_the_shipped_ptx() {
        for ptx in [ptx::PTX, ptx::PTX_SM90] {
            let shipped = ptx::entries(ptx);
            for name in [entry::append(f16::KIND), entry::append(bf16::KIND), entry::append(f32::KIND)] {
                assert!(shipped.contains(&name.as_str()), "{name} is not in the PTX");
            }
            assert!(shipped.contains(&entry::CHECK_PAGE_TABLE));
        }
    }
}
