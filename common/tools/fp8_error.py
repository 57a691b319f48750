"""FlashAttention-3's Table 3, reproduced: RMSE against fp64 on inputs with outliers (a GPU tool).

python -m common.tools.fp8_error --out-dir results/h200 [--speed]

Inputs Q, K, V ~ N(0, 1) + N(0, 100) x Bernoulli(0.001) (``common.contract.fp8.fa3_inputs``), B=2 H=16
S=4096 D=128 by default, causal and not. Rows: SDPA in fp16 and bf16, every 16-bit rung in both
dtypes, and each FP8 rung in the four quantisation variants of ``common.contract.fp8.VARIANTS`` (per-tensor,
block, rotation, block+rotation) from bf16 inputs, with the RMSE of the fp64 emulation of that
variant and whether the rung passes its rule. Writes ``fp8_error.csv`` and ``fp8_error.md``.

``--speed`` also times every FP8 variant at B=2 H=16 S=8192 D=128 (bf16 inputs), kernel only (the
inputs quantised once, untimed) and end to end (quantise, rotate and launch in every call), into
``fp8_speed.csv`` and ``fp8_speed.md``. Rungs are found through the registry, never imported here.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from common.contract.check import run_poisoned
from common.contract.fp8 import VARIANTS, fa3_inputs
from common.contract.metrics import FP8_RULE, emulation_stats, error_stats
from common.contract.problem import Problem
from common.contract.reference import reference_attention, sdpa
from common.contract.registry import Implementation, discover, get
from common.measure.results import write_rows
from common.measure.timing import tflops, time_cuda

# The FP8 rungs that take a ``quantisation`` in prepare, emulate and prepare_end_to_end.
VARIANT_RUNGS = ("triton/fp8", "gluon/fp8", "cute/fp8")
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
INPUT_SEED = 0
# FlashAttention-3 (Shah et al., 2024), Table 3: RMSE on the same input distribution.
FA3_TABLE_3 = (
    ("FP16 baseline (standard attention)", 3.2e-4),
    ("FlashAttention-3 FP16", 1.9e-4),
    ("FP8 baseline (per-tensor scaling)", 2.4e-2),
    ("FlashAttention-3 FP8 (block quantisation + incoherent processing)", 9.1e-3),
    ("FlashAttention-3 FP8 without block quantisation", 9.3e-3),
    ("FlashAttention-3 FP8 without incoherent processing", 2.4e-2),
)
SPEED_PROBLEM = dict(batch=2, heads=16, seqlen=8192, head_dim=128)


@dataclass
class ErrorRow:
    impl: str
    dtype: str
    variant: str
    causal: bool
    rmse: float
    emulated_rmse: float = math.nan
    rel_l2: float = math.nan
    max_abs_diff_to_emulation: float = math.nan
    bound_ratio: float = math.nan
    rule_ok: str = ""


@dataclass
class SpeedRow:
    impl: str
    variant: str
    causal: bool
    kernel_ms: float
    kernel_tflops: float
    end_to_end_ms: float
    end_to_end_tflops: float


# ----------------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------------
def sixteen_bit_rows(problem: Problem, dtype_name: str) -> list[ErrorRow]:
    """SDPA and every 16-bit rung that supports ``problem`` in its dtype."""
    q, k, v = fa3_inputs(problem, seed=INPUT_SEED, device="cuda")
    ref = reference_attention(q, k, v, problem)
    rows = [ErrorRow("sdpa", dtype_name, "-", problem.causal, error_stats(sdpa(q, k, v, problem), ref).rmse)]
    available, _ = discover(include_baselines=False)
    for impl in available:
        if impl.rung == "fp8" or not impl.check(problem, q.device)[0]:
            continue
        err = error_stats(run_poisoned(impl.prepare(q, k, v, problem)), ref)
        rows.append(ErrorRow(impl.name, dtype_name, "-", problem.causal, err.rmse, rel_l2=err.rel_l2_err))
        print(f"{impl.name} {dtype_name} causal={problem.causal}: rmse {err.rmse:.3e}", flush=True)
    return rows


def fp8_row(impl: Implementation, variant: str, q, k, v, problem: Problem, ref: torch.Tensor) -> ErrorRow:
    quantisation = VARIANTS[variant]
    out = run_poisoned(impl.prepare(q, k, v, problem, quantisation))
    emulated = impl.emulate(q, k, v, problem, quantisation)
    err = error_stats(out, ref)
    emulation = emulation_stats(out, emulated.out, emulated.bound, ref)
    ok, reason = FP8_RULE.judge(err, None, emulation)
    print(f"{impl.name} {variant} causal={problem.causal}: rmse {err.rmse:.3e} | {emulation.summary()}", flush=True)
    return ErrorRow(
        impl.name,
        "e4m3 (bf16 in)",
        variant,
        problem.causal,
        err.rmse,
        emulation.error.rmse,
        err.rel_l2_err,
        emulation.max_abs_diff,
        emulation.max_bound_ratio,
        "ok" if ok else f"wrong: {reason}",
    )


def fp8_rows(problem: Problem) -> list[ErrorRow]:
    q, k, v = fa3_inputs(problem, seed=INPUT_SEED, device="cuda")
    ref = reference_attention(q, k, v, problem)
    rows = []
    for name in VARIANT_RUNGS:
        impl = get(name)
        if not impl.check(problem, q.device)[0]:
            continue
        rows.extend(fp8_row(impl, variant, q, k, v, problem, ref) for variant in VARIANTS)
    return rows


def error_table(rows: list[ErrorRow], problem: Problem) -> str:
    by_key = {(row.impl, row.dtype, row.variant, row.causal): row for row in rows}
    keys = list(dict.fromkeys((row.impl, row.dtype, row.variant) for row in rows))
    lines = [
        "# FlashAttention-3's Table 3 on this project's kernels",
        "",
        f"`python -m common.tools.fp8_error`: B={problem.batch} H={problem.heads} S={problem.seqlen_q} "
        f"D={problem.head_dim}; Q, K, V ~ N(0, 1) + N(0, 100) x Bernoulli(0.001); RMSE against the fp64 "
        "attention of the (16-bit) inputs. FP8 rows: bf16 inputs quantised by the rung (variant), "
        "their fp64 emulation's RMSE, and the rung's verdict by its rule (`FP8_RULE`).",
        "",
        "| impl | dtype | variant | RMSE | RMSE causal | emulated | emulated causal | rule |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for impl, dtype, variant in keys:
        full, causal = by_key.get((impl, dtype, variant, False)), by_key.get((impl, dtype, variant, True))
        cells = [
            _cell(full, "rmse"),
            _cell(causal, "rmse"),
            _cell(full, "emulated_rmse"),
            _cell(causal, "emulated_rmse"),
            " / ".join(row.rule_ok.split(":")[0] for row in (full, causal) if row and row.rule_ok) or "-",
        ]
        lines.append(f"| {impl} | {dtype} | {variant} | " + " | ".join(cells) + " |")
    lines += ["", "FlashAttention-3, Table 3 (same distribution, their kernels):", ""]
    lines += ["| FA3 row | RMSE |", "|---|---|"] + [f"| {name} | {value:.1e} |" for name, value in FA3_TABLE_3]
    return "\n".join(lines) + "\n"


def _cell(row: ErrorRow | None, field_name: str) -> str:
    value = getattr(row, field_name) if row else math.nan
    return "-" if math.isnan(value) else f"{value:.2e}"


# ----------------------------------------------------------------------------------------------------
# Speed
# ----------------------------------------------------------------------------------------------------
def speed_rows(causal: bool, warmup_ms: float, rep_ms: float) -> list[SpeedRow]:
    problem = Problem(
        SPEED_PROBLEM["batch"],
        SPEED_PROBLEM["heads"],
        SPEED_PROBLEM["seqlen"],
        SPEED_PROBLEM["seqlen"],
        SPEED_PROBLEM["head_dim"],
        dtype=torch.bfloat16,
        causal=causal,
    )
    q, k, v = fa3_inputs(problem, seed=INPUT_SEED, device="cuda")
    rows = []
    for name in VARIANT_RUNGS:
        impl = get(name)
        for variant, quantisation in VARIANTS.items():
            kernel = time_cuda(impl.prepare(q, k, v, problem, quantisation), warmup_ms=warmup_ms, rep_ms=rep_ms)
            end_to_end = time_cuda(
                impl.prepare_end_to_end(q, k, v, problem, quantisation), warmup_ms=warmup_ms, rep_ms=rep_ms
            )
            row = SpeedRow(
                name,
                variant,
                causal,
                kernel.ms,
                tflops(problem.flops, kernel.ms),
                end_to_end.ms,
                tflops(problem.flops, end_to_end.ms),
            )
            print(row, flush=True)
            rows.append(row)
    return rows


def speed_table(rows: list[SpeedRow]) -> str:
    per_tensor = {(row.impl, row.causal): row for row in rows if row.variant == "per-tensor"}
    lines = [
        "# FP8 quantisation variants: speed",
        "",
        "`python -m common.tools.fp8_error --speed`: B={batch} H={heads} S={seqlen} D={head_dim}, bf16 inputs "
        "(FA3's distribution). Kernel: the inputs quantised once, untimed. End to end: quantise (and "
        "rotate) plus the kernel in every call. TFLOP/s on visible scores; x per-tensor: kernel speed "
        "over the per-tensor kernel's in the same run.".format(**SPEED_PROBLEM),
        "",
        "| impl | causal | variant | kernel TFLOP/s | x per-tensor | end-to-end TFLOP/s |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        ratio = row.kernel_tflops / per_tensor[(row.impl, row.causal)].kernel_tflops
        lines.append(
            f"| {row.impl} | {row.causal} | {row.variant} | {row.kernel_tflops:.0f} | {ratio:.3f} | "
            f"{row.end_to_end_tflops:.0f} |"
        )
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--speed", action="store_true", help="also time every FP8 variant (fp8_speed.*)")
    parser.add_argument("--warmup-ms", type=float, default=50.0)
    parser.add_argument("--rep-ms", type=float, default=300.0)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("common.tools.fp8_error needs a CUDA GPU")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    rows: list[ErrorRow] = []
    problem = Problem(args.batch, args.heads, args.seqlen, args.seqlen, args.head_dim)
    for causal in (False, True):
        rows.extend(fp8_rows(problem.with_(dtype=torch.bfloat16, causal=causal)))
        for dtype_name, dtype in DTYPES.items():
            rows.extend(sixteen_bit_rows(problem.with_(dtype=dtype, causal=causal), dtype_name))
        # Written after each mask, so that a run cut short keeps what it measured.
        write_rows(args.out_dir / "fp8_error.csv", rows)
        (args.out_dir / "fp8_error.md").write_text(error_table(rows, problem))
    print(error_table(rows, problem))
    if args.speed:
        timed = [row for causal in (False, True) for row in speed_rows(causal, args.warmup_ms, args.rep_ms)]
        write_rows(args.out_dir / "fp8_speed.csv", timed)
        (args.out_dir / "fp8_speed.md").write_text(speed_table(timed))
        print(speed_table(timed))


if __name__ == "__main__":
    main()
