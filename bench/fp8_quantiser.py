"""The fused FP8 quantiser against the torch one, and what it leaves of each FP8 rung's speed (issue #30).

At P1 (B=2 H=16 S=8192 D=128 bf16; ``--seqlen``, ``--heads``, ``--head-dim`` and ``--batch`` change it), on fresh
FA3-distributed inputs, every timing by ``common.measure.timing.time_cuda`` (L2 flushed before each run, median):

* Quantisers, Q, K and V together: the torch reference (``common.contract.fp8.quantise`` and V's
  layout by indexing, what the rungs ran before) and the fused one
  (``triton_impl.fp8_quantiser.FusedQuantiser``: tensor-core rotation, butterfly rotation), for
  every quantisation variant (``block`` and ``per-tensor`` have no rotation) and each kernel's V
  layout. Effective bandwidth counts Q, K, V read in bf16 once and e4m3 plus scales written once.
* Rungs (``triton/fp8``, ``gluon/fp8``, ``cute/fp8``, default quantisation), causal and not:
  kernel only (``prepare``: operands quantised once), end to end (``prepare_end_to_end``: the fused
  quantiser and the kernel per call, buffers held), per rotation method, and ``attention(impl=...)``
  per call (a new plan-bound launch per call: buffers allocated, quantiser and kernel launched). The
  end-to-end output is checked equal to the kernel-only one on the same inputs.

The issue's targets, reported per row: quantisation <= 10 % of the kernel's time, end to end
>= 0.9x the kernel's TFLOP/s. Writes ``fp8_quantiser.csv`` and ``fp8_quantiser.md`` to ``--out``.

``--sweep`` instead times the fused quantiser's knobs (``fp8_quantiser.QuantiserConfig``: one launch or
three, tiles per program, loads overlapped in registers or by cp.async stages, warps, register cap,
reciprocal or IEEE division) per variant, in V's layout for ``--sweep-layout`` (gluon/fp8's by default).
Each configuration is judged first: its operands against the torch reference (``operand_differences``:
bit-identical without rotation, the rotation rule with it) and its bytes against the variant's first
configuration (the knobs must not change a byte). One row per configuration: µs, GB/s, launches,
registers and spills, the two verdicts; a build that fails is a row saying so. Writes
``fp8_quantiser_sweep.csv`` and ``fp8_quantiser_sweep.md``.

``--ab`` times ``AB_CANDIDATES`` (a few configurations the static analysis favours; docs/perf-log.md) at P1,
block+rotation in gluon/fp8's V layout, each judged as in ``--sweep``, against the HBM read bandwidth
measured in the same run (``common.measure.peaks.measure_read_gbps``: µs, GB/s, % of it); then makes the
fastest passing one the rungs' configuration and times each FP8 rung kernel only and end to end, causal
and not, against the best bf16 rung (cute/hopper) in the same process. Writes ``fp8_quantiser_ab.csv``
and ``fp8_quantiser_ab.md``. ``--candidates`` replaces ``AB_CANDIDATES``; ``--e2e-each`` times every passing
candidate end to end (``--e2e-rounds`` interleaved rounds, medians), each beside the quantiser alone in the rung's
V layout, so that e2e - kernel - quantiser is what a call pays beyond its two launches.

``--ab --kv-only`` times the quantiser of K and V only (``FusedQuantiser(query=False)``, what cute/fp8 runs where its
kernel quantises Q) in cute/fp8's V layout: ``KV_AB_CANDIDATES`` (``--candidates kv-d128``: ``KV_D128_CANDIDATES``),
judged on K's and V's bytes and scales, then cute/fp8 end to end with the K/V-only default and the fastest candidate.
``--quantiser-rounds`` times the candidates again in interleaved rounds (medians).

A configuration ``A|B`` is A with V in a launch of its own under B (``QuantiserConfig.value_config``).
``--quantiser-config field=value,...`` runs any mode with another default configuration (the rungs'
quantiser too), so a configuration the sweep found can be timed end to end before it is committed.

usage (project root):  python -m bench.fp8_quantiser --out results/h200/fp8-quantiser [--only cute/fp8]
                       python -m bench.fp8_quantiser --sweep --out results/h100/fp8-quantiser-sweep
                       python -m bench.fp8_quantiser --ab --out results/h200/fp8-quantiser-ab
                       python -m bench.fp8_quantiser --ab --kv-only --quantiser-rounds 3 --e2e-rounds 3 --out DIR
                       python -m bench.fp8_quantiser --ab --kv-only --head-dim 64 --batch 4 --heads 32 --e2e-each \
                           --candidates "tiles_per_program=8,num_stages=2;tiles_per_program=8,num_stages=2|prefetch=1"
                       python -m bench.fp8_quantiser --out DIR --quantiser-config tiles_per_program=8,prefetch=true
Exits 2 with one line without a GPU.
"""

from __future__ import annotations

import argparse
import csv
import functools
import importlib
import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from bench import require_gpu
from common.contract import fp8
from common.contract.problem import Problem
from common.measure.results import write_rows
from triton_impl import fp8_quantiser

RUNGS = {"triton/fp8": "triton_impl.fp8", "gluon/fp8": "triton_impl.gluon.fp8", "cute/fp8": "cute_impl.fp8"}
LAYOUTS = {
    "triton/fp8": fp8.ValueLayout(permuted=False, key_multiple=16),
    "cute/fp8": fp8.ValueLayout(permuted=True, key_multiple=16),
    "gluon/fp8": fp8.ValueLayout(permuted=True, key_multiple=128),
}
# The targets: quantisation at most this share of the kernel's time, end to end at least this
# fraction of the kernel's TFLOP/s.
QUANTISE_SHARE_TARGET = 0.10
END_TO_END_TARGET = 0.9
E4M3_BYTES, SCALE_BYTES = 1, 4


@dataclass
class Row:
    kind: str  # "quantiser" or "rung"
    name: str
    variant: str
    method: str
    layout_of: str
    causal: bool
    ms: float
    tflops: float = float("nan")
    gbps: float = float("nan")
    note: str = field(default="")


