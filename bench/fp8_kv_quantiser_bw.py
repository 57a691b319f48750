"""The K/V quantiser's bandwidth A/B (issue #37): the launch cute/fp8 runs before its kernel (``FusedQuantiser``
with ``query=False``: K rotated, V transposed and permuted, block scales) against variants that launch V apart
(``QuantiserConfig.value_config``), and against a plain torch copy that moves the same bytes.

Why: at P1 the K/V launch reads 134 MB of bf16 and writes 67 MB of e4m3 (and its scales) in about 77 µs, 60 % of the
read bandwidth; causal end to end meets issue #37's targets once it takes <= 68 µs. Its 128-register programs fit two
an SM, each with one 32 KB tile in flight while it computes another, and either those bytes in flight or the programs'
latency chains set the pace (the measurements so far fit both). A binary holding Q's, K's and V's branches sums their
shared memory and takes the largest branch's registers, so one launch cannot give V more of either; with V apart,
V's binary holds V's code alone, and the candidates (``candidates``) give it twice the warps, or a cp.async ring with
two to three tiles in flight a program; ``l2_prefetch`` asks the L2 for the tile after next in any launch, bytes in
flight that hold no register. K and V are timed alone too, so that the A/B says which limit it is.

Per shape (P1's K/V: B=2 Hkv=16 S=8192 D=128; D=64: B=4 H=32 S=8192), in one process, L2 flushed before every run
(``common.measure.timing.time_cuda``, medians over ``--rounds`` interleaved rounds):
* each candidate (the K/V default first): its bytes and scales against the default's (into poisoned buffers; a
  candidate that differs is timed but marked), then K and V together, K alone and V alone (``FusedQuantiser``'s
  ``only``), with the registers and spills of each launch;
* the roofline: ``torch`` copies of K and V into e4m3 tensors (``Tensor.copy_``: read bf16, write e4m3, the same
  bytes less the scales), and the HBM read bandwidth (``measure_read_gbps``);
* two more ceilings (``ceilings``), to tell whether torch's cast is itself the limit: the plainest Triton stream of
  the same bytes (``stream_cast``: BLOCK elements a program, one 16-byte load and an 8-byte store a thread and step,
  no rotation, no scale), at two block sizes, and a bf16 copy (read bf16, write bf16: the write side doubled), its
  GB/s counted over the bytes it moves.
Columns: µs, GB/s (bytes read and written, scales included), % of the copy's GB/s, % of the read bandwidth.

usage (project root): python -m bench.fp8_kv_quantiser_bw --out DIR [--rounds 3] [--only default,...]
(bench/fp8_kv_quantiser_bw.sh)
Exits 2 with one line without a GPU.
"""

from __future__ import annotations

import argparse
import csv
import functools
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import triton
import triton.language as tl

from bench import require_gpu
from common.contract import fp8
from triton_impl import fp8_quantiser

VARIANT = "block+rotation"
LAYOUT = fp8.ValueLayout(permuted=True, key_multiple=16)  # cute/fp8's V layout
# (batch, KV heads, keys, head dim): P1's K and V, and the D=64 census shape's.
SHAPES = {"P1 D=128": (2, 16, 8192, 128), "D=64": (4, 32, 8192, 64)}
# FA3's outliers (common.contract.fp8.fa3_inputs), drawn on the GPU: N(0, 1) + N(0, 100) x Bernoulli(0.001).
OUTLIER_RATE, OUTLIER_STD = 1e-3, 10.0
E4M3_BYTES, SCALE_BYTES = 1, 4
# What the defaults' builds use (128 registers: two 8-warp programs an SM at D=128, four 4-warp ones at D=64): the cap
# of a candidate that adds instructions to a default without one (D=64's), which would otherwise take 130.
DEFAULT_REGISTERS = 128
# Indices in KernelOperands.buffers() (q8, k8, vt8, q_scale, k_scale, v_scale) of what the K/V launch writes.
KV_BUFFERS = (1, 2, 4, 5)


def _warps(head_dim: int, factor: int) -> int:
    """``factor`` times the default's warps (64 fp32 values a thread: 8 at D=128, 4 at D=64)."""
    return factor * fp8_quantiser._num_warps(fp8_quantiser._tile_rows_of(fp8.VARIANTS[VARIANT]), head_dim)


def value_ring(head_dim: int, num_stages: int) -> fp8_quantiser.QuantiserConfig:
    """V's launch on a cp.async ring of ``num_stages`` tiles (``num_stages`` - 2 in flight while one is computed,
    under Triton 3.6's pipeliner), 8 tiles a program, twice the default's warps under a 64-register cap: as many
    programs an SM as the default's by registers (2 at D=128, 4 at D=64), 96 KB of shared memory at D=128."""
    return fp8_quantiser.QuantiserConfig(
        tiles_per_program=8, num_stages=num_stages, num_warps=_warps(head_dim, 2), maxnreg=64
    )


