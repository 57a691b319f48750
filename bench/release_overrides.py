"""Which release's tiles serve the installed Triton: every override of the release table, timed at P1.

For each Triton or Gluon rung with an entry in any release's overrides (``common.toolchain.releases``)
at D=128, this times the rung's tile as the installed release resolves it against that tile with each
release's override applied, at P1 (B=2 H=16 S=8192 D=128 bf16, causal and not). Candidates run in
interleaved rounds, each round in a rotated order, and every candidate is first judged by its rung's
rule on a ragged shape (poisoned output, fp64 reference). One JSON line per candidate, then a table.

    python -m bench.release_overrides [ROUNDS]          # from the project root, on a GPU
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys

import torch
import triton

from bench import require_gpu
from common.contract.check import check_implementation
from common.contract.inputs import make_inputs
from common.contract.problem import Problem
from common.contract.registry import Implementation, get
from common.measure.timing import tflops, time_cuda
from common.toolchain.releases import RELEASE_OVERRIDES, tile_key_name, triton_release

HEAD_DIM = 128


def _key_matches(key: object, causal: bool) -> bool:
    head_dim, key_causal = key if isinstance(key, tuple) else (key, None)
    return head_dim == HEAD_DIM and key_causal in (None, causal)


def candidates(causal: bool) -> list[tuple[str, str, object, object]]:
    """(label, rung, table key, tile) for the installed table and each release's override of it."""
    found: dict[tuple[str, object], dict[str, dict]] = {}
    for release, overrides in RELEASE_OVERRIDES.items():
        for (rung, key), fields in overrides.items():
            if _key_matches(key, causal):
                found.setdefault((rung, key), {})[release] = fields
    rows = []
    for (rung, key), by_release in sorted(found.items(), key=str):
        installed = get(rung).default_configs[key]
        rows.append((f"{rung} {tile_key_name(key)} installed ({triton_release()})", rung, key, installed))
        for release, fields in by_release.items():
            tile = dataclasses.replace(installed, **fields)
            if tile != installed:
                rows.append((f"{rung} {tile_key_name(key)} {release}'s {fields}", rung, key, tile))
    return rows


def prepared(impl: Implementation, key: object, tile: object, problem: Problem, *tensors: torch.Tensor):
    """The rung prepared with ``tile`` in its table (the table is restored afterwards)."""
    table = impl.default_configs
    saved = table[key]
    table[key] = tile
    try:
        check = check_implementation(impl, Problem(1, 3, 77, 1000, HEAD_DIM, causal=problem.causal), device="cuda")
        return check, impl.prepare(*tensors, problem)
    finally:
        table[key] = saved


def main() -> int:
    require_gpu("python -m bench.release_overrides")
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    print(f"triton {triton.__version__} (table of {triton_release()}), {torch.cuda.get_device_name()}", flush=True)
    results: dict[str, list[float]] = {}
    for causal in (False, True):
        problem = Problem.canonical(8192, causal=causal)
        q, k, v = make_inputs(problem, device="cuda", seed=0)
        runs = {}
        for label, rung, key, tile in candidates(causal):
            check, run = prepared(get(rung), key, tile, problem, q, k, v)
            label = f"{label}{' causal' if causal else ''}"
            print(json.dumps({"label": label, "ok": check.ok, "check": check.summary()}), flush=True)
            if check.ok:
                runs[label] = run
        labels = list(runs)
        for round_index in range(rounds):
            shift = round_index % len(labels)
            for label in labels[shift:] + labels[:shift]:
                results.setdefault(label, []).append(tflops(problem.flops, time_cuda(runs[label]).ms))
    width = max(map(len, results))
    for label, samples in results.items():
        print(f"{label:<{width}}  {statistics.median(samples):7.1f} TFLOP/s  ({len(samples)} rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
