//! Tensor-parallel decode: the KV heads of one paged cache (and the query heads of their groups)
//! split evenly over several GPUs, each decoding its shard with its own plan and stream, then
//! an NCCL all-gather of `o` and `lse` so that every GPU holds the whole output.
//!
//! The gathered buffers are rank-major, `[world, batch, heads per rank, head_dim]` (NCCL
//! concatenates the ranks' buffers); [`TensorParallel::gathered`] reorders a copy into the
//! usual `[batch, num_qo_heads, head_dim]` on the host.

use std::sync::Arc;

use paged_decode::cudarc::driver::{CudaSlice, CudaStream};
use paged_decode::cudarc::nccl::{Comm, result as nccl};
use paged_decode::half::f16;
use paged_decode::{
    BatchPagedDecodeArgs, BatchPagedDecodeDescriptor, BatchPagedDecodePlan, Device, PagedKvCacheDescriptor,
    PlanPreference, TensorMut, TensorRef, Workspace, reference,
};

use std::time::Instant;

use paged_decode::Error;
use paged_decode::cudarc::driver::CudaContext;
use rand::SeedableRng;
use rand::rngs::SmallRng;

use super::{
    DevicePageTable, HEAD_DIM, HostPageTable, KV_HEADS, PAGE_SIZE, PagePool, QO_HEADS, Sequence, lse_err,
    paged_kv, random_values, rel_err,
};

/// One decode problem in host memory: `q` is `[batch, qo_heads, d]`, `k` and `v` are
/// `[pages, kv_heads, page_size, d]` (HND).
pub struct HostDecode {
    pub desc: BatchPagedDecodeDescriptor,
    pub q: Vec<f16>,
    pub k: Vec<f16>,
    pub v: Vec<f16>,
    pub table: HostPageTable,
}

impl HostDecode {
    /// `batch` requests of `len` tokens over pages in random order, random q / K / V.
    pub fn random(batch: usize, len: usize, seed: u64) -> HostDecode {
        let mut rng = SmallRng::seed_from_u64(seed);
        let pages_per_request = len.div_ceil(PAGE_SIZE);
        let num_pages = batch * pages_per_request;
        let mut pool = PagePool::new(num_pages, &mut rng);
        let requests: Vec<Sequence> = (0..batch)
            .map(|_| {
                let mut seq = Sequence::default();
                for _ in 0..len {
                    seq.grow(&mut pool, PAGE_SIZE);
                }
                seq
            })
            .collect();
        let store = num_pages * KV_HEADS * PAGE_SIZE * HEAD_DIM;
        HostDecode {
            desc: BatchPagedDecodeDescriptor {
                batch_size: batch as i32,
                num_qo_heads: QO_HEADS as i32,
                sm_scale: 1.0 / (HEAD_DIM as f32).sqrt(),
                paged_kv: paged_kv(num_pages),
            },
            q: random_values(&mut rng, batch * QO_HEADS * HEAD_DIM),
            k: random_values(&mut rng, store),
            v: random_values(&mut rng, store),
            table: HostPageTable::of(requests.iter().map(Some), PAGE_SIZE, 0),
        }
    }

    /// The shard of rank `rank` of `world`: KV heads `[rank · n, (rank + 1) · n)`, `n =
    /// kv_heads / world`, with the query heads of their groups; the page table is the same.
    pub fn shard(&self, rank: usize, world: usize) -> HostDecode {
        let kv = &self.desc.paged_kv;
        let (kv_heads, qo_heads) = (kv.num_kv_heads as usize, self.desc.num_qo_heads as usize);
        let (d, page) = (kv.head_dim as usize, kv.page_size as usize);
        let (kv_per, qo_per) = (kv_heads / world, qo_heads / world);
        // HND keeps a page's heads contiguous: the shard takes one run per page.
        let per_head = page * d;
        let store = |full: &[f16]| -> Vec<f16> {
            full.chunks_exact(kv_heads * per_head)
                .flat_map(|page_block| &page_block[rank * kv_per * per_head..(rank + 1) * kv_per * per_head])
                .copied()
                .collect()
        };
        let q = self
            .q
            .chunks_exact(qo_heads * d)
            .flat_map(|row| &row[rank * qo_per * d..(rank + 1) * qo_per * d])
            .copied()
            .collect();
        let paged_kv = PagedKvCacheDescriptor { num_kv_heads: kv_per as i32, ..*kv };
        HostDecode {
            desc: BatchPagedDecodeDescriptor { num_qo_heads: qo_per as i32, paged_kv, ..self.desc },
            q,
            k: store(&self.k),
            v: store(&self.v),
            table: self.table.clone(),
        }
    }
}

