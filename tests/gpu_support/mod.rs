//! Opening the GPU for the GPU test suites (`tests/gpu.rs`, `tests/gpu_variants.rs`), with a
//! visible skip line where a test cannot run. With `PAGED_DECODE_REQUIRE_GPU=1` (which
//! `scripts/gpu-verify` sets) a missing driver or GPU fails the test instead, so that a GPU run
//! cannot pass by skipping every test.

use std::io::Write;
use std::sync::mpsc;

use paged_decode::{Device, Error, StablePageTable};

/// GPU 0 with cudarc's event tracking on (the safe default), or `None` (and a skip line) without
/// a driver.
pub fn device(test: &str) -> Option<Device> {
    opened(test, Device::open(0))
}

/// [`device`] when it runs the 8-bit cache kernels (sm_90 and newer), else `None` and a skip line.
pub fn fp8_device(test: &str) -> Option<Device> {
    device(test).filter(|dev| runs_fp8(dev, test))
}

/// The device `open` returned, `None` and a skip line without a driver; a panic on any other
/// failure, and on a missing driver where [`gpu_required`].
pub fn opened(test: &str, device: paged_decode::Result<Device>) -> Option<Device> {
    match device {
        Ok(d) => Some(d),
        Err(Error::NoDevice) if gpu_required() => {
            panic!("{test}: no CUDA driver or GPU, and PAGED_DECODE_REQUIRE_GPU=1 asks for one")
        }
        Err(Error::NoDevice) => {
            skipped(test, "no CUDA driver or GPU on this machine");
            None
        }
        Err(e) => panic!("{test}: opening the GPU failed: {e}"),
    }
}

/// Items `0..count` prepared on worker threads by `prepare` (the CPU's share: random inputs and
/// float64 references) and handed to `run` on the calling thread (the device's share) in the
/// order they are ready, at most two per worker waiting at a time. A panic in either reaches
/// the caller; one in `run` (a failed check) stops the workers at their next item.
pub fn prepared_on_workers<P: Send>(
    count: usize,
    prepare: impl Fn(usize) -> P + Sync,
    mut run: impl FnMut(usize, P),
) {
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(1, 12);
    let (tx, rx) = mpsc::sync_channel::<(usize, P)>(workers * 2);
    let prepare = &prepare;
    std::thread::scope(|scope| {
        for w in 0..workers {
            let tx = tx.clone();
            scope.spawn(move || {
                for i in (w..count).step_by(workers) {
                    if tx.send((i, prepare(i))).is_err() {
                        return;
                    }
                }
            });
        }
        drop(tx);
        for (i, prepared) in rx {
            run(i, prepared);
        }
    });
}

/// Whether the GPU runs the 8-bit cache kernels (sm_90 and newer), else a skip line.
pub fn runs_fp8(dev: &Device, test: &str) -> bool {
    let cc = paged_decode::device::DeviceProps::query(&dev.ctx).unwrap().compute_capability;
    if cc.0 < 9 {
        skipped(test, &format!("compute capability {}.{}: 8-bit caches need sm_90", cc.0, cc.1));
    }
    cc.0 >= 9
}

/// Whether `PAGED_DECODE_REQUIRE_GPU=1`: a run on a GPU machine, where no test may skip for want
/// of a driver.
pub fn gpu_required() -> bool {
    std::env::var("PAGED_DECODE_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// A skip line, written to the process's stderr directly so that the test harness does not
/// capture it.
pub fn skipped(test: &str, why: &str) {
    let _ = writeln!(std::io::stderr().lock(), "SKIPPED {test}: {why}");
}

/// Two of the four pairings of q (or token) type and 8-bit code format, `$q` and `$c` naming
/// the types in `$body`: f16 / E4M3 and bf16 / E5M2 for an even `$turn`, f16 / E5M2 and
/// bf16 / E4M3 for an odd one, so that cases taken in turn run every pairing at the cost of
/// two. `$k` (if named) is 0 in the first and 1 in the second. Evaluates to both bodies' values.
macro_rules! two_fp8_pairings {
    ($turn:expr, |$q:ident, $c:ident| $body:expr) => {
        two_fp8_pairings!($turn, |$q, $c, _k| $body)
    };
    ($turn:expr, |$q:ident, $c:ident, $k:ident| $body:expr) => {{
        use paged_decode::float8::{F8E4M3, F8E5M2};
        if $turn % 2 == 0 {
            $crate::gpu_support::fp8_pair_bodies!($q, $c, $k, F8E4M3, F8E5M2, $body)
        } else {
            $crate::gpu_support::fp8_pair_bodies!($q, $c, $k, F8E5M2, F8E4M3, $body)
        }
    }};
}
pub(crate) use two_fp8_pairings;

/// [`two_fp8_pairings`]' two bodies: f16 q with codes `$first`, bf16 q with codes `$second`.
macro_rules! fp8_pair_bodies {
    ($q:ident, $c:ident, $k:ident, $first:ty, $second:ty, $body:expr) => {
        (
            {
                type $q = half::f16;
                type $c = $first;
                let $k = 0u64;
                $body
            },
            {
                type $q = half::bf16;
                type $c = $second;
                let $k = 1u64;
                $body
            },
        )
    };
}
pub(crate) use fp8_pair_bodies;

/// The page-table promise for one configuration in three of a sweep (`i % 3 == 2`), so that the
/// early page-table reads (and the schedule kernel's, and the first tiles' L2 prefetch) run over
/// every dtype, head_dim, group, page size and path the sweep draws.
pub fn promised(i: usize) -> Option<StablePageTable> {
    // SAFETY: a sweep runs each configuration on its own buffers after the copy that poisons its
    // outputs; no kernel before it writes its page table.
    (i % 3 == 2).then(|| unsafe { StablePageTable::promise() })
}
