//! Opening a GPU without panicking, and loading the embedded PTX once per context.

use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{self, CUdevice_attribute};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;

use crate::error::{Error, Result};
use crate::types::ArchSku;

/// True when the CUDA driver library can be loaded on this machine.
pub fn driver_available() -> bool {
    crate::driver_library::present()
}

/// A CUDA context plus a non-default stream (capturable into CUDA graphs).
///
/// [`Device::open`] keeps cudarc's per-slice event tracking on: every use of a `CudaSlice` on a
/// stream other than the one that last wrote it (or, for a write, last read it) waits for that
/// use, and a slice is freed only after its last recorded use. cudarc (0.19) keeps one read
/// event per allocation, recorded on the latest reader's stream, so a run reading a tensor
/// allocated on another stream has that stream wait for the launch and records the read there:
/// two decode streams sharing a K/V store stay ordered with its later writes and its drop, and
/// work enqueued on the store's stream after a run waits for it. [`Device::open_untracked`]
/// turns the tracking off, which graph capture of [`run`](crate::BatchPagedDecodePlan::run)
/// needs; see the [crate documentation](crate#safety-model).
#[derive(Debug, Clone)]
pub struct Device {
    /// The CUDA context of the GPU.
    pub ctx: Arc<CudaContext>,
    /// The stream all work is issued on.
    pub stream: Arc<CudaStream>,
}

impl Device {
    /// Opens GPU `ordinal` with cudarc's cross-stream event tracking on;
    /// [`Error::NoDevice`] when no CUDA driver is installed or it sees no GPU.
    ///
    /// Orders its slices across any number of streams, but for the one case cudarc's tracking
    /// leaves to the caller: reads of one slice on two streams, then a write or drop (see
    /// [`Device`]). A plan's `run` on its capturing stream is refused with
    /// [`Error::CaptureWithTracking`] before any kernel is enqueued (and cudarc's own copies there
    /// would wait on events recorded before the capture, which invalidates it). Use
    /// [`Device::open_untracked`] to capture.
    pub fn open(ordinal: usize) -> Result<Self> {
        Self::open_with(ordinal, true)
    }

    /// Opens GPU `ordinal` with cudarc's cross-stream event tracking off: the device for CUDA
    /// graph capture and for the lowest launch overhead (no event record or wait per tensor).
    /// [`Error::NoDevice`] as [`Device::open`].
    ///
    /// # Safety
    /// Every `CudaSlice` allocated in this context (it is shared by all streams of `ctx`, also
    /// through clones of the `Device`) is then ordered by its streams alone, so the caller
    /// guarantees, as for `CudaContext::disable_event_tracking`:
    /// - a slice is not used on a stream before the work that allocated or last wrote it on
    ///   another stream has finished (or the streams are joined with events),
    /// - a slice is not written on one stream while another stream reads or writes it,
    /// - a slice is not dropped (its memory freed on its own stream) while work on another
    ///   stream still uses it.
    ///
    /// The same holds for slices of other `CudaContext` objects of this GPU that do not manage
    /// stream synchronization (a tracking one used through its default stream alone, say) when
    /// they are launched on this device's streams: the plans take them here, and nothing orders
    /// them with this device's streams but the caller.
    ///
    /// Using only [`Device::stream`] and its slices satisfies all of this. Graph capture, which the plans allow
    /// only in such a context ([`Error::CaptureWithTracking`] otherwise), adds two more: a
    /// captured graph holds raw device pointers, so every buffer it reads or writes must
    /// outlive its last replay (the kernels it launches stay loaded unless
    /// [`release_cached_modules`] unloads them), and a workspace captured with a plan's runs is
    /// not zeroed again ([`crate::Workspace::zeroed`]) nor used by another launch while the graph
    /// can still replay, since its replays keep their split state there.
    pub unsafe fn open_untracked(ordinal: usize) -> Result<Self> {
        Self::open_with(ordinal, false)
    }

    fn open_with(ordinal: usize, event_tracking: bool) -> Result<Self> {
        if !driver_available() {
            return Err(Error::NoDevice);
        }
        // A driver without a visible GPU (`CUDA_VISIBLE_DEVICES=""`) is no device either.
        let ctx = match CudaContext::new(ordinal) {
            Err(e) if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_NO_DEVICE => {
                return Err(Error::NoDevice);
            }
            ctx => ctx?,
        };
        if !event_tracking {
            // SAFETY: no slice of this context exists yet, and the caller of `open_untracked`
            // takes on the ordering duties its contract lists.
            unsafe { ctx.disable_event_tracking() };
        }
        let stream = ctx.new_stream()?;
        Ok(Self { ctx, stream })
    }

