"""cute's backward preprocess (``cute_impl/backward/tiled.py``'s ``_PreprocessKernel``: D = rowsum(dO ∘ O), LSE₂)
against the same kernel from another version of that file, issue #40: each row's LSE loaded with its O and dO
(this tree) against loaded after the row's D was stored (f6bf187 and before: sm_90a SASS shows eight dependent 4-byte
loads in series at each CTA's end; 48.2 µs at B=8 H=16 S=2048 D=128 against gluon's 35.8 for the same bytes,
results/h200/backward-kernels-2026-12-04/). Per shape: the two kernels on the same O, dO and LSE (the LSE with -inf
rows), D and LSE₂ checked bit-equal between them and against torch's, then ``--rounds`` interleaved rounds (medians,
L2 flushed, ``common.measure.timing.time_cuda``), µs and the read bandwidth (O and dO). Also dLSE given (the LSE's
gradient: D − dLSE). Writes ``cute_bwd_preprocess.csv`` and ``.md`` to ``--out``.

usage (project root, GPU, the CuTe DSL):
    git show f6bf187:cute_impl/backward/tiled.py > ab_base_tiled.py
    python -m bench.cute_bwd_preprocess_ab --base ab_base_tiled.py [--out DIR] [--rounds 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from pathlib import Path
from types import ModuleType

import torch

from bench import interleaved, require_gpu
from common.contract.problem import Problem
from common.measure.results import write_rows
from common.measure.timing import time_cuda

# (batch, heads, seqlen, head_dim, with dLSE): the backward anchors' row counts (bench.backward).
SHAPES = ((8, 16, 2048, 128, False), (2, 16, 8192, 128, False), (4, 32, 8192, 64, False), (8, 16, 2048, 128, True))


def base_module(path: Path) -> ModuleType:
    """``path`` (a copy of tiled.py) imported under a name of its own, so that both versions compile."""
    spec = importlib.util.spec_from_file_location("cute_impl.backward.tiled_base", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def inputs(shape: tuple) -> tuple:
    batch, heads, seqlen, head_dim, with_dlse = shape
    generator = torch.Generator(device="cuda").manual_seed(0)
    out, d_out = (torch.randn(batch, heads, seqlen, head_dim, device="cuda", dtype=torch.bfloat16,
                              generator=generator) for _ in "01")  # fmt: skip
    lse = torch.randn(batch, heads, seqlen, device="cuda", generator=generator) * 4
    lse[..., ::97] = float("-inf")  # rows that see no key
    d_lse = torch.randn(batch, heads, seqlen, device="cuda", generator=generator) if with_dlse else None
    return out, d_out, lse, d_lse


def launcher(module: ModuleType, shape: tuple, operands: tuple):
    """The module's preprocess at ``shape`` and its (D, LSE₂) outputs, poisoned with NaN."""
    batch, heads, seqlen, head_dim, with_dlse = shape
    problem = Problem(batch, heads, seqlen, seqlen, head_dim, dtype=torch.bfloat16)
    kernel = module.KERNELS["preprocess"].kernel(module.backward_config(problem, with_dlse))
    delta, lse2 = (torch.full((batch, heads, seqlen), float("nan"), device="cuda") for _ in "01")
    out, d_out, lse, d_lse = operands
    return (lambda: kernel(out, d_out, lse, d_lse, lse2, delta, None)), delta, lse2


def check(operands: tuple, outputs: list[tuple]) -> None:
    """Both kernels' D and LSE₂ equal bit for bit, and D within fp32 summation error of torch's."""
    out, d_out, lse, d_lse = operands
    expected = (out.float() * d_out.float()).sum(-1) - (d_lse if d_lse is not None else 0)
    (delta, lse2), (base_delta, base_lse2) = outputs
    assert torch.equal(delta, base_delta) and torch.equal(lse2, base_lse2), "D or LSE2 differs from the base's"
    assert torch.allclose(delta, expected, rtol=1e-4, atol=1e-3), "D differs from rowsum(dO * O)"
    assert not lse2.isnan().any() and (lse2[lse == float("-inf")] == float("inf")).all()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, required=True, help="a copy of cute_impl/backward/tiled.py to compare")
    parser.add_argument("--out", type=Path, default=Path("runs/cute_bwd_preprocess"))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    require_gpu("bench.cute_bwd_preprocess_ab")
    from cute_impl.backward import tiled

    versions = {"this tree": tiled, "base": base_module(args.base)}
    rows = []
    for shape in SHAPES:
        operands = inputs(shape)
        launches = {name: launcher(module, shape, operands) for name, module in versions.items()}
        for run, *_ in launches.values():
            run()
        check(operands, [outputs for _, *outputs in launches.values()])
        samples = interleaved(
            launches, args.rounds, lambda launch: time_cuda(launch[0], warmup_ms=10, rep_ms=100).ms * 1e3
        )
        read_bytes = 2 * operands[0].numel() * operands[0].element_size()
        for name, values in samples.items():
            us = statistics.median(values)
            gbps = round(read_bytes / us / 1e3)
            rows.append({"batch": shape[0], "heads": shape[1], "seqlen": shape[2], "head_dim": shape[3],
                         "dlse": shape[4], "version": name, "us": round(us, 2), "read_gbps": gbps,
                         "spread_us": round(max(values) - min(values), 2)})  # fmt: skip
            print(rows[-1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    write_rows(args.out / "cute_bwd_preprocess.csv", rows)
    lines = [
        f"# cute backward preprocess, this tree against {args.base.name}, {torch.cuda.get_device_name()}",
        "",
        "| B | H | S | D | dLSE | version | µs | read GB/s | spread µs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {r['batch']} | {r['heads']} | {r['seqlen']} | {r['head_dim']} | {r['dlse']} | {r['version']} | "
              f"{r['us']} | {r['read_gbps']} | {r['spread_us']} |" for r in rows]  # fmt: skip
    (args.out / "cute_bwd_preprocess.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
