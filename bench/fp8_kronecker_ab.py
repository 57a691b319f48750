"""The Kronecker rotation's A/B (issue #37): the fused quantiser's K (and Q) rotation as D/16 products with Sylvester's
H_16 and butterflies across the blocks (``rotation_method="kronecker"``) against the tensor-core product with the whole
D x D sign matrix (``"tensor_core"``, the default).

Why: at P1 the K/V launch takes 80.3 µs on an H100 (K 44.3, V 39.8) where a plain Triton stream of the same bytes
takes 67.9 (results/h100/fp8-kv-quantiser-ceilings-2026-12-06/). K's 13.7 µs over its stream is about what its
rotation's tensor work costs when it does not overlap the loads: 2048 tiles of 128 x 128 x 128 (4.2 MFLOP each), 15.5 a
SM at about 0.56 µs a tile, 8.7 µs. H_D = H_{D/16} ⊗ H_16 needs 1/8 of those products at D=128 (1/4 at D=64), plus 3
fp32 adds an element. Predicted: K 44.3 -> 35-38 µs, K+V 80.3 -> 72-75 µs, if the 16-column blocks' loads, layout
conversions and registers cost no more than the product saved (the sm_90a builds differ: see the table's regs/spills).
Measured (H100, 2026-12-06, results/h100/fp8-kronecker-rotation-2026-12-06/): K 81.9-96.5 µs against 44.6, every
candidate correct: they cost more than they save.

Per shape (P1's K/V, B=2 Hkv=16 S=8192 D=128; D=64: B=4 H=32 S=8192), in one process, L2 flushed before every run
(``bench.fp8_kv_quantiser_bw``'s inputs, timing rounds and table):
* each candidate (method, configuration; the tensor-core default first): a Q+K+V quantiser of it writes poisoned
  buffers, checked against the fp64-free reference (``fp8.quantise`` with full fp32 GEMMs) by ``operand_differences``,
  the tests' rule (every difference one e4m3 step, few; scales within a few ulps); a candidate that fails is not timed
  and the run exits 1;
* then K and V together (cute/fp8's launch, ``query=False``), K alone, V alone, and Q+K+V (gluon/fp8's and
  triton/fp8's launch, ``query=True``) in the ``kv_us`` column of a row of its own.

usage (project root): python -m bench.fp8_kronecker_ab --out DIR [--rounds 3] [--shapes "P1 D=128,D=64"]
Exits 2 with one line without a GPU.
"""

from __future__ import annotations

import argparse
import csv
import functools
import sys
from dataclasses import asdict, replace

import torch

from bench import require_gpu
from bench.fp8_kv_quantiser_bw import (
    LAYOUT,
    SHAPES,
    VARIANT,
    BandwidthRow,
    _inputs,
    _resources,
    _time_rounds,
    kv_bytes,
    markdown,
    timing_parser,
)
from common.contract import fp8
from triton_impl import fp8_quantiser

Candidate = tuple[str, fp8_quantiser.QuantiserConfig]


def candidates(head_dim: int) -> dict[str, Candidate]:
    """The tensor-core default, then the Kronecker rotation at configurations that build without spills (sm_90a,
    Triton 3.6 to 3.8): the default's (a 2-stage cp.async ring, 8 warps, 158 registers: one program an SM), the same
    with the wgmma operand from registers, the register prefetch at 16 warps under the 128-register cap (121
    registers), and the cp.async ring at 16 warps with the operand from registers (99). (No overlap at 8 warps in 128
    registers, two programs an SM as the tensor-core default, spills 8 bytes under Triton 3.6: left out.)"""
    quantisation = fp8.VARIANTS[VARIANT]
    default = fp8_quantiser.default_config(head_dim, quantisation, "tensor_core", query=False)
    pipelined = fp8_quantiser.PIPELINED_CONFIG
    prefetch = fp8_quantiser.D128_CONFIG
    return {
        "tensor core (default)": ("tensor_core", default),
        "kronecker ring": ("kronecker", fp8_quantiser.default_config(head_dim, quantisation, "kronecker", query=False)),
        "kronecker ring, operand in registers": ("kronecker", replace(pipelined, register_operand=True)),
        "kronecker prefetch, 16 warps": ("kronecker", replace(prefetch, num_warps=16)),
        "kronecker ring, 16 warps, operand in registers": (
            "kronecker",
            replace(pipelined, num_warps=16, register_operand=True),
        ),
    }


