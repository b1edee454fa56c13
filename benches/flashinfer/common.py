"""Shape tables, test data, the float64 reference and the timing method shared by bench.py and
xqa.py. The method is the one `paged-decode bench` uses: random data, pages in a random
permutation, 20 calls captured in one CUDA graph, time per call = median of 15 replays / 20;
bytes = K/V actually read + q + o.

Shape table: a JSON list of {"name", "batch", "kv_len" | "lens": [...], "hq", "hkv", "d", "page",
"dtype": "f16" | "bf16"}, optionally "kv_dtype": "e4m3" | "e5m2" (an fp8 K/V cache; q and o stay in
"dtype"; scales 1), "layout": "HND" (default) | "NHD", "soft_cap": float (logits -> cap *
tanh(logits / cap)), "window_left": int (attend to the last window_left + 1 tokens; -1 = all).
"batch" may be left out when "lens" is given.

PAGED_DECODE_SEPARATED=1 (as `paged-decode bench --separated`): each timed call is preceded by a
SEPARATOR_BYTES device-to-device copy (a memcpy node in the graph, which no launch overlaps), and
a graph of the copies alone is timed and subtracted, so that each call follows an unrelated
operation instead of the call before it. PAGED_DECODE_SEPARATOR_BYTES sets the copy's size:
134217728 (128 MiB, as `paged-decode bench --cold-l2`) leaves L2 holding none of the call's data.
PAGED_DECODE_SEPARATOR_KIND=read makes the separator a read of that many bytes (a sum: L2 left
holding clean lines, as `paged-decode bench --clean-l2`) instead of a copy.

PAGED_DECODE_AFTER_APPEND=1 (as `paged-decode bench --after-append`): each timed call is preceded
(after its separator, if any) by FlashInfer's `append_paged_kv_cache` of one token per non-empty
request, overwriting the request's last token in place, as a serving step appends the new token
before the decode; a graph of the appends (and separators) alone is timed and subtracted.
"""
import json
import math
import os

import torch

DEV = "cuda"
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}
KV_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
CALLS_PER_GRAPH = 20
REPLAYS = 15
SEPARATOR_BYTES = 1 << 20


def save_rows(rows, path):
    """Writes the rows measured so far to `path` whole or not at all (a temporary file renamed over
    it): a run stopped part-way leaves them."""
    if path:
        with open(path + ".partial", "w") as f:
            json.dump(rows, f, indent=1)
        os.replace(path + ".partial", path)


def load_shapes(path):
    """The rows of a shape table, each with "lens" filled in and checked."""
    shapes = json.load(open(path))
    for s in shapes:
        missing = [k for k in ("name", "hq", "hkv", "d", "page") if k not in s]
        if missing or not ("lens" in s or ("batch" in s and "kv_len" in s)):
            raise ValueError(f"{path}: row {s.get('name', s)} lacks {missing or 'lens / batch + kv_len'}")
        s["lens"] = s.get("lens") or [s["kv_len"]] * s["batch"]
        s.setdefault("dtype", "f16")
    return shapes


def graph_time_us(fn, problem=None):
    """Microseconds per call of `fn`: CALLS_PER_GRAPH calls in one CUDA graph, median of REPLAYS;
    with PAGED_DECODE_SEPARATED=1 each call after a separator, and with
    PAGED_DECODE_AFTER_APPEND=1 after `problem`'s append step, less the time of those alone."""
    before = [op for op in (_separator(), _append(problem)) if op]
    if not before:
        return _graph_time_us(fn)

    def before_call():
        for op in before:
            op()

    def call():
        before_call()
        fn()

    return _graph_time_us(call) - _graph_time_us(before_call)


def _append(problem):
    """The append PAGED_DECODE_AFTER_APPEND=1 puts before each call (after the separator), or None."""
    if os.environ.get("PAGED_DECODE_AFTER_APPEND") != "1":
        return None
    if problem is None:
        raise ValueError("PAGED_DECODE_AFTER_APPEND=1 needs the problem to append to")
    return problem.append_step()