    /// Whether cudarc orders cross-stream uses of this context's slices ([`Device::open`]).
    pub fn is_event_tracking(&self) -> bool {
        self.ctx.is_event_tracking()
    }

    /// Device name as the driver reports it.
    pub fn name(&self) -> Result<String> {
        Ok(self.ctx.name()?)
    }
}

/// Properties the plans choose configurations from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceProps {
    /// Number of streaming multiprocessors.
    pub sm_count: u32,
    /// Compute capability as `(major, minor)`.
    pub compute_capability: (u32, u32),
    /// Shared memory per SM, in bytes.
    pub smem_per_sm: u32,
    /// Largest dynamic shared memory per block with opt-in, in bytes.
    pub smem_per_block_optin: u32,
}

impl DeviceProps {
    /// Reads the properties of `ctx`'s device from the driver.
    pub fn query(ctx: &CudaContext) -> Result<Self> {
        let attr = |a| ctx.attribute(a).map(|v| v.max(0) as u32);
        Ok(Self {
            sm_count: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            compute_capability: (
                attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            ),
            smem_per_sm: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)?,
            smem_per_block_optin: attr(
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )?,
        })
    }
}

/// A context (its `CUcontext` as an address), a build, and one of its entry points.
type ModuleKey = (usize, ArchSku, String);

/// The modules loaded so far, one per entry point of a build in a context. They stay loaded for
/// the process, so that a plan selected again does not compile them again; each keeps its
/// context alive ([`release_cached_modules`]).
static MODULES: Mutex<Vec<(ModuleKey, Arc<CudaModule>)>> = Mutex::new(Vec::new());

/// Drops this crate's cached modules of `ctx`'s driver context and returns how many it dropped.
///
/// The modules plans load stay cached for the process (a plan selected again then compiles
/// nothing), and each holds its context, so a context that ever selected a plan outlives its
/// other owners. A program that creates and drops contexts calls this before dropping one; plans
/// still alive keep the modules they launch (through their functions), and a later `select`
/// loads what it needs again.
///
/// The cache is keyed by the driver context, so this reaches the plans selected through every
/// `CudaContext` object of it, in any part of the process (each `Device::open(0)` and candle's
/// device of GPU 0 share the primary context). Code outside cudarc that resets the primary
/// context (`cudaDeviceReset`, `cuDevicePrimaryCtxReset`) unloads the modules while the handle
/// usually stays the same: call this after such a reset, before selecting plans again.
///
/// # Safety
/// A module no live plan holds is unloaded here, or later when the last plan holding it is
/// dropped, and a captured CUDA graph holds its kernels as raw handles: no graph that captured a
/// launch of a plan of this driver context (through any `CudaContext` object of it) may be
/// replayed once that plan is dropped (the same rule as for the buffers a graph captured).
/// Unloading a module whose kernels are still running is not a defined driver operation either:
/// the launches of dropped plans of this driver context have completed (synchronize its
/// streams) before this call, and those of the plans still alive before each is dropped.
pub unsafe fn release_cached_modules(ctx: &CudaContext) -> usize {
    let mut cache = MODULES.lock().unwrap_or_else(|e| e.into_inner());
    let before = cache.len();
    cache.retain(|((cu_ctx, _, _), _)| *cu_ctx != ctx.cu_ctx() as usize);
    before - cache.len()
}

fn cached_module(key: &ModuleKey) -> Option<Arc<CudaModule>> {
    let cache = MODULES.lock().unwrap_or_else(|e| e.into_inner());
    cache.iter().find(|(k, _)| k == key).map(|(_, m)| m.clone())
}

/// The module of entry point `name` of build `arch` in one context, JIT-compiled on first use
/// ([`crate::ptx::EntryModules`]: the driver compiles a module whole, so each entry is a module
/// of its own and a plan compiles only the entries it launches).
pub(crate) fn module(ctx: &Arc<CudaContext>, arch: ArchSku, name: &str) -> Result<Arc<CudaModule>> {
    let key = (ctx.cu_ctx() as usize, arch, name.to_string());
    if let Some(m) = cached_module(&key) {
        return Ok(m);
    }
    let Some(ptx) = crate::ptx::entry_modules(arch).module(name) else {
        return Err(Error::Unsupported(format!("entry point {name} is not in the {arch:?} PTX build")));
    };
    // Compiled without holding the cache, so that several entries compile at once (`preload`);
    // two threads compiling the same entry keep the first module stored.
    let m = ctx.load_module(Ptx::from_src(ptx))?;
    let mut cache = MODULES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, first)) = cache.iter().find(|(k, _)| *k == key) {
        return Ok(first.clone());
    }
    cache.push((key, m.clone()));
    Ok(m)
}