def twice_the_warps(head_dim: int, maxnreg: int = 64) -> fp8_quantiser.QuantiserConfig:
    """The register prefetch at twice the default's warps under a ``maxnreg`` cap: at 64, as many programs an SM as
    the default's, twice the warps, the same bytes in flight (spills 24 bytes in V's binary and 32 in K's at D=128
    under Triton 3.6: loop invariants reloaded, 5 and 8 local loads a tile; 32 bytes in V's at D=64)."""
    return fp8_quantiser.QuantiserConfig(
        tiles_per_program=8, prefetch=True, num_warps=_warps(head_dim, 2), maxnreg=maxnreg
    )


def candidates(head_dim: int) -> dict[str, fp8_quantiser.QuantiserConfig]:
    """The K/V default, then: the L2 asked for the tile after next (``l2_prefetch``, K and V in the default's one
    launch); V apart, K keeping the default's launch, at the default's configuration (what splitting the launch
    costs or gains alone), at twice the warps (the same bytes in flight: do the warps' latency chains set the pace?),
    the two together, on a cp.async ring (two to three tiles in flight a program while one is computed); last K and V
    both at twice the warps; at D=64 also V's two launches that build without spills under Triton 3.6. K keeps its
    register prefetch: its binary holds the sign matrix and the wgmma operand, 64 KB, so a 3-stage ring of its own
    takes 144 KB, one program an SM. Under Triton 3.6 the ring is unswizzled and V reads it transposed by 2-byte loads
    (32 LDS.U16 a thread and tile at 16 warps, 8-way bank conflicts: about 4,100 shared-memory cycles a tile), where
    the register path transposes by 16-byte stores and ldmatrix (8 STS.128 and 8 LDSM.MT88 at 8 warps, about 512
    cycles)."""
    default = fp8_quantiser.default_config(head_dim, fp8.VARIANTS[VARIANT], query=False)
    # The candidates vary the one launch (D=64's default under Triton 3.6 already runs V apart).
    base = replace(default, value_config=None)
    named = {
        "default": default,
        "L2 prefetch": replace(base, l2_prefetch=True, maxnreg=base.maxnreg or DEFAULT_REGISTERS),
        "V apart": replace(base, value_config=base),
        "V 2x warps": replace(base, value_config=twice_the_warps(head_dim)),
        "L2 prefetch, V 2x warps": replace(
            base,
            l2_prefetch=True,
            maxnreg=base.maxnreg or DEFAULT_REGISTERS,
            value_config=replace(twice_the_warps(head_dim), l2_prefetch=True),
        ),
        "V ring 2x warps, 4 stages": replace(base, value_config=value_ring(head_dim, 4)),
        "K, V 2x warps": replace(twice_the_warps(head_dim), value_config=twice_the_warps(head_dim)),
    }
    if head_dim == 64:
        # V's launch without spills under Triton 3.6 (sm_90a): twice the warps at 72 registers (three programs an SM,
        # 24 warps), or the default's warps with the register prefetch at 128 (four, 16 warps).
        named["V 2x warps, 72 registers"] = replace(base, value_config=twice_the_warps(head_dim, maxnreg=72))
        named["V prefetch"] = replace(base, value_config=fp8_quantiser.PREFETCH_CONFIG)
    return named


# What each shape times (the D=64 run: fewer builds, the variants that answer its questions).
TIMED = {
    "P1 D=128": None,
    "D=64": ("default", "V 2x warps", "V 2x warps, 72 registers", "V prefetch"),
}


@dataclass
class BandwidthRow:
    shape: str
    name: str
    config: str
    same_bytes: str
    resources: str
    kv_us: float
    k_us: float = float("nan")
    v_us: float = float("nan")
    gbps: float = float("nan")
    of_copy: float = float("nan")
    of_read: float = float("nan")