def _separator():
    """The operation PAGED_DECODE_SEPARATED=1 puts before each call, or None."""
    if os.environ.get("PAGED_DECODE_SEPARATED") == "1":
        size = int(os.environ.get("PAGED_DECODE_SEPARATOR_BYTES", SEPARATOR_BYTES))
        if os.environ.get("PAGED_DECODE_SEPARATOR_KIND", "copy") == "read":
            src = torch.zeros(size // 4, dtype=torch.int32, device=DEV)
            copy = lambda: src.sum()  # one reduction kernel: reads the buffer, writes a scalar
        else:
            src = torch.zeros(size, dtype=torch.uint8, device=DEV)
            dst = torch.empty_like(src)
            copy = lambda: dst.copy_(src)  # contiguous, same type: one cudaMemcpyAsync
        return copy
    return None


def _graph_time_us(fn):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside the graph (JIT, allocations)
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS_PER_GRAPH):
            fn()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPLAYS):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1000.0 / CALLS_PER_GRAPH)
    return sorted(times)[len(times) // 2]


class Problem:
    """Random q and paged K/V for one shape row (CSR page table over a random permutation)."""

    def __init__(self, shape, seed):
        torch.manual_seed(seed)
        self.shape = shape
        self.lens = shape["lens"]
        hkv, d, page = shape["hkv"], shape["d"], shape["page"]
        dtype = DTYPES[shape["dtype"]]
        kv_dtype = KV_DTYPES[shape["kv_dtype"]] if shape.get("kv_dtype") else dtype
        self.pages = [max(1, (n + page - 1) // page) for n in self.lens]
        total = sum(self.pages)
        store = (total, page, hkv, d) if self.nhd else (total, hkv, page, d)
        self.k = torch.randn(*store, dtype=dtype, device=DEV).to(kv_dtype)
        self.v = torch.randn(*store, dtype=dtype, device=DEV).to(kv_dtype)
        self.indices = torch.randperm(total, device=DEV).int()
        self.indptr = torch.tensor([0] + torch.tensor(self.pages).cumsum(0).tolist(), dtype=torch.int32, device=DEV)
        self.last_page_len = torch.tensor(
            [n - (p - 1) * page for n, p in zip(self.lens, self.pages)], dtype=torch.int32, device=DEV)
        self.q = torch.randn(len(self.lens), shape["hq"], d, dtype=dtype, device=DEV)

    def append_step(self):
        """A callable appending one token per non-empty request with FlashInfer's
        `append_paged_kv_cache`, at the request's last position (its current last token, which
        the page table already counts), with that token's own K and V rows: the store keeps its
        values, so the reference holds (a one-token request of zeros has no relative error);
        None when no request has a token."""
        import flashinfer

        page = self.shape["page"]
        requests = [b for b, n in enumerate(self.lens) if n > 0]
        if not requests:
            return None
        last = [self.lens[b] - 1 for b in requests]
        pages = self.indices[[self.indptr[b].item() + n // page for b, n in zip(requests, last)]].long()
        slots = torch.tensor([n % page for n in last], device=DEV)
        k_rows, v_rows = ((t[pages, slots] if self.nhd else t[pages, :, slots]).contiguous() for t in (self.k, self.v))
        batch_indices = torch.tensor(requests, dtype=torch.int32, device=DEV)
        positions = torch.tensor(last, dtype=torch.int32, device=DEV)
        layout = "NHD" if self.nhd else "HND"
        return lambda: flashinfer.append_paged_kv_cache(
            k_rows, v_rows, batch_indices, positions, (self.k, self.v), self.indices, self.indptr,
            self.last_page_len, kv_layout=layout)

    @property
    def nhd(self):
        return self.shape.get("layout") == "NHD"

    @property
    def window_left(self):
        return self.shape.get("window_left", -1)

    def bytes_read(self):
        """K/V bytes actually read (a window's unread tokens do not count) plus q and o."""
        w = self.window_left
        tokens = sum(min(n, w + 1) if w >= 0 else n for n in self.lens)
        kv = 2 * tokens * self.shape["hkv"] * self.shape["d"] * self.k.element_size()
        return kv + 2 * self.q.numel() * self.q.element_size()

    def reference(self, b):
        """Float64 output of request `b`, [hq, d] (fp8 caches: against the dequantized values)."""
        hq, d = self.q.shape[1], self.q.shape[2]
        k, v = (self.k.transpose(1, 2), self.v.transpose(1, 2)) if self.nhd else (self.k, self.v)
        hkv = k.shape[1]
        ids = self.indices[self.indptr[b]:self.indptr[b + 1]].long()
        kk = k[ids].permute(1, 0, 2, 3).reshape(hkv, -1, d)[:, :self.lens[b]].double()
        vv = v[ids].permute(1, 0, 2, 3).reshape(hkv, -1, d)[:, :self.lens[b]].double()
        if self.window_left >= 0:
            first = max(0, self.lens[b] - 1 - self.window_left)
            kk, vv = kk[:, first:], vv[:, first:]
        logits = torch.einsum("hgd,hnd->hgn", self.q[b].double().view(hkv, hq // hkv, d), kk) / math.sqrt(d)
        cap = self.shape.get("soft_cap")
        if cap:
            logits = cap * torch.tanh(logits / cap)
        return torch.einsum("hgn,hnd->hgd", logits.softmax(-1), vv).reshape(hq, d)

    def max_rel_err(self, out, requests=3):
        """Largest relative L2 error of `out` over the first `requests` requests."""
        errs = []
        for b in range(min(len(self.lens), requests)):
            if self.lens[b] == 0:  # no reference row to compare with
                continue
            ref = self.reference(b)
            errs.append(((out[b].double() - ref).norm() / ref.norm()).item())
        return max(errs) if errs else 0.0