/// Compiles the modules of entry points `names` of build `arch` that are not loaded yet, on a
/// thread each: the driver's JIT runs on the calling thread, so a plan's dozen entries compile
/// side by side instead of in turn.
pub(crate) fn preload(ctx: &Arc<CudaContext>, arch: ArchSku, names: &[&str]) -> Result<()> {
    let mut missing: Vec<&str> = names
        .iter()
        .copied()
        .filter(|name| cached_module(&(ctx.cu_ctx() as usize, arch, name.to_string())).is_none())
        .collect();
    missing.sort_unstable();
    missing.dedup();
    std::thread::scope(|scope| {
        // An entry whose thread the system refuses compiles on this one instead.
        let loads: Vec<_> = missing
            .iter()
            .map(|name| {
                std::thread::Builder::new()
                    .spawn_scoped(scope, move || module(ctx, arch, name))
                    .map_err(|_| name)
            })
            .collect();
        // Every load ends before the first error returns.
        let results: Vec<Result<Arc<CudaModule>>> = loads
            .into_iter()
            .map(|load| match load {
                Ok(thread) => thread.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                Err(name) => module(ctx, arch, name),
            })
            .collect();
        results.into_iter().try_for_each(|r| r.map(drop))
    })
}

/// Loads entry `name` of build `arch`, raising its dynamic shared-memory limit to `smem_bytes`
/// when needed.
///
/// The limit belongs to the context's function, which every plan loading the entry shares, so
/// it only ever rises: a plan selected later with a smaller need must not lower it under an
/// earlier plan's launches (they would fail with `CUDA_ERROR_INVALID_VALUE`).
pub(crate) fn function(
    ctx: &Arc<CudaContext>,
    arch: ArchSku,
    name: &str,
    smem_bytes: u32,
) -> Result<CudaFunction> {
    static RAISING: Mutex<()> = Mutex::new(());
    let f = module(ctx, arch, name)?.load_function(name)?;
    if smem_bytes > 48 * 1024 {
        let limit =
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
        // One read-and-raise at a time, so that two threads' selects cannot lower it either.
        let _one_at_a_time = RAISING.lock().unwrap_or_else(|e| e.into_inner());
        // Read through the caller's context object: `CudaFunction::get_attribute` binds the
        // module's, which may be another object of this driver context (the cache is shared),
        // and would take that object's pending error as this call's.
        ctx.bind_to_thread()?;
        // SAFETY: `f` is a live function of `ctx`'s driver context (its module is held by `f`),
        // and that context is current on this thread.
        let current =
            unsafe { cudarc::driver::result::function::get_function_attribute(f.cu_function(), limit) }?;
        if current < smem_bytes as i32 {
            f.set_attribute(limit, smem_bytes as i32)?;
        }
    }
    Ok(f)
}

/// Launches `f` with its single by-value parameter block `params`. With `programmatic`, the
/// launch is a programmatic dependent launch: its CTAs may start while the previous kernel in
/// the stream is still running, and the kernel itself waits (`griddepcontrol.wait`) before it
/// touches memory that kernel may write. Captured into a CUDA graph, it becomes a programmatic
/// edge.
///
/// # Safety
/// `params` must be the parameter block `f` expects, pointing at live device memory, and with
/// `programmatic`, `f` must come from the sm_90 PTX.
pub(crate) unsafe fn launch<P: cudarc::driver::DeviceRepr>(
    stream: &Arc<CudaStream>,
    f: &CudaFunction,
    cfg: LaunchConfig,
    params: &P,
    programmatic: bool,
) -> Result<()> {
    if !programmatic {
        // SAFETY: forwarded from the caller.
        unsafe { stream.launch_builder(f).arg(params).launch(cfg)? };
        return Ok(());
    }
    stream.context().bind_to_thread()?;
    // SAFETY: an all-zero launch attribute is valid plain data; the union member set is the
    // one the attribute id selects.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let config = sys::CUlaunchConfig {
        gridDimX: cfg.grid_dim.0,
        gridDimY: cfg.grid_dim.1,
        gridDimZ: cfg.grid_dim.2,
        blockDimX: cfg.block_dim.0,
        blockDimY: cfg.block_dim.1,
        blockDimZ: cfg.block_dim.2,
        sharedMemBytes: cfg.shared_mem_bytes,
        hStream: stream.cu_stream(),
        attrs: &mut attr,
        numAttrs: 1,
    };
    let mut args = [params as *const P as *mut std::ffi::c_void];
    // SAFETY: the driver copies the parameter block during the call; see the function's contract
    // for its contents.
    unsafe {
        sys::cuLaunchKernelEx(&config, f.cu_function(), args.as_mut_ptr(), std::ptr::null_mut()).result()?
    };
    Ok(())
}
