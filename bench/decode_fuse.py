"""Issue #38's one launch per decode step: the fused merge against the two-launch one at small caches.

At B=1, Hkv=8 (32 query heads, D=128, bf16, bottom-right causal, ``cache_seqlens`` at the full
length) and 4k and 32k keys, each rung of :data:`bench.decode_floor.FUSED_RUNGS` is bound with its
split kernel merging by itself (``fused``) and with the merge as a second kernel (``two-launch``,
``FUSED_MERGE = False`` at bind), the split count by the rule. Per variant:

* ``ok``: the poisoned output against fp64 (``check_on_inputs``), and ``same_bits``: O (and the LSE)
  equal to the other variant's bit for bit (one ``merge_splits`` in both);
* ``eager_us`` / ``graph_us``: device time per step, median of ``do_bench`` (L2 flushed), launched
  eagerly and replayed from a CUDA graph;
* ``host_us``: wall time per step of :data:`HOST_STEPS` eager steps back to back (one synchronisation
  at the end): the rate an eager decode loop can issue steps, launch overhead included.

Writes ``decode_fuse.csv`` and ``decode_fuse.md`` under ``--out``.

    python -m bench.decode_fuse --out runs/decode-fuse       # from the project root, on a GPU
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bench import require_gpu
from common.measure.results import write_rows

SEQLENS_K = (4096, 32768)
VARIANTS = ("fused", "two-launch")
HOST_STEPS = 200
COLUMNS = ("impl", "seqlen_k", "variant", "num_splits", "ok", "same_bits", "eager_us", "graph_us", "host_us")


def host_us_per_step(run) -> float:
    """Wall µs per step of HOST_STEPS eager steps issued back to back."""
    import torch

    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(HOST_STEPS):
        run()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / HOST_STEPS * 1e6


def measure(impl, problem, inputs, lengths, variant: str, rep_ms: float) -> tuple[dict, tuple]:
    """One variant's row (without ``same_bits``) and its output tuple, FUSED_MERGE as the variant says
    at bind and restored after."""
    from common.contract.check import check_on_inputs, run_poisoned
    from common.measure.timing import time_cuda
    from triton_impl import decode as triton_decode

    saved = triton_decode.FUSED_MERGE
    triton_decode.FUSED_MERGE = variant == "fused"
    try:
        result = check_on_inputs(impl, *inputs, problem, cache_seqlens=lengths)
        run = impl.prepare(*inputs, problem, cache_seqlens=lengths)
    finally:
        triton_decode.FUSED_MERGE = saved
    out = run_poisoned(run)
    outputs = tuple(t.clone() for t in (out if isinstance(out, tuple) else (out,)))
    row = {
        "impl": impl.name, "seqlen_k": problem.seqlen_k, "variant": variant, "num_splits": run.num_splits,
        "ok": result.ok, "eager_us": time_cuda(run, warmup_ms=25, rep_ms=rep_ms).ms * 1e3,
        "graph_us": time_cuda(run, warmup_ms=25, rep_ms=rep_ms, cuda_graph=True).ms * 1e3,
        "host_us": host_us_per_step(run),
    }  # fmt: skip
    return row, outputs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/decode-fuse"), help="output folder")
    parser.add_argument("--rep", type=float, default=100.0, help="timed repetitions per variant, ms")
    args = parser.parse_args(argv)
    require_gpu("bench.decode_fuse")
    import torch

    from bench.decode_floor import FUSED_RUNGS
    from common.contract.inputs import make_inputs
    from common.contract.problem import Problem
    from common.contract.registry import discover

    available, _ = discover(include_baselines=False)
    impls = [impl for impl in available if impl.name in FUSED_RUNGS]
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    for seqlen_k in SEQLENS_K:
        problem = Problem(
            1, 32, 1, seqlen_k, 128, dtype=torch.bfloat16, causal=True, kv_heads=8,
            causal_alignment="bottom_right", has_cache_seqlens=True,
        )  # fmt: skip
        inputs = make_inputs(problem, seed=1, device="cuda", offset=0.5)
        lengths = torch.full((1,), seqlen_k, dtype=torch.int32, device="cuda")
        for impl in impls:
            measured = [measure(impl, problem, inputs, lengths, variant, args.rep) for variant in VARIANTS]
            same = all(map(torch.equal, measured[0][1], measured[1][1]))
            for row, _ in measured:
                rows.append({**row, "same_bits": same})
                print(
                    f"{impl.name:14s} Sk={seqlen_k:6d} {row['variant']:10s} splits={row['num_splits']:3d} "
                    f"ok={row['ok']} same_bits={same} eager {row['eager_us']:6.1f} us, graph "
                    f"{row['graph_us']:6.1f} us, host {row['host_us']:6.1f} us/step",
                    flush=True,
                )
    write_rows(args.out / "decode_fuse.csv", rows, COLUMNS)
    (args.out / "decode_fuse.md").write_text(markdown(rows))
    print((args.out / "decode_fuse.md").read_text())
    return 0 if rows and all(row["ok"] and row["same_bits"] for row in rows) else 1


def markdown(rows: list[dict]) -> str:
    lines = [
        "One launch per decode step (bench/decode_fuse.py): B=1 Hkv=8 H=32 D=128 bf16, µs per step",
        "",
        "| rung | Sk | variant | splits | ok | same bits | eager (device) | CUDA graph | eager host rate |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['impl']} | {row['seqlen_k']} | {row['variant']} | {row['num_splits']} | {row['ok']} | "
            f"{row['same_bits']} | {row['eager_us']:.1f} | {row['graph_us']:.1f} | {row['host_us']:.1f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