/// A problem's buffers and plan on one GPU.
pub struct Resident {
    pub stream: Arc<CudaStream>,
    pub plan: BatchPagedDecodePlan<f16>,
    shape: (i32, i32, i32, [i32; 4]),
    q: CudaSlice<f16>,
    k: CudaSlice<f16>,
    v: CudaSlice<f16>,
    table: DevicePageTable,
    pub o: CudaSlice<f16>,
    pub lse: CudaSlice<f32>,
    workspace: CudaSlice<u8>,
}

impl Resident {
    /// Uploads `problem` to `device` and selects its plan.
    pub fn upload(device: &Device, problem: &HostDecode) -> Result<Self, paged_decode::Error> {
        let stream = device.stream.clone();
        let plan = BatchPagedDecodePlan::<f16>::select(&stream, &problem.desc, PlanPreference::default())?;
        let kv = &problem.desc.paged_kv;
        let (b, hq, d) = (problem.desc.batch_size, problem.desc.num_qo_heads, kv.head_dim);
        Ok(Self {
            q: stream.clone_htod(&problem.q)?,
            k: stream.clone_htod(&problem.k)?,
            v: stream.clone_htod(&problem.v)?,
            table: DevicePageTable::upload(&stream, &problem.table)?,
            // NaN until the first launch writes them: a row no launch writes fails the comparison.
            o: stream.clone_htod(&vec![f16::NAN; (b * hq * d) as usize])?,
            lse: stream.clone_htod(&vec![f32::NAN; (b * hq) as usize])?,
            shape: (b, hq, d, [kv.num_total_pages, kv.num_kv_heads, kv.page_size, d]),
            // Zeroed by the allocation; every launch leaves the split state zero again.
            workspace: stream.alloc_zeros::<u8>(plan.workspace_size().max(1))?,
            plan,
            stream,
        })
    }

    /// Enqueues one decode on the resident's stream.
    pub fn decode(&mut self) -> Result<(), paged_decode::Error> {
        let (b, hq, d, store) = self.shape;
        let (indices, indptr, last_page_len) = self.table.views();
        // SAFETY: the workspace was allocated zeroed in `upload` and is used by this plan alone,
        // on this stream, whose launches leave its split state zero.
        let mut workspace = unsafe { Workspace::assume_zeroed(self.workspace.slice_mut(..)) };
        self.plan.run(
            &self.stream,
            &mut workspace,
            &mut BatchPagedDecodeArgs {
                q: TensorRef::new(self.q.slice(..), [b, hq, d]),
                k_data: TensorRef::new(self.k.slice(..), store),
                v_data: TensorRef::new(self.v.slice(..), store),
                indices,
                indptr,
                last_page_len,
                o: TensorMut::new(self.o.slice_mut(..), [b, hq, d]),
                lse: TensorMut::new(self.lse.slice_mut(..), [b, hq]),
            },
        )
    }
}

/// The shards of one problem on every device, an NCCL communicator per device, and the gathered
/// outputs.
pub struct TensorParallel {
    pub shards: Vec<Resident>,
    comms: Vec<Comm>,
    gathered_o: Vec<CudaSlice<f16>>,
    gathered_lse: Vec<CudaSlice<f32>>,
}

