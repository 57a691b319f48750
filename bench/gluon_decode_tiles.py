"""gluon/decode's tile (key block, ring depth) against triton/decode and sdpa/cudnn on decode shapes.

Each candidate is a registry row at its default (``triton/decode``, ``sdpa/cudnn``, ``gluon/decode``) or
gluon/decode with another ``DecodeConfig`` at D=128. Every decode candidate is first judged on a ragged
GQA shape (poisoned output, fp64 reference, forced splits 1 and 5), then the candidates are timed per
shape in interleaved rounds, each round in a rotated order (L2 flushed, ``common.measure.timing``).
One JSON line per judgement and per timed row: median µs, K+V GB/s and the share of the HBM read
bandwidth measured in the same process. Tiles of 64 keys with two or three stages fit two CTAs on an
SM (80 or 112 KB of shared memory), the default three 128-key stages one (208 KB).

    python -m bench.gluon_decode_tiles [ROUNDS]          # from the project root, on an sm_90 GPU
"""

from __future__ import annotations

import dataclasses
import functools
import json
import statistics
import sys
from collections.abc import Callable

import torch
import triton

from bench import require_gpu
from common.contract.check import check_on_inputs
from common.contract.inputs import make_inputs
from common.contract.problem import Problem
from common.contract.registry import BASELINE_STACKS, Implementation, get
from common.measure.decode_sweep import DecodeCase, decode_problem
from common.measure.peaks import measure_read_gbps
from common.measure.timing import time_cuda
from triton_impl.gluon import decode as gluon_decode
from triton_impl.gluon.decode import DecodeConfig

HEAD_DIM = 128
# (label, registry name, tile at D=128 or None for the row's default).
CANDIDATES: list[tuple[str, str, DecodeConfig | None]] = [
    ("sdpa/cudnn", "sdpa/cudnn", None),
    ("triton/decode", "triton/decode", None),
    ("gluon/decode 128x3 (default)", "gluon/decode", None),
    ("gluon/decode 128x2", "gluon/decode", DecodeConfig(128, 2)),
    ("gluon/decode 64x6", "gluon/decode", DecodeConfig(64, 6)),
    ("gluon/decode 64x3 (2 CTAs/SM)", "gluon/decode", DecodeConfig(64, 3)),
    ("gluon/decode 64x2 (2 CTAs/SM)", "gluon/decode", DecodeConfig(64, 2)),
]
# (batch, KV heads, cache length) of the timed shapes: the sweep's caches of 256 MB and more, and a small one.
SHAPES = [(1, 8, 131072), (8, 8, 32768), (1, 32, 131072), (8, 8, 131072), (64, 8, 4096), (1, 8, 4096)]


def prepared(impl: Implementation, tile: DecodeConfig | None, *tensors: torch.Tensor, **options) -> Callable:
    """The row prepared with ``tile`` in gluon/decode's table (restored afterwards; the launch keeps it)."""
    if tile is None:
        return impl.prepare(*tensors, **options)
    saved = gluon_decode.DEFAULT_CONFIGS[HEAD_DIM]
    gluon_decode.DEFAULT_CONFIGS[HEAD_DIM] = tile
    try:
        return impl.prepare(*tensors, **options)
    finally:
        gluon_decode.DEFAULT_CONFIGS[HEAD_DIM] = saved


def judged(label: str, name: str, tile: DecodeConfig | None) -> bool:
    """A decode candidate on a ragged GQA batch of 3 new tokens, against fp64, with one and five splits
    (a baseline row passes: compare.py judges those)."""
    problem = Problem(
        4, 32, 3, 5000, HEAD_DIM, dtype=torch.bfloat16, causal=True, kv_heads=8, causal_alignment="bottom_right",
        has_cache_seqlens=True, return_lse=True,
    )  # fmt: skip
    q, k, v = make_inputs(problem, seed=7, device="cuda")
    lengths = torch.tensor([5000, 0, 1667, 2], dtype=torch.int32, device="cuda")
    impl = get(name)
    if impl.stack in BASELINE_STACKS:
        return True
    ok = True
    for splits in (1, 5):
        forced = dataclasses.replace(impl, prepare=functools.partial(prepared, impl, tile, num_splits=splits))
        result = check_on_inputs(forced, q, k, v, problem, cache_seqlens=lengths)
        print(json.dumps({"judge": label, "splits": splits, "ok": result.ok, "summary": result.summary()}), flush=True)
        ok &= result.ok
    return ok


def bench(rounds: int) -> None:
    read_gbps = measure_read_gbps(torch.device("cuda"))
    print(json.dumps({"triton": triton.__version__, "device": torch.cuda.get_device_name(), "read_gbps": read_gbps}))
    passing = [candidate for candidate in CANDIDATES if judged(*candidate)]
    for batch, kv_heads, seqlen_k in SHAPES:
        case = DecodeCase(decode_problem(batch, seqlen_k, kv_heads))
        q, k, v = make_inputs(case.problem, seed=0, device="cuda")
        runs = []
        for label, name, tile in passing:
            impl = get(name)
            ok, reason = impl.check(case.problem, torch.device("cuda"))
            if ok:
                runs.append((label, prepared(impl, tile, q, k, v, case.problem)))
            else:
                print(json.dumps({"label": label, "case": case.describe(), "refused": reason}))
        samples: dict[str, list[float]] = {label: [] for label, _ in runs}
        for r in range(rounds):
            for label, run in runs[r % len(runs) :] + runs[: r % len(runs)]:
                samples[label].append(time_cuda(run, warmup_ms=25, rep_ms=100).ms)
        for label, _ in runs:
            us = statistics.median(samples[label]) * 1e3
            gbps = case.kv_bytes_read / (us * 1e-6) / 1e9
            row = {"label": label, "case": case.describe(), "us": round(us, 1), "gbps": round(gbps)}
            print(json.dumps({**row, "pct_read_bw": round(100 * gbps / read_gbps, 1)}), flush=True)
        del q, k, v, runs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    require_gpu("bench.gluon_decode_tiles")
    bench(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