def kv_bytes(batch: int, kv_heads: int, seqlen: int, head_dim: int, scales: bool = True) -> int:
    """K and V read once in bf16, written once in e4m3, with a block scale per 128 keys (``scales``)."""
    elements = 2 * batch * kv_heads * seqlen * head_dim
    blocks = 2 * batch * kv_heads * -(-seqlen // fp8.VARIANTS[VARIANT].kv_block_rows)
    return elements * (2 + E4M3_BYTES) + (blocks * SCALE_BYTES if scales else 0)


def _inputs(batch: int, kv_heads: int, seqlen: int, head_dim: int) -> tuple[torch.Tensor, ...]:
    """(q, k, v) in bf16 on the GPU: K and V with FA3's outliers, Q never read (query=False) but shaped as the rung's
    (H = Hkv here), so that every launch is specialised as there."""
    generator = torch.Generator(device="cuda").manual_seed(seqlen + head_dim)

    def draw() -> torch.Tensor:
        shape = (batch, kv_heads, seqlen, head_dim)
        x = torch.randn(shape, device="cuda", generator=generator)
        outliers = torch.rand(shape, device="cuda", generator=generator) < OUTLIER_RATE
        x += OUTLIER_STD * torch.randn(shape, device="cuda", generator=generator) * outliers
        return x.to(torch.bfloat16)

    k, v = draw(), draw()
    return torch.empty_like(k), k, v


# The stream ceilings' elements a program (8 warps: 16 and 64 elements a thread).
STREAM_BLOCKS = (4096, 16384)


@triton.jit
def _stream_cast_kernel(src, dst, n, BLOCK: tl.constexpr):
    """The plainest stream: BLOCK elements a program, loaded, cast to ``dst``'s type, stored."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    keep = offsets < n
    values = tl.load(src + offsets, mask=keep, eviction_policy="evict_first")
    tl.store(dst + offsets, values.to(dst.dtype.element_ty), mask=keep)


def stream_cast(src: torch.Tensor, dst: torch.Tensor, block: int) -> None:
    """dst = src cast, element by element, by ``_stream_cast_kernel`` (both contiguous, the same size)."""
    n = src.numel()
    _stream_cast_kernel[(-(-n // block),)](src, dst, n, BLOCK=block, num_warps=8)


def ceilings(
    shape: str, k: torch.Tensor, v: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor
) -> tuple[list[BandwidthRow], list[tuple]]:
    """The Triton stream at each block size and the bf16 copy: their rows (the bf16 copy's marked by its name: its
    bytes differ) and their (row, field, run, samples) for ``_time_rounds``."""
    rows, runs = [], []
    for block in STREAM_BLOCKS:
        row = BandwidthRow(shape, f"triton stream {block}", f"BLOCK={block}, 8 warps", "-", "-", float("nan"))
        rows.append(row)
        runs += [
            (row, "kv_us", lambda b=block: (stream_cast(k, k8, b), stream_cast(v, v8, b)), []),
            (row, "k_us", lambda b=block: stream_cast(k, k8, b), []),
            (row, "v_us", lambda b=block: stream_cast(v, v8, b), []),
        ]
    k16, v16 = torch.empty_like(k), torch.empty_like(v)
    row = BandwidthRow(shape, BF16_COPY, "k16.copy_(k), v16.copy_(v)", "-", "-", float("nan"))
    rows.append(row)
    runs += [
        (row, "kv_us", lambda: (k16.copy_(k), v16.copy_(v)), []),
        (row, "k_us", lambda: k16.copy_(k), []),
        (row, "v_us", lambda: v16.copy_(v), []),
    ]
    return rows, runs


BF16_COPY = "torch bf16 copy"


def _resources(quantiser: fp8_quantiser.FusedQuantiser) -> str:
    """Registers/spilled bytes of each launch, as Triton reports them."""
    handles = [quantiser.compiled[key] for key in sorted(quantiser.compiled)]
    return " + ".join(f"{getattr(h, 'n_regs', '?')}r/{getattr(h, 'n_spills', '?')}s" for h in handles)


def shape_rows(shape: str, args: argparse.Namespace, read_gbps: float) -> list[BandwidthRow]:
    """One shape: the candidates judged against the default's bytes, then every run timed in interleaved rounds."""
    batch, kv_heads, seqlen, head_dim = SHAPES[shape]
    q, k, v = _inputs(batch, kv_heads, seqlen, head_dim)
    gbytes = kv_bytes(batch, kv_heads, seqlen, head_dim) / 1e9
    rows, runs = [], []
    default_bytes = None
    for name, config in candidates(head_dim).items():
        if (TIMED.get(shape) and name not in TIMED[shape]) or (args.only and name not in args.only.split(",")):
            continue
        quantiser = fp8_quantiser.FusedQuantiser(
            q.shape, k.shape, k.dtype, k.device, fp8.VARIANTS[VARIANT], LAYOUT, config=config, query=False
        )
        quantiser.operands.poison_()
        written = [t.clone() for i, t in enumerate(quantiser(q, k, v).buffers()) if i in KV_BUFFERS]
        if default_bytes is None:
            default_bytes, same = written, "first"
        else:
            same = "yes" if all(torch.equal(a, b) for a, b in zip(written, default_bytes, strict=True)) else "NO"
        row = BandwidthRow(shape, name, config.describe(), same, _resources(quantiser), float("nan"))
        rows.append(row)
        for field, only in (("kv_us", None), ("k_us", "k"), ("v_us", "v")):
            runs.append((row, field, functools.partial(quantiser, q, k, v, only=only), []))
        print(f"{shape} | {name} | bytes {same} | {row.resources}", flush=True)
    k8, v8 = (torch.empty_like(x, dtype=torch.float8_e4m3fn) for x in (k, v))
    copy = BandwidthRow(shape, "torch copy (roofline)", "k8.copy_(k), v8.copy_(v)", "-", "-", float("nan"))
    rows.append(copy)
    runs += [
        (copy, "kv_us", lambda: (k8.copy_(k), v8.copy_(v)), []),
        (copy, "k_us", lambda: k8.copy_(k), []),
        (copy, "v_us", lambda: v8.copy_(v), []),
    ]
    ceiling_rows, ceiling_runs = ceilings(shape, k, v, k8, v8)
    rows += ceiling_rows
    _time_rounds(runs + ceiling_runs, args)
    copy_bytes = kv_bytes(batch, kv_heads, seqlen, head_dim, scales=False) / 1e9
    copy_gbps = copy_bytes / (copy.kv_us * 1e-6)
    # The bf16 copy writes 2 bytes an element where the others write 1: its own bytes.
    bf16_bytes = copy_bytes * 4 / (2 + E4M3_BYTES)
    for row in rows:
        moved = gbytes if row.same_bytes != "-" else bf16_bytes if row.name == BF16_COPY else copy_bytes
        row.gbps = moved / (row.kv_us * 1e-6)
        row.of_copy, row.of_read = row.gbps / copy_gbps, row.gbps / read_gbps
    return rows


def _time_rounds(runs: list[tuple[BandwidthRow, str, Callable[[], object], list[float]]], args) -> None:
    """Every run once a round, ``args.rounds`` rounds (drift between rows evens out); each field gets its median."""
    from common.measure.timing import time_cuda

    for _ in range(args.rounds):
        for _, _, run, samples in runs:
            samples.append(time_cuda(run, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms).ms * 1e3)
    for row, field, _, samples in runs:
        setattr(row, field, statistics.median(samples))
        print(f"{row.shape} | {row.name} | {field} {getattr(row, field):.1f} us", flush=True)


def markdown(rows: list[BandwidthRow], read_gbps: float, device_name: str) -> str:
    """The configurations, then the table (last, so that a log's tail shows it)."""
    lines = [
        f"# K/V quantiser bandwidth A/B ({device_name}; read bandwidth {read_gbps:.0f} GB/s)",
        "",
        "Configurations:",
    ]
    lines += [f"- {r.shape} {r.name}: {r.config}" for r in rows]
    lines += [
        "",
        "| shape | variant | K+V µs | K µs | V µs | GB/s | % of copy | % of read | same bytes | regs/spills |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r.shape} | {r.name} | {r.kv_us:.1f} | {r.k_us:.1f} | {r.v_us:.1f} | {r.gbps:.0f} | "
        f"{100 * r.of_copy:.0f} | {100 * r.of_read:.0f} | {r.same_bytes} | {r.resources} |"
        for r in rows
    ]
    return "\n".join(lines) + "\n"


def timing_parser(description: str) -> argparse.ArgumentParser:
    """The arguments of a quantiser A/B over ``SHAPES`` in interleaved rounds (``_time_rounds``'s)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup-ms", type=float, default=25)
    parser.add_argument("--rep-ms", type=float, default=100)
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    return parser


def main() -> None:
    parser = timing_parser(__doc__)
    parser.add_argument("--only", default="", help="comma-separated candidate names (default: every candidate)")
    args = parser.parse_args()
    require_gpu("bench/fp8_kv_quantiser_bw.py")
    from common.measure.peaks import measure_read_gbps

    read_gbps = measure_read_gbps(torch.device("cuda"))
    print(f"read bandwidth {read_gbps:.0f} GB/s", flush=True)
    rows = [row for shape in args.shapes.split(",") for row in shape_rows(shape, args, read_gbps)]
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "fp8_kv_quantiser_bw.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([*asdict(rows[0]), "read_gbps"])
        writer.writerows([*asdict(row).values(), read_gbps] for row in rows)
    report = markdown(rows, read_gbps, torch.cuda.get_device_name())
    (args.out / "fp8_kv_quantiser_bw.md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
