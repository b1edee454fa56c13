#!/usr/bin/env python3
"""Times FlashInfer's batched paged-KV decode (BatchDecodeWithPagedKVCacheWrapper, both its
CUDA-core and tensor-core paths; "best" is the faster) on a shape table, with the method of
`paged-decode bench` (see common.py). Needs torch, and the flashinfer-python 0.5.3 and
apache-tvm-ffi wheels (scripts/fetch-anchor-wheels); the first call of each head_dim
JIT-compiles FlashInfer's kernels with the machine's nvcc (about 15 s).

usage: bench.py SHAPES.json [--out FI.json] [--check]
  --check  also compare the output with a float64 reference (first three requests); a path whose
           error is above CHECK_TOL (or NaN) is marked wrong and does not count as the row's best
FI.json: [{name, bytes, cuda_core_us, tensor_core_us, best_us, [*_relerr], [*_error]}]
"""
import argparse
import sys

import torch
import flashinfer

from common import DEV, Problem, graph_time_us, load_shapes, save_rows


# Relative error above which a path's output is taken as wrong (FlashInfer's f16 / bf16 outputs
# are within 3e-3 of the reference; an unsupported configuration gives errors of order 1).
CHECK_TOL = 0.05


def time_path(problem, tensor_cores, check):
    """{"<path>_us": µs[, "<path>_relerr": err]} for one FlashInfer path, or its error."""
    s = problem.shape
    key = "tensor_core" if tensor_cores else "cuda_core"
    try:
        workspace = torch.empty(128 << 20, dtype=torch.uint8, device=DEV)
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            workspace, s.get("layout", "HND"), use_tensor_cores=tensor_cores)
        wrapper.plan(problem.indptr, problem.indices, problem.last_page_len, s["hq"], s["hkv"], s["d"], s["page"],
                     q_data_type=problem.q.dtype, kv_data_type=problem.k.dtype,
                     window_left=problem.window_left, logits_soft_cap=s.get("soft_cap"))
        out = torch.empty_like(problem.q)
        row = {f"{key}_us": graph_time_us(lambda: wrapper.run(problem.q, (problem.k, problem.v), out=out), problem)}
        if check:
            err = problem.max_rel_err(out)
            row[f"{key}_relerr"] = err
            if not err <= CHECK_TOL:
                row[f"{key}_wrong"] = True
        return row
    except Exception as ex:  # the CUDA-core path rejects some GQA group sizes
        return {f"{key}_us": None, f"{key}_error": repr(ex)[:160]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shapes")
    ap.add_argument("--out")
    ap.add_argument("--check", action="store_true", help="compare FlashInfer against a float64 reference")
    args = ap.parse_args()
    print(f"flashinfer {flashinfer.__version__} on {torch.cuda.get_device_name()}")
    print(f"{'shape':30s} {'MB':>8s} {'cuda-core us':>13s} {'tensor-core us':>15s} {'best TB/s':>10s}")
    fmt = lambda t: f"{t:10.1f}" if t is not None else "      FAIL"
    results = []
    for i, shape in enumerate(load_shapes(args.shapes)):
        try:
            problem = Problem(shape, seed=1000 + i)
        except Exception as ex:  # a row whose data cannot be made is reported, not fatal
            row = {"name": shape["name"], "best_us": None, "error": repr(ex)[:300]}
            results.append(row)
            print(f"{shape['name']:30s} error: {row['error']}", flush=True)
            save_rows(results, args.out)
            continue
        row = {"name": shape["name"], "bytes": problem.bytes_read()}
        for tensor_cores in (False, True):
            row.update(time_path(problem, tensor_cores, args.check))
        times = [row[f"{key}_us"] for key in ("cuda_core", "tensor_core")
                 if row[f"{key}_us"] is not None and not row.get(f"{key}_wrong")]
        row["best_us"] = min(times) if times else None
        results.append(row)
        tb_s = row["bytes"] / (row["best_us"] * 1e-6) / 1e12 if row["best_us"] else float("nan")
        wrong = [key for key in ("cuda_core", "tensor_core") if row.get(f"{key}_wrong")]
        note = f"  wrong output: {', '.join(wrong)}" if wrong else ""
        print(f"{shape['name']:30s} {row['bytes'] / 1e6:8.1f} {fmt(row['cuda_core_us']):>13s} "
              f"{fmt(row['tensor_core_us']):>15s} {tb_s:10.2f}{note}", flush=True)
        save_rows(results, args.out)


if __name__ == "__main__":
    sys.exit(main())