impl TensorParallel {
    /// Shards `problem` over `devices` (their number must divide the KV heads).
    pub fn new(devices: &[Device], problem: &HostDecode) -> Result<Self, Box<dyn std::error::Error>> {
        let world = devices.len();
        let kv_heads = problem.desc.paged_kv.num_kv_heads as usize;
        if world == 0 || !kv_heads.is_multiple_of(world) {
            return Err(format!("{world} GPUs cannot share {kv_heads} KV heads evenly").into());
        }
        let shards = devices
            .iter()
            .enumerate()
            .map(|(rank, dev)| Resident::upload(dev, &problem.shard(rank, world)))
            .collect::<Result<Vec<_>, _>>()?;
        let comms = Comm::from_devices(devices.iter().map(|d| d.stream.clone()).collect())
            .map_err(|e| format!("NCCL communicator: {e:?}"))?;
        let mut gathered_o = Vec::new();
        let mut gathered_lse = Vec::new();
        for s in &shards {
            gathered_o.push(s.stream.clone_htod(&vec![f16::NAN; s.o.len() * world])?);
            gathered_lse.push(s.stream.clone_htod(&vec![f32::NAN; s.lse.len() * world])?);
        }
        Ok(Self { shards, comms, gathered_o, gathered_lse })
    }

    /// One step: every shard decodes on its stream, then one grouped all-gather of `o` and
    /// `lse` (enqueued on the same streams, so it follows each decode).
    pub fn step(&mut self) -> Result<(), Box<dyn std::error::Error>> {
        for s in &mut self.shards {
            s.decode()?;
        }
        let nccl_err = |e: nccl::NcclError| format!("NCCL all-gather: {e:?}");
        nccl::group_start().map_err(nccl_err)?;
        // The group is ended whatever happens inside it: NCCL calls after an open group (the
        // communicators' aborts on drop among them) would join it.
        let enqueued = (|| {
            for (rank, comm) in self.comms.iter().enumerate() {
                let s = &self.shards[rank];
                comm.all_gather(&s.o, &mut self.gathered_o[rank])?;
                comm.all_gather(&s.lse, &mut self.gathered_lse[rank])?;
            }
            Ok(())
        })();
        let ended = nccl::group_end();
        enqueued.map_err(nccl_err)?;
        ended.map_err(nccl_err)?;
        Ok(())
    }

    /// Waits for every device.
    pub fn synchronize(&self) -> Result<(), paged_decode::Error> {
        for s in &self.shards {
            s.stream.synchronize()?;
        }
        Ok(())
    }

    /// Rank `rank`'s gathered `(o, lse)`, reordered to `[batch, num_qo_heads, head_dim]` and
    /// `[batch, num_qo_heads]`.
    pub fn gathered(
        &self,
        rank: usize,
        head_dim: usize,
    ) -> Result<(Vec<f16>, Vec<f32>), paged_decode::Error> {
        let stream = &self.shards[rank].stream;
        let (o, lse) =
            (stream.clone_dtoh(&self.gathered_o[rank])?, stream.clone_dtoh(&self.gathered_lse[rank])?);
        let world = self.shards.len();
        let (batch, heads_per_rank) = (self.shards[0].shape.0 as usize, self.shards[0].shape.1 as usize);
        Ok((
            rank_major_to_head_major(&o, world, batch, heads_per_rank * head_dim),
            rank_major_to_head_major(&lse, world, batch, heads_per_rank),
        ))
    }
}

/// `[world][batch][row]` → `[batch][world][row]` (rows of `row` elements).
fn rank_major_to_head_major<T: Copy>(v: &[T], world: usize, batch: usize, row: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(v.len());
    for b in 0..batch {
        for r in 0..world {
            let start = (r * batch + b) * row;
            out.extend_from_slice(&v[start..start + row]);
        }
    }
    out
}

/// Whether libnccl can be loaded. With cudarc's linking mode (`dynamic-linking`) the library is
/// a link-time dependency, so present whenever the program runs.
pub fn nccl_present() -> bool {
    // cudarc loads its libraries at run time under `dynamic-loading`, and under
    // `fallback-dynamic-loading` unless a linking mode is chosen too.
    #[cfg(any(
        feature = "dynamic-loading",
        all(feature = "fallback-dynamic-loading", not(feature = "dynamic-linking"))
    ))]
    // SAFETY: only probes for the shared library.
    return unsafe { paged_decode::cudarc::nccl::sys::is_culib_present() };
    #[cfg(not(any(
        feature = "dynamic-loading",
        all(feature = "fallback-dynamic-loading", not(feature = "dynamic-linking"))
    )))]
    true
}