def _bytes_moved(problem: Problem, query: bool = True) -> int:
    """Q (unless ``query`` is False), K and V read once in their dtype, written once in e4m3 with their block
    scales (the minimum)."""
    query_rows = problem.heads * problem.seqlen_q if query else 0
    elements = problem.batch * problem.head_dim * (query_rows + 2 * problem.kv_heads * problem.seqlen_k)
    scales = problem.batch * (query_rows // 64 + 2 * problem.kv_heads * problem.seqlen_k // 128)
    return elements * (problem.dtype.itemsize + E4M3_BYTES) + scales * SCALE_BYTES


def _time(run, args: argparse.Namespace) -> float:
    from common.measure.timing import time_cuda

    return time_cuda(run, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms).ms


def quantiser_rows(problem: Problem, inputs, args: argparse.Namespace) -> list[Row]:
    rows = []
    gbytes = _bytes_moved(problem) / 1e9
    for rung in args.only:
        layout = LAYOUTS[rung]
        for variant, quantisation in fp8.VARIANTS.items():
            runs = {"torch": lambda qn=quantisation, lay=layout: fp8.kernel_operands(fp8.quantise(*inputs, qn), lay)}
            methods = fp8_quantiser.ROTATION_METHODS if quantisation.rotation else ("none",)
            for method in methods:
                quantiser = fp8_quantiser.FusedQuantiser(
                    inputs[0].shape, inputs[1].shape, problem.dtype, inputs[0].device, quantisation, layout,
                    None if method == "none" else method,
                )  # fmt: skip
                runs[f"fused {method}"] = lambda fq=quantiser: fq(*inputs)
            for name, run in runs.items():
                ms = _time(run, args)
                kind, method = name.split(" ") if " " in name else (name, "-")
                rows.append(Row("quantiser", kind, variant, method, rung, False, ms, gbps=gbytes / (ms * 1e-3)))
                print(f"quantiser {name:20s} {variant:15s} V for {rung:10s} {ms * 1e3:9.1f} us", flush=True)
    return rows


def _with_method(method: str, build):
    """``build()`` with the fused quantiser's default rotation method set to ``method`` (the rungs and
    their emulations read it when they build their quantiser), restored afterwards."""
    saved = fp8_quantiser.DEFAULT_ROTATION_METHOD
    fp8_quantiser.DEFAULT_ROTATION_METHOD = method
    try:
        return build()
    finally:
        fp8_quantiser.DEFAULT_ROTATION_METHOD = saved


def one_rung_rows(rung: str, problem: Problem, inputs, args: argparse.Namespace) -> list[Row]:
    from common import attention, clear_plan_cache
    from common.measure.timing import tflops

    module = importlib.import_module(RUNGS[rung])
    variant = module.DEFAULT_QUANTISATION.name
    ok, reason = module.IMPLEMENTATION.check(problem, inputs[0].device)
    if not ok:
        print(f"{rung}: skipped, {reason}", flush=True)
        return []
    kernel_only = module.prepare(*inputs, problem)
    ms = _time(kernel_only, args)
    rows = [Row("rung", rung, variant, "-", "kernel only", problem.causal, ms, tflops(problem.flops, ms))]
    for method in fp8_quantiser.ROTATION_METHODS:
        # The same method's kernel-only output: the two methods' operands may differ by an e4m3 step.
        expected = _with_method(method, lambda: module.prepare(*inputs, problem)().clone())
        end_to_end = _with_method(method, lambda: module.prepare_end_to_end(*inputs, problem))
        note = "" if torch.equal(end_to_end(), expected) else "output differs from kernel only"
        ms = _time(end_to_end, args)
        rows.append(Row("rung", rung, variant, method, "end to end", problem.causal, ms, tflops(problem.flops, ms),
                        note=note))  # fmt: skip
    clear_plan_cache()
    per_call = functools.partial(attention, *inputs, causal=problem.causal, impl=rung)
    per_call()
    ms = _time(per_call, args)
    rows.append(Row("rung", rung, variant, fp8_quantiser.DEFAULT_ROTATION_METHOD, "attention() per call",
                    problem.causal, ms, tflops(problem.flops, ms)))  # fmt: skip
    for row in rows:
        print(f"{rung:10s} causal={problem.causal!s:5s} {row.layout_of:22s} {row.method:12s} "
              f"{row.ms * 1e3:9.1f} us {row.tflops:7.0f} TFLOP/s {row.note}", flush=True)  # fmt: skip
    return rows


def markdown(rows: list[Row], problem: Problem, device_name: str) -> str:
    shape = f"B={problem.batch} H={problem.heads} S={problem.seqlen_q} D={problem.head_dim} {problem.dtype_name}"
    lines = [f"# FP8 quantiser and rungs, {device_name} ({shape})", "",
             "## Quantisers (Q, K, V together)", "", "| V layout of | variant | quantiser | rotation | µs | GB/s |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for row in (r for r in rows if r.kind == "quantiser"):
        lines.append(
            f"| {row.layout_of} | {row.variant} | {row.name} | {row.method} | {row.ms * 1e3:.1f} | {row.gbps:.0f} |"
        )
    lines += ["", "## Rungs (default quantisation)", "",
              "| rung | causal | path | rotation | µs | TFLOP/s | x kernel | quantisation share of kernel | note |",
              "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    kernels = {(r.name, r.causal): r for r in rows if r.kind == "rung" and r.layout_of == "kernel only"}
    for row in (r for r in rows if r.kind == "rung"):
        kernel = kernels[row.name, row.causal]
        ratio = row.tflops / kernel.tflops
        share = (row.ms - kernel.ms) / kernel.ms
        flags = []
        if row.layout_of != "kernel only":
            flags += [] if share <= QUANTISE_SHARE_TARGET else [f"share > {QUANTISE_SHARE_TARGET:.0%}"]
            flags += [] if ratio >= END_TO_END_TARGET else [f"< {END_TO_END_TARGET}x kernel"]
        note = "; ".join(filter(None, [row.note, *flags]))
        lines.append(f"| {row.name} | {row.causal} | {row.layout_of} | {row.method} | {row.ms * 1e3:.1f} | "
                     f"{row.tflops:.0f} | {ratio:.2f} | {share:.1%} | {note} |")  # fmt: skip
    lines += ["", f"Targets (issue #30): quantisation <= {QUANTISE_SHARE_TARGET:.0%} of the kernel's time, end to end "
              f">= {END_TO_END_TARGET}x the kernel's TFLOP/s. Bytes per quantisation: "
              f"{_bytes_moved(problem) / 1e6:.0f} MB."]  # fmt: skip
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------------
# --sweep: the fused quantiser's knobs
# ----------------------------------------------------------------------------------------------------
Config = fp8_quantiser.QuantiserConfig
# The launch shape of the quantiser before the knobs: a launch per tensor, one tile per program, div.rn.
BEFORE = Config(single_launch=False, division="ieee")
# (variant, rotation method) swept, the full grid first.
SWEEP_CASES = {
    "block+rotation": ("tensor_core", "butterfly"),
    "block": ("tensor_core",),
    "rotation": ("tensor_core",),
    "per-tensor": ("tensor_core",),
}
FULL_GRID = (("block+rotation", "tensor_core"), ("block", "tensor_core"))


def sweep_configs(full: bool) -> list[Config]:
    """Each knob alone from ``BEFORE``, the default, then tiles per program x load overlap on one launch
    with the reciprocal division (``full``), or a short list around the expected best; no repeats."""
    configs = [BEFORE, replace(BEFORE, single_launch=True), replace(BEFORE, division="reciprocal"), Config(),
               fp8_quantiser.default_config(128, fp8.VARIANTS["block+rotation"])]  # fmt: skip
    for tiles in (2, 4, 8, 16) if full else (4,):
        configs += [
            Config(tiles_per_program=tiles),
            Config(tiles_per_program=tiles, prefetch=True, maxnreg=128),
            Config(tiles_per_program=tiles, num_stages=2),
        ]
        configs += [Config(tiles_per_program=tiles, num_stages=3)] if full else []
    if full:
        configs += [
            Config(tiles_per_program=4, maxnreg=96),
            Config(tiles_per_program=4, prefetch=True),
            Config(tiles_per_program=4, single_launch=False),
            Config(tiles_per_program=4, division="ieee"),
            Config(num_warps=16),
            Config(tiles_per_program=4, num_warps=16),
            Config(programs_per_sm=1, num_stages=3, num_warps=16, tma=True),
        ]
    return list(dict.fromkeys(configs))


@dataclass
class SweepRow:
    variant: str
    method: str
    config: str
    launches: int
    registers: str
    spills: str
    us: float
    gbps: float
    reference: str
    same_bytes: str
    note: str = ""


def _kernel_resources(quantiser) -> tuple[str, str]:
    """Registers and spilled bytes of the launched kernels (max over passes), as Triton reports them."""
    handles = list(quantiser.compiled.values())
    registers = [getattr(handle, "n_regs", None) for handle in handles]
    spills = [getattr(handle, "n_spills", None) for handle in handles]
    if not handles or None in registers or None in spills:
        return "?", "?"
    return str(max(registers)), str(max(spills))


def judged_rows(
    problem: Problem,
    inputs,
    args: argparse.Namespace,
    variant: str,
    method: str,
    layout_of: str,
    configs: list[Config],
    query: bool = True,
) -> list[SweepRow]:
    """One row per configuration of one variant, rotation method and V layout: its operands judged against
    the torch reference and its bytes against the first configuration's, then timed; a build that fails is
    a row saying so. ``query`` False: the quantiser of K and V only (``FusedQuantiser(query=False)``), judged
    on K's and V's bytes and scales (Q's buffers keep their poison). ``args.quantiser_rounds`` > 1 times every
    configuration that built again in that many rounds in turn, medians kept (drift between rows evens out)."""
    from triton.errors import TritonError

    layout = LAYOUTS[layout_of]
    gbytes = _bytes_moved(problem, query) / 1e9
    # Indices in KernelOperands.buffers() (q8, k8, vt8, q_scale, k_scale, v_scale) of what the launch writes.
    written = (0, 1, 2, 3, 4, 5) if query else (1, 2, 4, 5)
    quantisation = fp8.VARIANTS[variant]
    reference = fp8.kernel_operands(fp8.quantise(*inputs, quantisation), layout)
    rows, timed = [], []
    first_bytes = None
    for config in configs:
        shape = (variant, method if quantisation.rotation else "-", config.describe())
        try:
            quantiser = fp8_quantiser.FusedQuantiser(
                inputs[0].shape,
                inputs[1].shape,
                problem.dtype,
                inputs[0].device,
                quantisation,
                layout,
                method,
                config,
                query=query,
            )
            # Reused memory could hold the last configuration's values: NaN in every buffer, so a
            # tile this one leaves unwritten fails both verdicts.
            quantiser.operands.poison_()
            operands = quantiser(*inputs)
            torch.cuda.synchronize()
        except (TritonError, RuntimeError) as error:
            # A configuration that does not build or launch (ptxas, shared memory) is a result.
            message = str(error).strip().splitlines()[0][:120]
            rows.append(SweepRow(*shape, 0, "-", "-", float("nan"), float("nan"), "-", "-", f"failed: {message}"))
            print(f"{' | '.join(shape)} | build failed: {message}", flush=True)
            continue
        differences = fp8_quantiser.operand_differences(operands, reference)
        if not query:
            differences = fp8_quantiser.OperandDifferences(tuple(t for t in differences.tensors if t.name != "q"))
        verdict = f"{'ok' if differences.ok else 'FAILED'} ({differences.differing} differ)"
        current = [tensor.clone() for index, tensor in enumerate(operands.buffers()) if index in written]
        if first_bytes is None:
            first_bytes, same = current, "first"
        else:
            same = "yes" if all(torch.equal(a, b) for a, b in zip(current, first_bytes, strict=True)) else "NO"
        run = functools.partial(quantiser, *inputs)
        ms = _time(run, args)
        registers, spills = _kernel_resources(quantiser)
        row = SweepRow(*shape, quantiser.launches, registers, spills, ms * 1e3, gbytes / (ms * 1e-3), verdict,
                       same)  # fmt: skip
        default = fp8_quantiser.default_config(problem.head_dim, quantisation, query=query)
        row.note = "default" if config == default else ""
        rows.append(row)
        timed.append((row, run, [ms]))
        print(f"{' | '.join(shape)} | {row.launches} | {registers} | {spills} | {row.us:.1f} us | "
              f"{row.gbps:.0f} GB/s | {verdict} | {same}", flush=True)  # fmt: skip
    for _ in range(args.quantiser_rounds - 1):
        for _, run, samples in timed:
            samples.append(_time(run, args))
    for row, _, samples in timed:
        row.us = statistics.median(samples) * 1e3
        row.gbps = gbytes / (row.us * 1e-6)
    if args.quantiser_rounds > 1:
        print("\n".join(f"{row.config}: {row.us:.1f} us median of {len(samples)} rounds, {row.gbps:.0f} GB/s"
                        for row, _, samples in timed), flush=True)  # fmt: skip
    return rows


def sweep_rows(problem: Problem, inputs, args: argparse.Namespace) -> list[SweepRow]:
    rows = []
    for variant, methods in SWEEP_CASES.items():
        if variant not in args.sweep_variants:
            continue
        for method in methods if fp8.VARIANTS[variant].rotation else methods[:1]:
            configs = sweep_configs((variant, method) in FULL_GRID)
            rows += judged_rows(problem, inputs, args, variant, method, args.sweep_layout, configs)
    return rows


def sweep_markdown(rows: list[SweepRow], problem: Problem, device_name: str, layout_of: str) -> str:
    shape = f"B={problem.batch} H={problem.heads} S={problem.seqlen_q} D={problem.head_dim} {problem.dtype_name}"
    lines = [f"# Fused FP8 quantiser knobs, {device_name} ({shape}, V in {layout_of}'s layout)", "",
             "| variant | rotation | config | launches | regs | spills | µs | GB/s | x before | vs reference | "
             "same bytes | note |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    before = {}
    for row in rows:
        key = (row.variant, row.method)
        if row.config == BEFORE.describe():
            before[key] = row.us
        speedup = before.get(key, float("nan")) / row.us
        lines.append(f"| {row.variant} | {row.method} | {row.config} | {row.launches} | {row.registers} | {row.spills} "
                     f"| {row.us:.1f} | {row.gbps:.0f} | {speedup:.2f} | {row.reference} | {row.same_bytes} "
                     f"| {row.note} |")  # fmt: skip
    lines += ["", "Best passing configuration per variant and rotation (reference ok, same bytes):", ""]
    for key in dict.fromkeys((row.variant, row.method) for row in rows):
        passing = [row for row in rows if (row.variant, row.method) == key and row.reference.startswith("ok")
                   and row.same_bytes in ("first", "yes")]  # fmt: skip
        if passing:
            best = min(passing, key=lambda row: row.us)
            lines.append(f"- {key[0]} ({key[1]}): {best.config}: {best.us:.1f} µs, {best.gbps:.0f} GB/s")
    lines += ["", f"Bytes per quantisation: {_bytes_moved(problem) / 1e6:.0f} MB (Q, K, V read once in "
              f"{problem.dtype_name}, e4m3 and block scales written once). `x before`: speed-up over "
              f"`{BEFORE.describe()}` (the quantiser's launch shape before the knobs)."]  # fmt: skip
    return "\n".join(lines) + "\n"


def run_sweep(args: argparse.Namespace) -> None:
    problem = _problem(args)
    inputs = fp8.fa3_inputs(problem, seed=0, device="cuda")
    # The reference's rotation in full fp32 (a TF32 GEMM would round the matrix's entries).
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = sweep_rows(problem, inputs, args)
    args.out.mkdir(parents=True, exist_ok=True)
    write_rows(args.out / "fp8_quantiser_sweep.csv", rows)
    report = sweep_markdown(rows, problem, torch.cuda.get_device_name(), args.sweep_layout)
    (args.out / "fp8_quantiser_sweep.md").write_text(report)
    print(report)
    print(f"wrote {args.out / 'fp8_quantiser_sweep.csv'} and {args.out / 'fp8_quantiser_sweep.md'}")


# ----------------------------------------------------------------------------------------------------
# --ab: candidate configurations against the read bandwidth, then FP8 end to end against the best bf16
# ----------------------------------------------------------------------------------------------------
# What the candidates change (fp8_quantiser.QuantiserConfig): how many tiles' bytes are in flight while one
# is computed, what that costs in programs an SM holds, and the instructions a tile takes. The H200 A/B of
# 2026-11-29 (results/h200/fp8-quantiser-ab/): the 2-stage cp.async default 137.6 µs, the register prefetch
# 113.6 (61 % of the read bandwidth; now the default under Triton 3.6), persistent and 3-4-stage cp.async grids
# 122-165. The prefetch keeps one 32 KB tile in flight a program (two programs an SM), and its loop issues
# 1053 / 951 / 865 SASS instructions a thread per Q / K / V tile (8 warps): at the measured time that is an
# issue rate near 1.7 per cycle an SM, so the kernel is bound by issue and by bytes in flight together.
# The tma rows (sm_90a, Triton 3.6, D=128, block+rotation, V in gluon/fp8's permuted layout, so V stays on
# cp.async): Q and K copied by TMA into a ring that the rotation's wgmma reads in place (no register round
# trip: Q's loop 899-905 instructions at 8 warps, 624 at 16), Triton 3.6 issuing each copy at the end of the
# loop body, so that num_stages - 2 copies are in flight while a tile is computed (num_stages - 1 briefly).
# Shared memory a program (ring + 32 KB sign matrix + 16 KB exchange): 2 stages 115 KB (two programs an SM,
# just), 3 stages 147 KB, 4 stages 180 KB (one). Registers: 128 at 8 warps (165 uncapped), ~104 at 16 warps;
# no spills under 3.6 or 3.8. Warp-instructions for a Q, K and V tile: prefetch 22,952, tma at 8 warps ~20,000,
# tma at 16 warps ~26,300, cp.async at 16 warps (the 152 µs row) 28,096.
AB_CANDIDATES = [
    fp8_quantiser.PREFETCH_CONFIG,
    fp8_quantiser.PIPELINED_CONFIG,
    Config(programs_per_sm=2, num_stages=2, maxnreg=128, tma=True),
    Config(programs_per_sm=1, num_stages=4, tma=True),
    Config(programs_per_sm=1, num_stages=3, num_warps=16, tma=True),
    Config(programs_per_sm=1, num_stages=4, num_warps=16, tma=True),
    Config(tiles_per_program=8, num_stages=3, num_warps=16, tma=True),
    Config(tiles_per_program=8, num_stages=4, num_warps=16, tma=True),
]
# --ab --kv-only: the quantiser of K and V only (cute/fp8 quantises Q in its kernel at D=128). Its launch at P1: 2048
# K tiles (rotated: loop 951 SASS instructions a thread, 7 barriers, 8 HGMMA) and 2048 V tiles (865, 5 barriers), 128
# rows a tile, 8 warps; 128 registers, no spills (sm_90a, Triton 3.6, PREFETCH_CONFIG), so two programs an SM (264
# slots on 132 SMs), each with one 32 KB tile in flight while it computes another: 64 KB an SM at most. The sixth
# stop measured 77 µs for it (2.6 TB/s of its 201 MB), the same rate per byte as Q, K, V together (113.6 µs, 302 MB):
# about 4.9 µs a tile a program, at an issue rate near 0.4 a cycle a sub-partition, so latency-bound, not issue-bound.
# What the mix changes is the schedule. At 8 tiles a program the 512 programs run as two rounds: first K's 256 (two
# rotated programs an SM, 8 tiles each, started at once and ending together), then V's, longest jobs first, so the
# tail is short; 8 tiles is the fewest that fit K in one round. A slot model (264 slots, each program's tiles at a
# fixed time whatever its neighbour, 1.5 µs to start a program, 3 µs a launch) fitted to both measured launches (Q,
# K, V 113.6 µs; K, V 77.4) gives a K tile 4.4 µs of a program and a V tile 4.5: V's lighter code does not shorten
# its tiles, so the bytes in flight, not the instructions, set the pace. It predicts K, V at 8 tiles 77.2 µs, 16
# tiles 76.5 (interleaved or not), 8 interleaved 78.0, 4 tiles 80.2 (and Q, K, V interleaved 115.5, measured 120.6:
# interleaving costs more than the model sees). Candidates (tiles_per_program changes no binary; interleave's build
# has the same loops, 128 registers, no spills): 16 tiles, 256 programs in one round, an SM holding one K and one V
# program by dispatch order (block i and i + 132) or, interleaved, by construction (``_interleaved_program`` gives
# turns only to tensors with programs), one start a slot instead of two; 8 tiles interleaved, K and V side by side,
# long K programs started late; 4 tiles, four starts a slot; 16 warps under a 64-register cap: two programs of 16
# warps an SM, the same bytes in flight, twice the warps for a tile's chain of latencies, but 72 bytes spilled (10
# spill instructions in K's loop) and 28 % more instructions a tile: a test of whether the instructions matter.
KV_AB_CANDIDATES = [
    fp8_quantiser.PREFETCH_CONFIG,
    replace(fp8_quantiser.PREFETCH_CONFIG, tiles_per_program=16),
    replace(fp8_quantiser.PREFETCH_CONFIG, tiles_per_program=16, interleave=True),
    replace(fp8_quantiser.PREFETCH_CONFIG, interleave=True),
    replace(fp8_quantiser.PREFETCH_CONFIG, tiles_per_program=4),
    replace(fp8_quantiser.PREFETCH_CONFIG, num_warps=16, maxnreg=64),
]
# --ab --kv-only --candidates kv-d128 (bench/fp8_kv_d128_ab.sh): the D=128 K/V launch split in two, each binary its
# own tensor's code (value_config), as D=64's D64_KV_CONFIG does. sm_90a, Triton 3.6, P1, per tile and thread: the
# one launch's K loop 959 SASS (8 LDG.128, the tile stored to shared memory for the wgmma, MEMBAR, 8 HGMMA, 7 BAR,
# 10 SHFL, 4 STG.128), V's 841 (8 LDG.128, 5 BAR, 112 PRMT); 128 registers x 8 warps, two programs an SM, 16 warps,
# one 32 KB tile in flight a program while it computes another. The bandwidth A/B (results/h200/fp8-kv-quantiser-bw/)
# timed K alone 44.7-45.9 µs, V alone 34.1 in a launch of its own against 40.4 in the one launch (its torch copy
# 36.5), and the L2 prefetch took V 40.4 -> 38.1 but not K: K's chain (issue about 0.4 a cycle a sub-partition, 7
# barriers), not its load, sets K's pace, and K is the limiter. Candidates (none spills under 3.6 or 3.8): V apart
# (D64_KV_CONFIG's shape; 74.2 against 76.7 µs in that A/B, never timed end to end); V apart with V's L2 prefetch
# (V's tiles back to back at P1); K by TMA (2-stage ring, 99 registers, 114,704 bytes of shared memory: two
# programs an SM; the rotation's wgmma reads the copy in place, K's loop 815 SASS, no LDG, STS or MEMBAR) with V apart.
# Triton 3.6 issues K's next copy at the end of the body, so its latency is exposed each tile: K by TMA tells
# whether K's shorter chain outweighs it. Helper kchain: K's chain by a 3-stage cp.async ring whose slots the
# rotation's wgmma reads through registers (register_operand: ldmatrix from the slot, no store of the tile, no proxy
# fence, whose MEMBAR waited each tile), V apart: K's loop 905 SASS, 5 BAR, no MEMBAR, 128 registers, 114,688 bytes,
# two programs an SM (3.8: 897, 4 BAR).
K_REGISTER_RING = replace(fp8_quantiser.PREFETCH_CONFIG, prefetch=False, num_stages=3, register_operand=True)
# Releases under which V apart with the register prefetch (V's own binary under PREFETCH_CONFIG) spills at D=128: 104
# bytes under 3.9 (CI's newest leg), none under 3.6, 3.7.1 and 3.8. The candidates are timed under 3.6, the GPU's.
V_APART_SPILLS = ("3.9",)
KV_D128_CANDIDATES = [
    fp8_quantiser.PREFETCH_CONFIG,
    replace(fp8_quantiser.PREFETCH_CONFIG, value_config=fp8_quantiser.PREFETCH_CONFIG),
    replace(fp8_quantiser.PREFETCH_CONFIG, value_config=replace(fp8_quantiser.PREFETCH_CONFIG, l2_prefetch=True)),
    Config(tiles_per_program=8, num_stages=2, tma=True, value_config=fp8_quantiser.PREFETCH_CONFIG),
    replace(K_REGISTER_RING, value_config=fp8_quantiser.PREFETCH_CONFIG),
]
# Named candidate lists ``--candidates`` takes in place of configurations.
CANDIDATE_SETS = {"kv-d128": KV_D128_CANDIDATES}
# The rungs' default quantisation and the V layout the candidates are timed in (gluon/fp8, the best FP8 kernel).
AB_VARIANT, AB_LAYOUT = "block+rotation", "gluon/fp8"
# The best bf16 rung (issue #37's denominator).
BF16_BEST = ("cute/hopper", "cute_impl.hopper")


@dataclass
class EndToEndRow:
    rung: str
    causal: bool
    kernel_us: float
    kernel_tflops: float
    e2e_us: float
    e2e_tflops: float
    note: str = ""
    config: str = ""
    # The fused quantiser alone at this configuration in the rung's V layout (same inputs, same process), so that
    # e2e - kernel - quantiser is what a call pays beyond its two launches.
    quantiser_us: float = float("nan")

    @property
    def other_us(self) -> float:
        return self.e2e_us - self.kernel_us - self.quantiser_us


def _rung_end_to_end(
    rung: str, module, problem: Problem, inputs, configs: list[Config], args: argparse.Namespace
) -> list[EndToEndRow]:
    """One rung, one causal mode: its kernel only, then per configuration (made the rungs' default while its run is
    built, the default put back after: the next rung's capability check reads it) the fused quantiser alone in the
    rung's V layout and end to end (output checked equal to the kernel's); ``args.e2e_rounds`` rounds, each timing
    every configuration in turn, medians kept."""
    from common.measure.timing import tflops

    kernel_only = module.prepare(*inputs, problem)
    expected = kernel_only().clone()
    quantisation = module.DEFAULT_QUANTISATION
    # The rung's own quantiser: K and V only where its kernel quantises Q (cute/fp8's QUANTISE_Q_IN_KERNEL).
    query = not getattr(module, "quantises_q_in_kernel", lambda *_: False)(problem, quantisation)
    runs, notes = [], []
    for config in configs:
        with fp8_quantiser.using_config(config):
            end_to_end = module.prepare_end_to_end(*inputs, problem)
            notes.append("" if torch.equal(end_to_end(), expected) else "output differs from kernel only")
        alone = fp8_quantiser.FusedQuantiser(inputs[0].shape, inputs[1].shape, problem.dtype, inputs[0].device,
                                             quantisation, LAYOUTS[rung], config=config, query=query)  # fmt: skip
        runs.append((end_to_end, lambda fq=alone: fq(*inputs)))
    kernel, e2e, alone = [], [[] for _ in configs], [[] for _ in configs]
    for _ in range(args.e2e_rounds):
        kernel.append(_time(kernel_only, args))
        for index, (end_to_end, quantise) in enumerate(runs):
            e2e[index].append(_time(end_to_end, args))
            alone[index].append(_time(quantise, args))
    kernel_ms = statistics.median(kernel)
    rows = []
    for config, note, e2e_samples, alone_samples in zip(configs, notes, e2e, alone, strict=True):
        e2e_ms = statistics.median(e2e_samples)
        row = EndToEndRow(rung, problem.causal, kernel_ms * 1e3, tflops(problem.flops, kernel_ms), e2e_ms * 1e3,
                          tflops(problem.flops, e2e_ms), note, config.describe(),
                          statistics.median(alone_samples) * 1e3)  # fmt: skip
        rows.append(row)
        print(f"{rung:10s} causal={problem.causal!s:5s} kernel {row.kernel_us:7.1f} us {row.kernel_tflops:4.0f} | "
              f"quantiser {row.quantiser_us:6.1f} us | e2e {row.e2e_us:7.1f} us {row.e2e_tflops:4.0f} TFLOP/s | "
              f"other {row.other_us:5.1f} us | {row.config} {note}", flush=True)  # fmt: skip
    return rows


def end_to_end_rows(
    args: argparse.Namespace, configs: list[Config] | None = None
) -> tuple[list[EndToEndRow], dict[bool, float]]:
    """Per causal mode: each FP8 rung kernel only and end to end with each of ``configs`` (default: the current
    default configuration), and the best bf16 rung's TFLOP/s. The default configuration stays (each rung's
    :func:`_rung_end_to_end` puts it back)."""
    from common.measure.timing import tflops

    configs = configs or [fp8_quantiser.default_config(args.head_dim, fp8.VARIANTS[AB_VARIANT])]
    rows, bf16 = [], {}
    # Causal first: issue #37's missing target, should a device call's time run out.
    for causal in (True, False):
        problem = _problem(args, causal)
        inputs = fp8.fa3_inputs(problem, seed=0, device="cuda")
        bf16_ms = _time(importlib.import_module(BF16_BEST[1]).prepare(*inputs, problem), args)
        bf16[causal] = tflops(problem.flops, bf16_ms)
        print(f"{BF16_BEST[0]:10s} causal={causal!s:5s} {bf16_ms * 1e3:9.1f} us {bf16[causal]:7.0f} TFLOP/s",
              flush=True)  # fmt: skip
        for rung in args.only:
            module = importlib.import_module(RUNGS[rung])
            ok, reason = module.IMPLEMENTATION.check(problem, inputs[0].device)
            if not ok:
                print(f"{rung}: skipped, {reason}", flush=True)
                continue
            rows += _rung_end_to_end(rung, module, problem, inputs, configs, args)
    return rows, bf16


def ab_markdown(
    candidates: list[SweepRow], best: SweepRow | None, read_gbps: float, e2e: list[EndToEndRow],
    bf16: dict[bool, float], problem: Problem, device_name: str, query: bool = True, layout_of: str = AB_LAYOUT,
) -> str:  # fmt: skip
    shape = f"B={problem.batch} H={problem.heads} S={problem.seqlen_q} D={problem.head_dim} {problem.dtype_name}"
    moved = _bytes_moved(problem, query)
    ideal_us = moved / (read_gbps * 1e9) * 1e6
    tensors = "Q, K and V" if query else "K and V only (query=False: cute/fp8 quantises Q in its kernel)"
    lines = [f"# Fused FP8 quantiser A/B and FP8 end to end, {device_name} ({shape})", "",
             f"Read bandwidth measured in this run: {read_gbps:.0f} GB/s; {moved / 1e6:.0f} MB per quantisation of "
             f"{tensors}, so {ideal_us:.1f} µs at that bandwidth. Variant {AB_VARIANT}, tensor-core rotation, "
             f"V in {layout_of}'s layout.", "",
             "| config | launches | regs | spills | µs | GB/s | % of read BW | vs reference | same bytes | note |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for row in candidates:
        lines.append(f"| {row.config} | {row.launches} | {row.registers} | {row.spills} | {row.us:.1f} | "
                     f"{row.gbps:.0f} | {row.gbps / read_gbps:.0%} | {row.reference} | {row.same_bytes} | "
                     f"{'best; ' if row is best else ''}{row.note} |")  # fmt: skip
    chosen = f"the best candidate ({best.config if best else 'none passed: default'})"
    if len({row.config for row in e2e}) > 1:
        chosen = "each passing candidate"
    lines += ["", f"## End to end with {chosen}", "",
              f"| rung | causal | config | kernel µs | kernel TFLOP/s | quantiser µs | e2e µs | e2e TFLOP/s | "
              f"e2e - kernel µs | other µs | e2e / kernel | e2e / {BF16_BEST[0]} | note |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for row in e2e:
        lines.append(f"| {row.rung} | {row.causal} | {row.config} | {row.kernel_us:.1f} | {row.kernel_tflops:.0f} | "
                     f"{row.quantiser_us:.1f} | {row.e2e_us:.1f} | {row.e2e_tflops:.0f} | "
                     f"{row.e2e_us - row.kernel_us:.1f} | {row.other_us:.1f} | "
                     f"{row.e2e_tflops / row.kernel_tflops:.3f} | {row.e2e_tflops / bf16[row.causal]:.3f} | "
                     f"{row.note} |")  # fmt: skip
    lines += ["", f"{BF16_BEST[0]} (bf16): {bf16[False]:.0f} TFLOP/s non-causal, {bf16[True]:.0f} causal. "
              f"Targets (issue #37): best FP8 e2e >= 1.1x {BF16_BEST[0]} in both modes; every e2e >= 0.9x its "
              "kernel. `quantiser µs`: the fused quantiser alone in the rung's V layout at that configuration; "
              "`other µs` = e2e - kernel - quantiser."]  # fmt: skip
    return "\n".join(lines) + "\n"


def end_to_end_configs(
    args: argparse.Namespace, problem: Problem, passing: list[Config], best: Config | None
) -> list[Config] | None:
    """What ``run_ab`` times end to end: every passing candidate (``--e2e-each``); with ``--kv-only`` the K/V-only
    default and the fastest candidate; else the fastest, made the rungs' configuration (None: the default)."""
    if args.e2e_each:
        return passing
    if args.kv_only:
        default = fp8_quantiser.default_config(problem.head_dim, fp8.VARIANTS[AB_VARIANT], query=False)
        return list(dict.fromkeys([default, *([best] if best else [])]))
    if best is not None:
        fp8_quantiser.use_config(best)
    return None


def run_ab(args: argparse.Namespace) -> None:
    """The candidates (``--candidates``, else ``AB_CANDIDATES``) at P1 (each judged, then timed), the fastest that
    passes both verdicts made the rungs' quantiser configuration, then every FP8 rung end to end against the best
    bf16 rung; with ``--e2e-each``, end to end with every passing candidate in turn instead. ``--kv-only``: the
    quantiser of K and V only in cute/fp8's V layout (``KV_AB_CANDIDATES``), then cute/fp8 end to end with its
    K/V-only default and with the fastest candidate, ``--e2e-rounds`` interleaved rounds."""
    from common.measure.peaks import measure_read_gbps

    device = torch.device("cuda")
    read_gbps = measure_read_gbps(device)
    print(f"read bandwidth {read_gbps:.0f} GB/s", flush=True)
    problem = _problem(args)
    inputs = fp8.fa3_inputs(problem, seed=0, device=device)
    # The reference's rotation in full fp32 (a TF32 GEMM would round the matrix's entries).
    torch.backends.cuda.matmul.allow_tf32 = False
    query, layout_of = (False, "cute/fp8") if args.kv_only else (True, AB_LAYOUT)
    configs = args.candidates or (KV_AB_CANDIDATES if args.kv_only else AB_CANDIDATES)
    candidates = judged_rows(problem, inputs, args, AB_VARIANT, "tensor_core", layout_of, configs, query)
    del inputs
    passing = [row for row in candidates if row.reference.startswith("ok") and row.same_bytes in ("first", "yes")]
    best = min(passing, key=lambda row: row.us) if passing else None
    by_name = {config.describe(): config for config in configs}
    print(f"best candidate: {by_name[best.config]!r}" if best else "no candidate passed", flush=True)
    torch.backends.cuda.matmul.allow_tf32 = True
    fastest = by_name[best.config] if best else None
    e2e, bf16 = end_to_end_rows(
        args, end_to_end_configs(args, problem, [by_name[row.config] for row in passing], fastest)
    )
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "fp8_quantiser_ab.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["kind", *asdict(candidates[0]), "read_gbps"])
        writer.writerows(["quantiser", *asdict(row).values(), read_gbps] for row in candidates)
        writer.writerow(["end_to_end", *asdict(e2e[0]), "bf16_tflops"] if e2e else ["end_to_end"])
        writer.writerows(["end_to_end", *asdict(row).values(), bf16[row.causal]] for row in e2e)
    report = ab_markdown(candidates, best, read_gbps, e2e, bf16, problem, torch.cuda.get_device_name(), query,
                         layout_of)  # fmt: skip
    (args.out / "fp8_quantiser_ab.md").write_text(report)
    print(report)
    print(f"wrote {args.out / 'fp8_quantiser_ab.csv'} and {args.out / 'fp8_quantiser_ab.md'}")


def _problem(args: argparse.Namespace, causal: bool = False) -> Problem:
    """The run's shape: P1 unless ``--seqlen``, ``--heads``, ``--head-dim`` or ``--batch`` change it."""
    return Problem.canonical(args.seqlen, head_dim=args.head_dim, batch=args.batch, heads=args.heads, causal=causal)


def quantiser_config(text: str) -> fp8_quantiser.QuantiserConfig:
    """``field=value,...`` as a QuantiserConfig (``true``/``false``, ``none``, integers, strings); ``A|B``: A with V
    in a launch of its own under B (``value_config``)."""
    text, _, value = text.partition("|")
    if value:
        return replace(quantiser_config(text), value_config=quantiser_config(value))
    fields = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        words = {"true": True, "false": False, "none": None}
        fields[name.strip()] = words.get(
            value.strip().lower(), int(value) if value.strip().isdigit() else value.strip()
        )
    try:
        return fp8_quantiser.QuantiserConfig(**fields)
    except (TypeError, ValueError) as error:
        names = ", ".join(fp8_quantiser.QuantiserConfig.__dataclass_fields__)
        raise argparse.ArgumentTypeError(f"{error} (fields: {names})") from error


def candidate_configs(text: str) -> list[fp8_quantiser.QuantiserConfig]:
    """``--candidates``: a name of ``CANDIDATE_SETS``, or ';'-separated configurations (``quantiser_config``)."""
    if text in CANDIDATE_SETS:
        return list(CANDIDATE_SETS[text])
    return [quantiser_config(spec) for spec in text.split(";") if spec.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seqlen", type=int, default=8192)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--batch", type=int, default=None, help="default: B·S = 16384, P1's tokens")
    parser.add_argument("--only", default=",".join(RUNGS), help="comma-separated rungs")
    parser.add_argument("--warmup-ms", type=float, default=100)
    parser.add_argument("--rep-ms", type=float, default=500)
    parser.add_argument("--sweep", action="store_true", help="time the fused quantiser's knobs instead")
    parser.add_argument(
        "--ab",
        action="store_true",
        help="time AB_CANDIDATES against the read bandwidth, then the FP8 rungs end to end with the best one "
        "against the best bf16 rung, causal and not",
    )
    parser.add_argument(
        "--candidates",
        type=candidate_configs,
        help="--ab's configurations instead of AB_CANDIDATES, ';'-separated, each as --quantiser-config takes it "
        f"(the first is the one the others' bytes are compared with), or one of {', '.join(CANDIDATE_SETS)}",
    )
    parser.add_argument(
        "--quantiser-rounds",
        type=int,
        default=1,
        help="--sweep / --ab: time every configuration that built in this many rounds, each in turn, medians kept",
    )
    parser.add_argument(
        "--kv-only",
        action="store_true",
        help="--ab: the quantiser of K and V only (cute/fp8 quantises Q in its kernel), KV_AB_CANDIDATES in cute/fp8's "
        "V layout, then cute/fp8 end to end with the K/V-only default and the fastest candidate",
    )
    parser.add_argument(
        "--e2e-each", action="store_true", help="--ab: time every passing candidate end to end, not only the best"
    )
    parser.add_argument(
        "--e2e-rounds", type=int, default=1, help="end-to-end rounds, each timing every configuration in turn"
    )
    parser.add_argument("--sweep-variants", default=",".join(SWEEP_CASES), help="comma-separated variants")
    parser.add_argument("--sweep-layout", default="gluon/fp8", choices=list(LAYOUTS), help="whose V layout")
    parser.add_argument(
        "--quantiser-config",
        type=quantiser_config,
        help="the fused quantiser's configuration for this run (what the rungs use), e.g. "
        "'tiles_per_program=8,prefetch=true,maxnreg=128' (fields of fp8_quantiser.QuantiserConfig)",
    )
    args = parser.parse_args()
    args.only = ["cute/fp8"] if args.kv_only else [name for name in args.only.split(",") if name]
    unknown = [name for name in args.only if name not in RUNGS]
    if unknown:
        parser.error(f"unknown rungs {unknown}; valid: {', '.join(RUNGS)}")
    args.sweep_variants = [name for name in args.sweep_variants.split(",") if name]
    unknown = [name for name in args.sweep_variants if name not in SWEEP_CASES]
    if unknown:
        parser.error(f"unknown variants {unknown}; valid: {', '.join(SWEEP_CASES)}")
    require_gpu("bench/fp8_quantiser.py")
    if args.quantiser_config is not None:
        # Read by every FusedQuantiser built from here on (the rungs' included), like DEFAULT_ROTATION_METHOD.
        fp8_quantiser.use_config(args.quantiser_config)
        print(f"fused quantiser: {args.quantiser_config.describe()}", flush=True)
    if args.sweep:
        run_sweep(args)
        return
    if args.ab:
        run_ab(args)
        return
    rows: list[Row] = []
    for causal in (False, True):
        problem = _problem(args, causal)
        inputs = fp8.fa3_inputs(problem, seed=0, device="cuda")
        if not causal:
            rows += quantiser_rows(problem, inputs, args)
        for rung in args.only:
            rows += one_rung_rows(rung, problem, inputs, args)
    args.out.mkdir(parents=True, exist_ok=True)
    write_rows(args.out / "fp8_quantiser.csv", rows)
    (args.out / "fp8_quantiser.md").write_text(markdown(rows, _problem(args), torch.cuda.get_device_name()))
    print(f"wrote {args.out / 'fp8_quantiser.csv'} and {args.out / 'fp8_quantiser.md'}")


if __name__ == "__main__":
    main()