def _checked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, method: str, config) -> str:
    """A Q+K+V quantiser of ``method`` and ``config`` against the reference (poisoned buffers first): the summary of
    ``operand_differences``, and whether it passed."""
    quantisation = fp8.VARIANTS[VARIANT]
    quantiser = fp8_quantiser.FusedQuantiser(
        q.shape, k.shape, k.dtype, k.device, quantisation, LAYOUT, rotation_method=method, config=config
    )
    quantiser.operands.poison_()
    reference = fp8.kernel_operands(fp8.quantise(q, k, v, quantisation), LAYOUT)
    differences = fp8_quantiser.operand_differences(quantiser(q, k, v), reference)
    return ("ok" if differences.ok else "FAILED") + f": {differences.summary()}"


def shape_rows(shape: str, args: argparse.Namespace) -> tuple[list[BandwidthRow], bool]:
    """One shape's candidates, each checked, then every run timed in interleaved rounds; and whether all passed."""
    batch, kv_heads, seqlen, head_dim = SHAPES[shape]
    _, k, v = _inputs(batch, kv_heads, seqlen, head_dim)
    q = torch.randn_like(k, dtype=torch.float32).to(k.dtype)
    gbytes = kv_bytes(batch, kv_heads, seqlen, head_dim) / 1e9
    rows, runs, passed = [], [], True
    for name, (method, config) in candidates(head_dim).items():
        verdict = _checked(q, k, v, method, config)
        print(f"{shape} | {name} | {verdict}", flush=True)
        if not verdict.startswith("ok"):
            passed = False
            continue
        for query in (False, True):
            quantiser = fp8_quantiser.FusedQuantiser(
                q.shape, k.shape, k.dtype, k.device, fp8.VARIANTS[VARIANT], LAYOUT,
                rotation_method=method, config=config, query=query,
            )  # fmt: skip
            quantiser(q, k, v)
            label = f"{name}{', Q+K+V' if query else ''}"
            row = BandwidthRow(shape, label, config.describe(), "checked", _resources(quantiser), float("nan"))
            rows.append(row)
            fields = (("kv_us", None),) if query else (("kv_us", None), ("k_us", "k"), ("v_us", "v"))
            runs += [(row, field, functools.partial(quantiser, q, k, v, only=only), []) for field, only in fields]
    _time_rounds(runs, args)
    for row in rows:
        moved = gbytes * (1.5 if row.name.endswith("Q+K+V") else 1.0)  # Q adds half of K and V's bytes
        row.gbps = moved / (row.kv_us * 1e-6)
        row.of_copy = row.of_read = float("nan")
    return rows, passed


def main() -> None:
    args = timing_parser(__doc__).parse_args()
    require_gpu("bench/fp8_kronecker_ab.py")
    # The reference's rotation in full fp32 (a TF32 GEMM would round the matrix's entries), as bench/fp8_quantiser.py.
    torch.backends.cuda.matmul.allow_tf32 = False
    rows, passed = [], True
    for shape in args.shapes.split(","):
        shape_result, shape_passed = shape_rows(shape, args)
        rows += shape_result
        passed = passed and shape_passed
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "fp8_kronecker_ab.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(list(asdict(rows[0])))
        writer.writerows(list(asdict(row).values()) for row in rows)
    report = markdown(rows, float("nan"), torch.cuda.get_device_name())
    (args.out / "fp8_kronecker_ab.md").write_text(report)
    print(report)
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()