/// The visible GPUs, as many as share the KV heads evenly (the most that divide them: 4 of 6
/// visible for 8 heads), or `None` after saying why the example cannot run.
pub fn open_all(who: &str) -> Result<Option<Vec<Device>>, Error> {
    let first = match Device::open(0) {
        Ok(d) => d,
        Err(Error::NoDevice) => {
            println!("{who}: no CUDA driver or GPU on this machine; it needs two NVIDIA GPUs");
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let visible = CudaContext::device_count()? as usize;
    let count = (1..=visible.min(KV_HEADS)).rev().find(|&n| KV_HEADS.is_multiple_of(n)).unwrap_or(1);
    if count < 2 {
        println!("{who}: {visible} GPU visible; it needs at least two");
        return Ok(None);
    }
    let mut devices = vec![first];
    for ordinal in 1..count {
        devices.push(Device::open(ordinal)?);
    }
    Ok(Some(devices))
}

/// Step times and the largest error of the single-GPU and the sharded decode against the
/// float64 reference.
pub struct Report {
    /// µs per step on one GPU.
    pub single_us: f64,
    /// µs per step sharded over all of them, the all-gather included.
    pub parallel_us: f64,
    /// Largest relative error of `o` (per request) or absolute error of `lse` against the float64
    /// reference, over the single-GPU output and every GPU's gathered copy.
    pub worst_error: f64,
}

/// Decodes `problem` on the first GPU and sharded over all of `devices`, timing `steps` steps of
/// each, and compares the single-GPU output and every GPU's gathered copy with the float64
/// reference.
pub fn compare(
    devices: &[Device],
    problem: &HostDecode,
    steps: usize,
) -> Result<Report, Box<dyn std::error::Error>> {
    let expected =
        reference::decode(&problem.desc, &problem.q, &problem.k, &problem.v, problem.table.view())?;
    let row = QO_HEADS * HEAD_DIM;
    let worst_of = |o: &[f16], lse: &[f32]| {
        (0..problem.desc.batch_size as usize).fold(0f64, |worst, b| {
            let err = rel_err(&o[b * row..(b + 1) * row], &expected.o[b * row..(b + 1) * row]);
            let heads = b * QO_HEADS..(b + 1) * QO_HEADS;
            worst.max(err).max(lse_err(&lse[heads.clone()], &expected.lse[heads]))
        })
    };
    let mut single = Resident::upload(&devices[0], problem)?;
    let single_us = time_steps(&mut single, steps)?;
    let (o, lse) = (single.stream.clone_dtoh(&single.o)?, single.stream.clone_dtoh(&single.lse)?);
    let mut worst = worst_of(&o, &lse);
    drop(single);

    let mut tp = TensorParallel::new(devices, problem)?;
    let parallel_us = time_steps(&mut tp, steps)?;
    for rank in 0..devices.len() {
        let (tp_o, tp_lse) = tp.gathered(rank, HEAD_DIM)?;
        worst = worst.max(worst_of(&tp_o, &tp_lse));
    }
    Ok(Report { single_us, parallel_us, worst_error: worst })
}

/// Something that enqueues one decode step and can wait for it.
trait Step {
    fn step(&mut self) -> Result<(), Box<dyn std::error::Error>>;
    fn wait(&self) -> Result<(), Box<dyn std::error::Error>>;
}

impl Step for Resident {
    fn step(&mut self) -> Result<(), Box<dyn std::error::Error>> {
        Ok(self.decode()?)
    }
    fn wait(&self) -> Result<(), Box<dyn std::error::Error>> {
        Ok(self.stream.synchronize()?)
    }
}

impl Step for TensorParallel {
    fn step(&mut self) -> Result<(), Box<dyn std::error::Error>> {
        TensorParallel::step(self)
    }
    fn wait(&self) -> Result<(), Box<dyn std::error::Error>> {
        Ok(self.synchronize()?)
    }
}

/// Mean wall time of one step over `steps` steps after a warm-up, all GPUs idle at both ends.
fn time_steps(target: &mut impl Step, steps: usize) -> Result<f64, Box<dyn std::error::Error>> {
    for _ in 0..5 {
        target.step()?;
    }
    target.wait()?;
    let start = Instant::now();
    for _ in 0..steps {
        target.step()?;
    }
    target.wait()?;
    Ok(start.elapsed().as_secs_f64() * 1e6 / steps.max(1) as f64)
}
