#!/usr/bin/env python3
"""Times TensorRT-LLM's XQA decode kernel, shipped in the FlashInfer 0.5.3 wheel
(trtllm_batch_decode_with_kv_cache, backend="xqa", that entry point's Hopper default), on a shape
table with the same data and method as bench.py. XQA takes pages of 16/32/64/128 tokens, HND
here, returns no lse and does not support e5m2; on Hopper its fp8 path is a GMMA kernel that
also rounds q to fp8. The output is always checked against the float64 reference.

usage: xqa.py SHAPES.json [--out XQA.json] [--only NAME,NAME]
XQA.json: [{name, bytes, xqa_us, xqa_relerr | xqa_error}]
"""
import argparse
import math
import sys

import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from common import DEV, Problem, graph_time_us, load_shapes, save_rows


def block_table(problem):
    """[batch, max pages] page ids, zero-padded: XQA's page table."""
    batch, widest = len(problem.lens), max(problem.pages)
    table = torch.zeros(batch, widest, dtype=torch.int32, device=DEV)
    for b in range(batch):
        table[b, :problem.pages[b]] = problem.indices[problem.indptr[b]:problem.indptr[b + 1]]
    return table


def time_xqa(problem):
    s = problem.shape
    try:
        table = block_table(problem)
        seq_lens = torch.tensor(problem.lens, dtype=torch.int32, device=DEV)
        workspace = torch.zeros(256 << 20, dtype=torch.uint8, device=DEV)
        out = torch.empty_like(problem.q)
        run = lambda: trtllm_batch_decode_with_kv_cache(
            problem.q, (problem.k, problem.v), workspace, table, seq_lens, table.shape[1] * s["page"],
            bmm1_scale=1.0 / math.sqrt(s["d"]), bmm2_scale=1.0, out=out, kv_layout="HND", backend="xqa")
        run()
        torch.cuda.synchronize()
        return {"xqa_relerr": problem.max_rel_err(out), "xqa_us": graph_time_us(run, problem)}
    except Exception as ex:
        return {"xqa_us": None, "xqa_error": repr(ex)[:300]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shapes")
    ap.add_argument("--out")
    ap.add_argument("--only", help="comma-separated shape names")
    args = ap.parse_args()
    only = set(args.only.split(",")) if args.only else None
    results = []
    for i, shape in enumerate(load_shapes(args.shapes)):  # seeds follow the table row, as in bench.py
        if only and shape["name"] not in only:
            continue
        try:
            problem = Problem(shape, seed=1000 + i)
            row = {"name": shape["name"], "bytes": problem.bytes_read(), **time_xqa(problem)}
        except Exception as ex:  # a row whose data cannot be made is reported, not fatal
            row = {"name": shape["name"], "xqa_us": None, "xqa_error": repr(ex)[:300]}
        results.append(row)
        print(shape["name"], row, flush=True)
        save_rows(results, args.out)


if __name__ == "__main__":
    sys.exit(main())
