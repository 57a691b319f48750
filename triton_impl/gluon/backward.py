"""Gluon backward rung ``hopper`` (FlashAttention-3's backward on sm_90a), the backward of ``gluon/hopper``
(counterparts: ``triton_impl/backward/tiled.py``, the FlashAttention-2 backward in Triton).

What it adds over the Triton tiled backward: the same algorithm (recompute P from the saved LSE per
key block, dK and dV in registers, dQ by a separate pass) with every decision Triton's compiler makes
for it written out, and the warp specialisation Triton 3.6 cannot do on sm_90:
  * TMA descriptors over (B, H, S, D) with a (1, 1, rows, D) box (``_host.descriptor``), so every
    (batch, head) has its own bounds: a ragged tail reads zeros and a store clips rows past S;
  * shared-memory rings and mbarriers allocated and phased by name (``_allocate``): ``fixed_ready``
    for the tiles a CTA keeps, ``a_ready``/``b_ready`` for the two streamed tiles of a ring slot,
    ``empty`` when both consumer warpgroups have finished with the slot;
  * one TMA load warp (``_load_partition``, 24 registers) and two consumer warpgroups, each its own
    partition with its own rows and register budget (``setmaxnreg`` 240), as in ``gluon/hopper``;
  * every product a ``warpgroup_mma`` (wgmma) issued by hand, asynchronously, with the wait depth
    written out (``warpgroup_mma_wait(1)`` retires all but the newest), operands from shared memory
    or (P and dS) from registers in wgmma's A-operand layout, fp32 accumulators.

The key block is the rows of every product of the dK/dV kernel, as in the Triton rung: Sᵀ = K Qᵀ, dPᵀ = V dOᵀ,
dV += Pᵀ dO, dK += dSᵀ Q, so that Pᵀ and dSᵀ come out of their accumulators already in the layout of the next
product's A operand (no transpose through shared memory). Each consumer warpgroup owns 64 of the CTA's 128
keys (one m64 wgmma per product).

Algorithm (three launches):
  1. The Triton rung's ``_preprocess_kernel`` (reused): D = rowsum(dO ∘ O) − dLSE and
     LSE₂ = LSE · LOG2_E (+inf where a row sees no key, so that its P is 0), fp32 (B·H·Sq).
  2. ``_dkdv_kernel`` (one CTA per 128 keys of one (batch, KV head)):
     a. Load warp: TMA each consumer's 64-row K and V tiles once; then, for every query head of the
        KV head's group and every query block whose rows see these keys (``_query_blocks``), wait
        for a free ring slot and TMA the Q and dO tiles into it.
     b. Each consumer, per ring slot (``_dkdv_step``): issue Sᵀ = K Qᵀ and dPᵀ = V dOᵀ; wait for Sᵀ;
        Pᵀ = exp2(Sᵀ · softmax_scale_log2 − LSE₂) (masked blocks: 0 past the causal diagonal and the
        key tail); issue dV += Pᵀ dO; wait for dPᵀ; dSᵀ = Pᵀ ∘ (dPᵀ − D); issue dK += dSᵀ Q; wait
        for both; free the slot. The blocks that need the mask come first, then the others.
        Overlapped (``BackwardTiles.overlap``, the D=128 default): the step's dK += dSᵀ Q is issued in the
        next step, after that step's Sᵀ and dPᵀ, so it runs under the next exp2; the slot is freed
        one step later, and the last step's product follows the loop. The dQ pass likewise.
     c. dK ·= softmax_scale; dK and dV through the consumer's K and V tiles and one TMA store each.
  3. ``_dq_kernel`` (one CTA per 128 query rows of one (batch, head); the causal diagonal's CTAs,
     with the most keys, first): the load warp TMAs each consumer's Q and dO tiles once and streams
     the K and V tiles of the KV head; each consumer (``_dq_step``) issues S = Q Kᵀ and dP = dO Vᵀ,
     P = exp2(S · softmax_scale_log2 − LSE₂) (masked: ``attention_mask``), dS = P ∘ (dP − D),
     dQ += dS K; at the end dQ ·= softmax_scale, out by a TMA store.

dQ (``BackwardTiles.dq``): by default (``"pass"``) a separate pass (step 3; the Triton tutorial's choice and the
Triton rung's fastest), whose products are the forward's shapes: deterministic, no fp32 buffer, but seven
products per tile instead of five. ``"atomic"`` (plain steps) and ``"reduce"`` (plain or overlapped; D=128, listed
by no release; ``backward_dq.py``) have no pass: in step 2b the consumers share their dSᵀ through shared memory,
each makes dQᵀ = Kᵀ dSᵀ for its half of D (overlapped: the previous step's, beside its dK product) and adds it to
a zeroed fp32 buffer, by relaxed per-element atomics (lost: P1 319 TFLOP/s, the default 456) or, FA3's way, by a
TMA bulk reduce-add per step from an fp32 staging tile into a transposed accumulator; a last kernel converts.

Data movement: HBM → SMEM by ``cp.async.bulk.tensor`` (K, V once per dK/dV CTA; Q, dO once per (key block,
query block) through a ``NUM_STAGES``-slot ring; LSE₂ and D by plain loads into the registers of the rows'
layout, masked, under the wgmmas, or with ``tma_rows`` by TMA with Q and dO into the ring slot, each head's
rows padded to a 16-byte stride, ``backward_rows.py``); SMEM → tensor cores by ``wgmma.mma_async``; Pᵀ and
dSᵀ are operands from registers (packed two per 32-bit word by ``cvt``, ``_device._operand_p``; an in-kernel dQ
also shares dSᵀ through SMEM); dK, dV and dQ registers → SMEM → HBM by TMA stores (``"reduce"``: reduce-adds).

Constraints: fp16 and bf16; D ∈ {64, 128}; any Sq, Sk ≥ 1; causal (top-left or bottom-right) or not; GQA and
MQA (dK and dV summed over the group's query heads in registers, no atomics); the LSE's gradient (``d_lse``);
exactly sm_90. Refused: ``cache_seqlens`` (no per-sequence key lengths here), paged caches, D = 256, fp32.
Gluon has no interpreter path: the rung compiles without a GPU (``compile_sm90``) but runs only on one.

Measured (H200, P1 = B=2 H=16 S=8192 D=128 bf16): 465.2 / causal 455.1 TFLOP/s (five products counted), 0.77× / 0.81×
FA4's sm90 backward, which makes dQ += dS K once and bulk-adds it; ours runs seven (the dQ pass). Causal takes 0.511
of the non-causal time for 0.508 of the steps (FA4 0.541). D=128's default has both causal knobs (``consumer_ranges``,
``limit_mask``: ``backward_ranges.py``): +1.9 / +2.1 % at B=8 S=2048 causal in two runs, +0.4 / +0.6 % at P1 causal.
D=64 (B=4 H=32 S=8192): 383.5 / causal 366.6, 0.74× / 0.75× FA4. ``late_dv`` (``backward_late_dv.py``) puts the dK/dV
step in FlashAttention-4's order, which lets it take 128 query rows there (m64n128 wgmmas for Sᵀ and dPᵀ, less
shared-memory operand traffic per FLOP); with the 128-key dQ pass, 397.0 / 384.2 (+3.5 / +4.8 %, 0.77× / 0.78× FA4;
2026-12-02, Triton 3.6): D=64's default non-causal, and causal where it builds spill-free (3.8; ``LATE_DV_SPILLS``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma_wait

from common.contract.capability import BOTTOM_RIGHT, GQA, LSE, check_features
from common.contract.problem import Problem
from common.contract.registry import Backward, Launch
from common.contract.validation import kernel_operand
from common.toolchain.compile import KernelBinary
from common.toolchain.releases import triton_release
from triton_impl._host import LOG2_E
from triton_impl.backward import tiled
from triton_impl.backward._host import compile_launches, run_launches
from triton_impl.gluon import backward_ranges
from triton_impl.gluon._device import (
    _accumulator_layout,
    _as_box,
    _operand_p,
    _partition_barrier,
    _ready_tile,
    _scores,
    _tma_load,
    _tma_store,
    _values_product,
    block_range,
    heaviest_first,
    kv_head_index,
    query_blocks,
)
from triton_impl.gluon._host import (
    CONSUMER_ROWS,
    CONSUMER_WARPS,
    GLUON_DTYPES,
    HEAD_DIMS,
    LOAD_REGISTERS,
    LOAD_WARPS,
    GluonConfig,
    descriptor,
    gluon_device_supported,
)
from triton_impl.gluon.backward_dq import (
    DQ_MODES,
    IN_KERNEL_HEAD_DIM,
    accumulator_descriptor,
    allocate_dq,
    convert_launch,
    k_halves,
    k_tiles_free,
    last_dq_share,
    late_delta,
    overlapped_dq_share,
    plain_dq_share,
    previous_dq_t,
    transposed_accumulator,
)
from triton_impl.gluon.backward_late_dv import dp_t_minus_delta
from triton_impl.gluon.backward_ranges import last_product, previous_stage, release_previous
from triton_impl.gluon.backward_rows import (
    ROW_ALIGN,
    allocate_rows,
    dkdv_rows,
    head_rows,
    load_slot,
    step_row,
    step_rows,
)

BACKWARD_NAME = "gluon/backward/hopper"
DTYPES = (torch.float16, torch.bfloat16)
# Two consumer warpgroups of CONSUMER_ROWS (64) rows each: 128 keys per dK/dV CTA, 128 query rows per dQ CTA.
NUM_CONSUMERS = gl.constexpr(2)
# The register budgets of two consumer warpgroups and the load warp (gluon/hopper's at two consumers).
BUDGET = GluonConfig(block_n=CONSUMER_ROWS, num_stages=1, consumers=NUM_CONSUMERS.value)


@dataclass(frozen=True)
class BackwardTiles:
    """The tiles and ring depths of one variant: the dK/dV kernel streams ``dkdv_block_m`` query rows
    per ring slot through ``dkdv_stages`` slots; the dQ kernel ``dq_block_n`` keys through ``dq_stages``.
    ``overlap``: each consumer step issues the previous step's last product (dK += dSᵀ Q, dQ += dS K)
    after its own first two, so that it runs under this step's exp2 (``_dkdv_step``, ``_dq_step``);
    ``dq_overlap`` False keeps the dQ pass's steps plain (its 128-key tiles spill overlapped)."""

    dkdv_block_m: int
    dkdv_stages: int
    dq_block_n: int
    dq_stages: int
    overlap: bool = False
    dq_overlap: bool | None = None  # None: as ``overlap``
    # "pass": dQ by the separate kernel; "atomic" or "reduce": in the dK/dV kernel by fp32 atomics or TMA
    # reduce-adds (``backward_dq.py``), no dQ pass (its two tile fields unused).
    dq: str = "pass"
    # LSE₂ and D of each query block by TMA into the Q and dO ring slot (``backward_rows.py``), not from HBM.
    tma_rows: bool = False
    # Causal: both kernels' CTAs block-major in groups of (batch, head) items (``_device.heaviest_first``).
    heaviest_first: bool = False
    # Causal: each consumer runs its own 64 keys' (rows') block range, not the CTA's (``backward_ranges.py``).
    consumer_ranges: bool = False
    # Masked steps: one compare a value with its row's limit, the dQ pass's mask after the exp (ditto).
    limit_mask: bool = False
    # dK/dV: dPᵀ − D by the wgmma, LSE₂ read late, dV += Pᵀ dO after dSᵀ (``backward_late_dv.py``): 128 rows at D=64.
    late_dv: bool = False

    def __post_init__(self) -> None:
        # Overlapped, a slot is freed one step late: one slot would deadlock the load warp.
        if (self.overlap and self.dkdv_stages < 2) or (self.overlaps_dq and self.dq_stages < 2):
            raise ValueError(f"overlapped steps need two ring slots or more per kernel, got {self}")
        if self.dq not in DQ_MODES:
            raise ValueError(f"dq is one of {DQ_MODES}, got {self.dq!r}")
        if self.overlap and self.dq == "atomic":
            raise ValueError(f"the atomic in-kernel dQ is built for the non-overlapped steps only, got {self}")
        if self.consumer_ranges and self.dq != "pass":
            raise ValueError(f"an in-kernel dQ shares every step's dSᵀ between the consumers: no own ranges, {self}")
        if self.late_dv and (self.overlap or self.dq != "pass"):
            raise ValueError(f"late_dv is built for the plain steps with the dQ pass only, got {self}")

    @property
    def overlaps_dq(self) -> bool:
        return self.overlap if self.dq_overlap is None else self.dq_overlap

    @property
    def label(self) -> str:
        dq = f"dq {self.dq}" if self.dq != "pass" else f"dq 128x{self.dq_block_n} s{self.dq_stages}"
        overlap = {(True, True): " overlap", (True, False): " overlap dkdv", (False, True): " overlap dq"}
        suffix = overlap.get((self.overlap, self.overlaps_dq), "")
        rows = " tma_rows" * self.tma_rows + " heaviest_first" * self.heaviest_first
        rows += " consumer_ranges" * self.consumer_ranges + " limit_mask" * self.limit_mask + " late_dv" * self.late_dv
        return f"dkdv 128x{self.dkdv_block_m} s{self.dkdv_stages}, {dq}{suffix}{rows}"


# Per head dim, the default first (the first a release lists for the mask: ``default_tiles``); none spills for sm_90a
# (tests/test_backward.py). A dK/dV consumer thread holds dK and dV (2 × 64 fp32 registers at D=128) beside Sᵀ and dPᵀ:
# 64 query rows per slot spill there (120 bytes under 3.8), 32 do not; at D=64, 128 rows spill in the plain order, not
# with ``late_dv``. The overlapped ones hold a slot one step longer (three slots or more); under 3.9 they spill (16-64
# bytes): the plain s3 with tma_rows is D=128's default there. Measured: perf-log.
OVERLAP_SPILLS = ("3.9",)
ALL_CANDIDATES: dict[int, tuple[BackwardTiles, ...]] = {
    64: (
        BackwardTiles(128, 2, 128, 2, tma_rows=True, late_dv=True),
        BackwardTiles(64, 2, 64, 2, tma_rows=True), BackwardTiles(64, 2, 64, 2), BackwardTiles(64, 3, 128, 2),
        BackwardTiles(64, 3, 64, 3, overlap=True), BackwardTiles(64, 3, 64, 3, overlap=True, tma_rows=True),
        BackwardTiles(64, 2, 64, 2, tma_rows=True, heaviest_first=True),
        BackwardTiles(64, 2, 64, 2, tma_rows=True, heaviest_first=True, consumer_ranges=True, limit_mask=True),
        BackwardTiles(128, 2, 64, 2, tma_rows=True, late_dv=True), BackwardTiles(64, 2, 128, 2, tma_rows=True),
    ),
    128: (
        BackwardTiles(32, 3, 64, 3, overlap=True, tma_rows=True, heaviest_first=True, consumer_ranges=True,
                      limit_mask=True),
        BackwardTiles(32, 3, 64, 3, overlap=True, tma_rows=True, heaviest_first=True),
        BackwardTiles(32, 3, 64, 3, overlap=True, tma_rows=True), BackwardTiles(32, 3, 64, 3, overlap=True),
        BackwardTiles(32, 3, 64, 3, tma_rows=True), BackwardTiles(32, 3, 64, 3), BackwardTiles(32, 2, 64, 2),
        BackwardTiles(32, 4, 64, 3, overlap=True), BackwardTiles(32, 3, 128, 2, overlap=True, dq_overlap=False),
        BackwardTiles(32, 3, 128, 2), BackwardTiles(32, 3, 64, 3, dq="atomic"),
        BackwardTiles(32, 3, 64, 3, dq="reduce", tma_rows=True), BackwardTiles(32, 3, 64, 3, dq="reduce"),
        BackwardTiles(32, 3, 64, 3, overlap=True, dq="reduce", tma_rows=True),
        BackwardTiles(32, 3, 64, 3, overlap=True, tma_rows=True, heaviest_first=True, consumer_ranges=True),
        BackwardTiles(32, 3, 64, 3, overlap=True, tma_rows=True, heaviest_first=True, limit_mask=True),
    ),
}  # fmt: skip
# The atomic dQ (319.3 at P1 against 456.4) spills at the static test's ragged GQA shapes (bytes per thread,
# non-causal/causal: 3.6 40/40, 3.8 16/8, 3.9 160/120; P1: 3.6 16/8, 3.8 0/0): no release lists it. The reduce
# dQ lost plain (H200, P1 / causal 450.2 / 428.8 with tma_rows, the default 466.5 / 443.3) and overlapped
# (462.3 / 430.3 against 463.3 / 443.4; it spills under 3.6 outside the step loops: KNOWN_SPILLS): off.
# late_dv's 128-row step at D=64 (``backward_late_dv.py``) builds spill-free non-causal under every release; causal,
# 3.6 and 3.7 spill 24 bytes per thread outside the step loops (the store coordinates, around the masked loop's 32
# hoisted column indices) and 3.9 40-56 bytes in them: listed for both masks by 3.8 only, non-causal by every release
# (tests/test_gluon_backward_late_dv.py). Its non-causal build is the one timed under 3.6 (+3.5 %, above).
LATE_DV_SPILLS = ("3.6", "3.7", "3.9")


def _listed(tiles: BackwardTiles, causal: bool) -> bool:
    """Whether this Triton release lists ``tiles`` for a mask: a dQ pass, and no variant that spills there."""
    release = triton_release()
    late_dv_spills = tiles.late_dv and causal and release in LATE_DV_SPILLS
    return tiles.dq == "pass" and not ((tiles.overlap and release in OVERLAP_SPILLS) or late_dv_spills)


def _candidates(causal: bool) -> dict[int, tuple[BackwardTiles, ...]]:
    return {head_dim: tuple(t for t in tiles if _listed(t, causal)) for head_dim, tiles in ALL_CANDIDATES.items()}


# What this release lists for both masks (the causal default first), and for non-causal problems (their default first).
CANDIDATES = _candidates(causal=True)
NON_CAUSAL_CANDIDATES = _candidates(causal=False)


def default_tiles(problem: Problem) -> BackwardTiles:
    """The variant ``problem`` runs when none is named: the first its mask's list holds at its head dim, but not
    late_dv for one query: Triton specialises Sq = 1 as a constant, and late_dv's dK/dV kernel then spills (144-208
    bytes a thread under 3.6 and 3.8; the 64-row step none)."""
    listed = (CANDIDATES if problem.causal else NON_CAUSAL_CANDIDATES)[problem.head_dim]
    return next(tiles for tiles in listed if not (tiles.late_dv and problem.seqlen_q == 1))


class StepConstants(NamedTuple):
    """The layouts and flags every consumer step shares, built once per kernel as a ``gl.constexpr``."""

    s_layout: gl.NVMMADistributedLayout  # Sᵀ and dPᵀ (dK/dV kernel), S and dP (dQ kernel)
    acc_layout: gl.NVMMADistributedLayout  # dK and dV, or dQ: 64 rows × HEAD_DIM
    p_layout: gl.DotOperandLayout  # Pᵀ and dSᵀ (or dS) as wgmma's A operand, from registers
    NUM_STAGES: int
    CAUSAL: bool
    OVERLAP: bool  # a step issues the previous step's last product (``BackwardTiles.overlap``)
    DQ: str = "pass"  # "atomic", "reduce": the dK/dV kernel adds each step's dQ share (``BackwardTiles.dq``)
    TMA_ROWS: bool = False  # LSE₂ and D come with Q and dO into the ring (``BackwardTiles.tma_rows``)
    LIMIT_MASK: bool = False  # masked steps compare with a limit per row (``BackwardTiles.limit_mask``)
    CONSUMER_RANGES: bool = False  # dK/dV: a consumer may skip steps (``BackwardTiles.consumer_ranges``)
    LATE_DV: bool = False  # dK/dV: dV's product issued after dSᵀ is made (``BackwardTiles.late_dv``)


# ----------------------------------------------------------------------------------------------
# Shared memory, barriers and the load partition (both kernels: two fixed tiles per consumer, a ring)
# ----------------------------------------------------------------------------------------------
@gluon.jit
def _allocate(desc_fixed, desc_stream, NUM_STAGES: gl.constexpr):
    """Shared memory for two fixed tiles per consumer (K and V, or Q and dO; 64 rows × D each, the
    shape of ``desc_fixed``'s box) and a ring of ``NUM_STAGES`` slots of two streamed tiles (the shape
    of ``desc_stream``'s box); their barriers, initialised and fenced."""
    dtype: gl.constexpr = desc_fixed.dtype
    WG_ROWS: gl.constexpr = desc_fixed.block_type.shape[2]
    ROWS: gl.constexpr = desc_stream.block_type.shape[2]
    HEAD_DIM: gl.constexpr = desc_fixed.block_type.shape[3]
    fixed_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([WG_ROWS, HEAD_DIM], dtype)
    ring_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, HEAD_DIM], dtype)
    fixed_a = gl.allocate_shared_memory(dtype, [NUM_CONSUMERS, WG_ROWS, HEAD_DIM], fixed_layout)
    fixed_b = gl.allocate_shared_memory(dtype, [NUM_CONSUMERS, WG_ROWS, HEAD_DIM], fixed_layout)
    ring_a = gl.allocate_shared_memory(dtype, [NUM_STAGES, ROWS, HEAD_DIM], ring_layout)
    ring_b = gl.allocate_shared_memory(dtype, [NUM_STAGES, ROWS, HEAD_DIM], ring_layout)
    fixed_ready = gl.allocate_shared_memory(gl.int64, [NUM_CONSUMERS, 1], mbarrier.MBarrierLayout())
    a_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    b_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for consumer in gl.static_range(NUM_CONSUMERS):
        mbarrier.init(fixed_ready.index(consumer), count=1)
    for stage in gl.static_range(NUM_STAGES):
        mbarrier.init(a_ready.index(stage), count=1)
        mbarrier.init(b_ready.index(stage), count=1)
        # A slot is empty once both consumer warpgroups have arrived.
        mbarrier.init(empty.index(stage), count=NUM_CONSUMERS)
    # The inits are generic-proxy writes and TMA completes the barriers through the async proxy: a
    # proxy fence orders them (as in gluon/hopper); warp_specialize's entry barrier does the rest.
    fence_async_shared()
    return (fixed_a, fixed_b, ring_a, ring_b), (fixed_ready, a_ready, b_ready, empty)


@gluon.jit
def _load_partition(loader, NUM_STAGES: gl.constexpr, TMA_ROWS: gl.constexpr = False):
    """One warp issuing TMA copies. First each consumer's two fixed tiles (rows ``fixed_start`` +
    64 · consumer of ``fixed_head``), on one barrier per consumer; then the stream: for each of
    ``stream_heads`` heads from ``stream_head``, ``blocks`` blocks of rows from block ``first_block``,
    the two tiles of a block into one ring slot, once both consumers have freed it."""
    descs, smem, barriers, coords, rows = loader
    desc_fixed_a, desc_fixed_b, desc_a, desc_b = descs
    fixed_a, fixed_b, ring_a, ring_b = smem
    fixed_ready, a_ready, b_ready, empty = barriers
    batch, fixed_head, fixed_start, stream_head, stream_heads, first_block, blocks = coords
    WG_ROWS: gl.constexpr = fixed_a.shape[1]
    ROWS: gl.constexpr = ring_a.shape[1]

    for consumer in gl.static_range(NUM_CONSUMERS):
        ready = fixed_ready.index(consumer)
        mbarrier.expect(ready, desc_fixed_a.block_type.nbytes + desc_fixed_b.block_type.nbytes)
        start = fixed_start + consumer * WG_ROWS
        _tma_load(desc_fixed_a, [batch, fixed_head, start, 0], ready, _as_box(fixed_a.index(consumer)))
        _tma_load(desc_fixed_b, [batch, fixed_head, start, 0], ready, _as_box(fixed_b.index(consumer)))
    for step in range(stream_heads * blocks):
        stage = step % NUM_STAGES
        # A fresh mbarrier counts as having completed the phase before phase 0: the first lap passes.
        mbarrier.wait(empty.index(stage), ((step // NUM_STAGES) & 1) ^ 1)
        head = stream_head + step // blocks
        row = (first_block + step % blocks) * ROWS
        # With TMA_ROWS (dK/dV), the rows' LSE₂ and D come with Q and dO (``backward_rows``).
        load_slot(desc_a, ring_a, rows, 0, [batch, head, row], a_ready.index(stage), stage, TMA_ROWS)
        load_slot(desc_b, ring_b, rows, 1, [batch, head, row], b_ready.index(stage), stage, TMA_ROWS)


@gluon.jit
def _store_tile(desc, coords, smem, tile):
    """A consumer's gradient tile through its own (no longer read) shared tile and one TMA store; rows
    past the sequence are clipped by the descriptor's per-(batch, head) bounds. Wait with store_wait."""
    _partition_barrier()
    smem.store(tile.to(desc.dtype))
    fence_async_shared()
    _partition_barrier()
    _tma_store(desc, coords, _as_box(smem))


# ----------------------------------------------------------------------------------------------
# dK and dV: one CTA per 128 keys of one (batch, KV head); each consumer owns 64 of them
# ----------------------------------------------------------------------------------------------
@gluon.jit
def _dkdv_step(carry, step, m_start, batch_head, step_args, constants: gl.constexpr, MASKED: gl.constexpr):
    """One ring slot of Q and dO (query rows from ``m_start`` of head ``batch_head``: batch · H + head) into
    this consumer's dK and dV (see the module docstring, step 2b).
    Overlapped, ``carry`` also holds the previous step's dSᵀ (packed): its dK += dSᵀ Q is issued after
    this step's Sᵀ and dPᵀ, so that it runs under this step's softmax, and this step's dSᵀ is returned."""
    dk = carry[0]
    dv = carry[1]
    k_smem, v_smem, q_ring, do_ring, q_ready, do_ready, empty, vectors, offs_n, seqlen, scale_log2 = step_args
    LseLog2, Delta = vectors[0], vectors[1]
    seqlen_q, seqlen_k, causal_offset = seqlen
    s_layout: gl.constexpr = constants.s_layout
    p_layout: gl.constexpr = constants.p_layout
    NUM_STAGES: gl.constexpr = constants.NUM_STAGES
    OVERLAP: gl.constexpr = constants.OVERLAP
    BLOCK_M: gl.constexpr = q_ring.shape[1]

    q_tile = _ready_tile(q_ring, q_ready, step, NUM_STAGES)
    s_t_token = _scores(k_smem, q_tile, s_layout)
    do_tile = _ready_tile(do_ring, do_ready, step, NUM_STAGES)
    if constants.LATE_DV:  # ``backward_late_dv``: the wgmma leaves dPᵀ − D
        dp_t_token = dp_t_minus_delta(v_smem, do_tile, Delta, m_start, batch_head, seqlen_q, step, constants)
    else:
        dp_t_token = _scores(v_smem, do_tile, s_layout)
    # wgmmas retire in order; overlapped, the previous dK and (in-kernel dQ) dQᵀ products follow Sᵀ and dPᵀ.
    LATER: gl.constexpr = 1 + OVERLAP + (NUM_CONSUMERS if OVERLAP and constants.DQ != "pass" else 0)
    if OVERLAP:
        dk = _values_product(carry[2], q_ring.index(previous_stage(step, NUM_STAGES)), dk, p_layout)
        if constants.DQ != "pass":
            dq_t = previous_dq_t(step, vectors, s_layout)
    offs_m = m_start + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
    row_base = batch_head.to(gl.int64) * seqlen_q
    lse_log2, delta = step_rows(LseLog2, Delta, row_base, offs_m, seqlen_q, step, NUM_STAGES, constants.TMA_ROWS)

    s_t = warpgroup_mma_wait(LATER, deps=[s_t_token])
    if constants.LATE_DV:  # LSE₂ read once Sᵀ is in registers, not held under the wgmmas
        lse_log2 = step_row(LseLog2, row_base, offs_m, seqlen_q, step, NUM_STAGES, constants.TMA_ROWS, float("inf"))
    p_t = gl.exp2(s_t * scale_log2 - lse_log2[None, :])
    if MASKED:
        p_t = backward_ranges.mask_p_t(p_t, offs_n, offs_m, m_start, seqlen_k, causal_offset, constants)
    if not constants.LATE_DV:
        dv_token = _values_product(_operand_p(p_t, q_ring.dtype, p_layout), do_tile, dv, p_layout)
    # dV += Pᵀ dO runs while dSᵀ = Pᵀ ∘ (dPᵀ − D) is made (overlapped: the previous dK, dQᵀ too); late_dv: nothing.
    dp_t = warpgroup_mma_wait(LATER - constants.LATE_DV, deps=[dp_t_token])
    if OVERLAP and constants.DQ != "pass":
        delta = late_delta(Delta, row_base, offs_m, seqlen_q, step, NUM_STAGES, constants.TMA_ROWS)
    d_s_t = p_t * dp_t if constants.LATE_DV else p_t * (dp_t - delta[None, :])
    if OVERLAP:
        # dSᵀ's words take the registers of the previous step's, which its dK product reads: made after
        # it has retired (as gluon/hopper's P), and with it the previous slot is free.
        if constants.DQ != "pass":
            dk, dv, dq_t = warpgroup_mma_wait(0, deps=[dk, dv_token, dq_t])
        else:
            dk, dv = warpgroup_mma_wait(0, deps=[dk, dv_token])
        release_previous(empty, step, NUM_STAGES)
        words = _operand_p(d_s_t, q_ring.dtype, p_layout)
        if constants.DQ != "pass":
            # The previous step's share goes out at its coordinates; this step's are kept for the next.
            overlapped_dq_share(dq_t, d_s_t, step, carry[3], vectors)
            carry = (dk, dv, words, (batch_head, m_start))
        else:
            carry = (dk, dv, words)
    elif constants.DQ != "pass":
        dk_token = _values_product(_operand_p(d_s_t, q_ring.dtype, p_layout), q_tile, dk, p_layout)
        carry = plain_dq_share(dk_token, dv_token, d_s_t, empty.index(step % NUM_STAGES), step, (batch_head, m_start),
                               seqlen_q, vectors, s_layout, constants.DQ)  # fmt: skip
    else:
        if constants.LATE_DV:
            # Pᵀ's 16-bit copy made only now (FlashAttention-4's order): its words are not live beside dPᵀ.
            dv_token = _values_product(_operand_p(p_t, q_ring.dtype, p_layout), do_tile, dv, p_layout)
        dk_token = _values_product(_operand_p(d_s_t, q_ring.dtype, p_layout), q_tile, dk, p_layout)
        dv, dk = warpgroup_mma_wait(0, deps=[dv_token, dk_token])
        mbarrier.arrive(empty.index(step % NUM_STAGES), count=1)
        carry = (dk, dv)
    return carry


@gluon.jit
def _dkdv_consumer(index: gl.constexpr, args, constants: gl.constexpr):
    """Consumer ``index``: keys n_start + 64 · index ... + 63, its K and V tiles; every query head of the
    group and every query block the load warp streams, the skipped ones (``consumer_ranges``) and masked
    ones first; then dK and dV out."""
    smem, barriers, out_descs, vectors, coords, seqlen, scales = args
    fixed_k, fixed_v, q_ring, do_ring = smem
    fixed_ready, q_ready, do_ready, empty = barriers
    desc_dk, desc_dv = out_descs
    LseLog2, Delta, dq_out, ds_all, ds_ready = vectors
    batch, heads, kv_head, group, n_start, first_block, blocks, ranges = coords
    skipped, masked_blocks = ranges[index]
    softmax_scale, softmax_scale_log2 = scales
    k_smem = fixed_k.index(index)
    v_smem = fixed_v.index(index)
    WG_N: gl.constexpr = k_smem.shape[0]
    HEAD_DIM: gl.constexpr = k_smem.shape[1]
    BLOCK_M: gl.constexpr = q_ring.shape[1]
    key_start = n_start + index * WG_N
    offs_n = key_start + gl.arange(0, WG_N, layout=gl.SliceLayout(1, constants.s_layout))
    dk = gl.zeros([WG_N, HEAD_DIM], gl.float32, constants.acc_layout)
    dv = gl.zeros([WG_N, HEAD_DIM], gl.float32, constants.acc_layout)
    carry = (dk, dv)
    if constants.OVERLAP:
        # Step 0's "previous dSᵀ" is zero: its dK product adds nothing.
        carry = (dk, dv, _operand_p(gl.zeros([WG_N, BLOCK_M], gl.float32, constants.s_layout), q_ring.dtype,
                                    constants.p_layout))  # fmt: skip
        if constants.DQ != "pass":
            # The previous step's (batch_head, m_start), where its dQᵀ share goes (none before step 0).
            carry = (carry[0], carry[1], carry[2], (batch * heads, first_block * BLOCK_M))

    mbarrier.wait(fixed_ready.index(index), 0)
    vectors = (LseLog2, Delta, dq_out, ds_all, ds_ready, index, k_halves(fixed_k, index, constants.DQ))
    step_args = (k_smem, v_smem, q_ring, do_ring, q_ready, do_ready, empty, vectors, offs_n, seqlen,
                 softmax_scale_log2)  # fmt: skip
    # GQA: dK and dV sum over the group's query heads (kv_head · group + h read this KV head), in registers.
    for h in range(group):
        batch_head = batch * heads + kv_head * group + h
        if constants.CONSUMER_RANGES:  # (an in-kernel dQ's longer carry never skips)
            for block in range(skipped):
                carry = backward_ranges.skip_step(carry, h * blocks + block, step_args, constants)
        for block in range(skipped, skipped + masked_blocks):
            m_start = (first_block + block) * BLOCK_M
            carry = _dkdv_step(carry, h * blocks + block, m_start, batch_head, step_args, constants, MASKED=True)
        for block in range(skipped + masked_blocks, blocks):
            m_start = (first_block + block) * BLOCK_M
            carry = _dkdv_step(carry, h * blocks + block, m_start, batch_head, step_args, constants, MASKED=False)
    dk = carry[0]
    dv = carry[1]
    if constants.OVERLAP:
        dk = last_product(dk, carry[2], q_ring, group * blocks, constants.p_layout, constants.NUM_STAGES)
        if constants.DQ != "pass":
            last_dq_share(group * blocks, carry[3], vectors, constants.s_layout)
    # dK goes out through the K tile, which the other consumer's dQᵀ products read too.
    k_tiles_free(ds_ready, group * blocks, constants.DQ)

    # dK carries the softmax scale of S = softmax_scale · Q Kᵀ; dV none.
    _store_tile(desc_dk, [batch, kv_head, key_start, 0], k_smem, dk * softmax_scale)
    _store_tile(desc_dv, [batch, kv_head, key_start, 0], v_smem, dv)
    tma.store_wait(0)


@gluon.jit
def _dkdv_kernel(
    desc_q, desc_k, desc_v, desc_do, desc_dk, desc_dv, LseLog2, Delta, DQAccum,
    heads, kv_heads, seqlen_q, seqlen_k, softmax_scale, softmax_scale_log2,
    NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, OVERLAP: gl.constexpr,
    DQ: gl.constexpr, TMA_ROWS: gl.constexpr, HEAVIEST_FIRST: gl.constexpr, CONSUMER_RANGES: gl.constexpr,
    LIMIT_MASK: gl.constexpr, LATE_DV: gl.constexpr, CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr,
):  # fmt: skip
    """dK and dV (B, Hkv, Sk, D) of one 128-key block of one (batch, KV head); Q, dO by 4-D descriptors
    with a BLOCK_M-row box, K, V, dK, dV with a 64-row box; LSE₂ and D fp32 (B·H·Sq) vectors (TMA_ROWS: 3-D
    descriptors, ``dkdv_rows``); the fp32 dQ accumulator of ``DQ`` "atomic" (B, H, Sq, D) or "reduce" (the
    transposed one's descriptor, ``backward_dq``), else never read."""
    WG_N: gl.constexpr = desc_k.block_type.shape[2]
    BLOCK_N: gl.constexpr = NUM_CONSUMERS * WG_N
    BLOCK_M: gl.constexpr = desc_q.block_type.shape[2]
    HEAD_DIM: gl.constexpr = desc_q.block_type.shape[3]
    s_layout: gl.constexpr = _accumulator_layout(num_warps, BLOCK_M)
    acc_layout: gl.constexpr = _accumulator_layout(num_warps, HEAD_DIM)
    # Pᵀ and dSᵀ as wgmma's A operand from registers: two 16-bit k per thread and register.
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    constants: gl.constexpr = StepConstants(
        s_layout, acc_layout, p_layout, NUM_STAGES, CAUSAL, OVERLAP, DQ, TMA_ROWS, LIMIT_MASK, CONSUMER_RANGES, LATE_DV
    )

    n_block, batch_kv_head = gl.program_id(0), gl.program_id(1)
    if HEAVIEST_FIRST:  # causal: key block 0 sees the most query blocks
        n_block, batch_kv_head = heaviest_first(n_block, batch_kv_head, gl.num_programs(0), gl.num_programs(1))
    batch = batch_kv_head // kv_heads
    kv_head = batch_kv_head % kv_heads
    group = heads // kv_heads
    # Row i sees keys j <= i + causal_offset: 0 top-left, Sk − Sq bottom-right.
    causal_offset = seqlen_k - seqlen_q if BOTTOM_RIGHT else 0
    n_start = n_block * BLOCK_N
    first_block, blocks, masked_blocks = query_blocks(
        n_start, seqlen_q, seqlen_k, causal_offset, CAUSAL=CAUSAL, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N
    )
    ranges = backward_ranges.consumer_query_blocks(n_start, seqlen_q, seqlen_k, causal_offset, first_block,
                                                   masked_blocks, CONSUMER_RANGES, BLOCK_M, WG_N)  # fmt: skip
    smem, barriers = _allocate(desc_k, desc_q, NUM_STAGES)
    row_loads, LseLog2, Delta = allocate_rows(LseLog2, Delta, smem[2], TMA_ROWS)
    ds_all, ds_ready, staging = allocate_dq(desc_k, desc_q, smem[2], barriers[1], DQ, NUM_CONSUMERS)
    loader = (
        (desc_k, desc_v, desc_q, desc_do),
        smem,
        barriers,
        (batch, kv_head, n_start, kv_head * group, group, first_block, blocks),
        row_loads,
    )
    consumer_args = (
        smem,
        barriers,
        (desc_dk, desc_dv),
        (LseLog2, Delta, (DQAccum, staging), ds_all, ds_ready),
        (batch, heads, kv_head, group, n_start, first_block, blocks, ranges),
        (seqlen_q, seqlen_k, causal_offset),
        (softmax_scale, softmax_scale_log2),
    )
    gl.warp_specialize(
        [
            (_dkdv_consumer, (0, consumer_args, constants)),
            (_dkdv_consumer, (1, consumer_args, constants)),
            (_load_partition, (loader, NUM_STAGES, TMA_ROWS)),
        ],
        [CONSUMER_WARPS, LOAD_WARPS],
        [CONSUMER_REGS, LOAD_REGISTERS],
    )


# ----------------------------------------------------------------------------------------------
# dQ: one CTA per 128 query rows of one (batch, head); each consumer owns 64 of them
# ----------------------------------------------------------------------------------------------
@gluon.jit
def _dq_step(carry, n_block, step_args, constants: gl.constexpr, MASKED: gl.constexpr):
    """One ring slot of K and V (keys from n_block · BLOCK_N) into this consumer's dQ (step 3).
    Overlapped, ``carry`` also holds the previous step's dS (packed), whose dQ += dS K runs under this
    step's softmax (as in ``_dkdv_step``)."""
    dq = carry[0]
    q_smem, do_smem, k_ring, v_ring, k_ready, v_ready, empty, offs_m, rows, seqlen, scale_log2 = step_args
    lse_log2, delta = rows
    _, seqlen_k, causal_offset = seqlen
    s_layout: gl.constexpr = constants.s_layout
    p_layout: gl.constexpr = constants.p_layout
    NUM_STAGES: gl.constexpr = constants.NUM_STAGES
    OVERLAP: gl.constexpr = constants.OVERLAP
    BLOCK_N: gl.constexpr = k_ring.shape[1]

    k_tile = _ready_tile(k_ring, k_ready, n_block, NUM_STAGES)
    s_token = _scores(q_smem, k_tile, s_layout)
    v_tile = _ready_tile(v_ring, v_ready, n_block, NUM_STAGES)
    dp_token = _scores(do_smem, v_tile, s_layout)
    if OVERLAP:
        dq = _values_product(carry[1], k_ring.index(previous_stage(n_block, NUM_STAGES)), dq, p_layout)
    S = warpgroup_mma_wait(2 if OVERLAP else 1, deps=[s_token]) * scale_log2
    if MASKED:
        S = backward_ranges.mask_scores(S, offs_m, n_block * BLOCK_N, seqlen_k, causal_offset, constants)
    # Rows that see no key (LSE₂ +inf) and masked scores (-inf) give P = 0.
    P = gl.exp2(S - lse_log2[:, None])
    if MASKED:
        P = backward_ranges.mask_p(P, offs_m, n_block * BLOCK_N, seqlen_k, causal_offset, constants)
    dP = warpgroup_mma_wait(1 if OVERLAP else 0, deps=[dp_token])
    d_s = P * (dP - delta[:, None])
    if OVERLAP:
        # dS's words are made once the previous dQ product reading the old ones has retired.
        dq = warpgroup_mma_wait(0, deps=[dq])
        release_previous(empty, n_block, NUM_STAGES)
        carry = (dq, _operand_p(d_s, k_ring.dtype, p_layout))
    else:
        dq = warpgroup_mma_wait(
            0, deps=[_values_product(_operand_p(d_s, k_ring.dtype, p_layout), k_tile, dq, p_layout)]
        )
        mbarrier.arrive(empty.index(n_block % NUM_STAGES), count=1)
        carry = (dq,)
    return carry


@gluon.jit
def _dq_consumer(index: gl.constexpr, args, constants: gl.constexpr):
    """Consumer ``index``: query rows start_m + 64 · index ... + 63, its Q and dO tiles; the unmasked key
    blocks of the CTA's (``consumer_ranges``: its own, a prefix) range, then the diagonal and key tail; dQ out."""
    smem, barriers, desc_dq, vectors, coords, seqlen, scales = args
    fixed_q, fixed_do, k_ring, v_ring = smem
    fixed_ready, k_ready, v_ready, empty = barriers
    LseLog2, Delta = vectors
    batch, head, batch_head, start_m, ranges = coords
    n_block_max, n_masked_blocks = ranges[index]
    seqlen_q, _, _ = seqlen
    softmax_scale, softmax_scale_log2 = scales
    q_smem = fixed_q.index(index)
    do_smem = fixed_do.index(index)
    WG_M: gl.constexpr = q_smem.shape[0]
    HEAD_DIM: gl.constexpr = q_smem.shape[1]
    consumer_m = start_m + index * WG_M
    offs_m = consumer_m + gl.arange(0, WG_M, layout=gl.SliceLayout(1, constants.s_layout))
    row_ok = offs_m < seqlen_q
    # This head's rows of the (B·H·Sq) vectors; rows past Sq: LSE₂ +inf makes their P 0.
    row_base = head_rows(batch_head, seqlen_q, constants.TMA_ROWS)
    lse_log2 = gl.load(LseLog2 + row_base + offs_m, mask=row_ok, other=float("inf"))
    delta = gl.load(Delta + row_base + offs_m, mask=row_ok, other=0.0)
    dq = gl.zeros([WG_M, HEAD_DIM], gl.float32, constants.acc_layout)
    carry = (dq,)
    if constants.OVERLAP:
        # Step 0's "previous dS" is zero: its dQ product adds nothing.
        BLOCK_N: gl.constexpr = k_ring.shape[1]
        zero = gl.zeros([WG_M, BLOCK_N], gl.float32, constants.s_layout)
        carry = (dq, _operand_p(zero, k_ring.dtype, constants.p_layout))

    mbarrier.wait(fixed_ready.index(index), 0)
    step_args = (q_smem, do_smem, k_ring, v_ring, k_ready, v_ready, empty, offs_m, (lse_log2, delta), seqlen,
                 softmax_scale_log2)  # fmt: skip
    n_unmasked = n_block_max - n_masked_blocks
    for n_block in range(n_unmasked):
        carry = _dq_step(carry, n_block, step_args, constants, MASKED=False)
    for n_block in range(n_unmasked, n_block_max):
        carry = _dq_step(carry, n_block, step_args, constants, MASKED=True)
    dq = carry[0]
    if constants.OVERLAP:
        dq = last_product(dq, carry[1], k_ring, n_block_max, constants.p_layout, constants.NUM_STAGES)

    # dQ carries the softmax scale; rows past Sq are clipped by the store.
    _store_tile(desc_dq, [batch, head, consumer_m, 0], q_smem, dq * softmax_scale)
    tma.store_wait(0)


@gluon.jit
def _dq_kernel(
    desc_q, desc_k, desc_v, desc_do, desc_dq, LseLog2, Delta,
    heads, kv_heads, seqlen_q, seqlen_k, softmax_scale, softmax_scale_log2,
    NUM_STAGES: gl.constexpr, CAUSAL: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, OVERLAP: gl.constexpr,
    TMA_ROWS: gl.constexpr, HEAVIEST_FIRST: gl.constexpr, CONSUMER_RANGES: gl.constexpr, LIMIT_MASK: gl.constexpr,
    CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr,
):  # fmt: skip
    """dQ (B, H, Sq, D) of 128 query rows of one (batch, head); Q, dO, dQ by 4-D descriptors with a
    64-row box, K and V with a BLOCK_N-row box (their KV head's: GQA reads them, never repeats them)."""
    WG_M: gl.constexpr = desc_q.block_type.shape[2]
    BLOCK_M: gl.constexpr = NUM_CONSUMERS * WG_M
    BLOCK_N: gl.constexpr = desc_k.block_type.shape[2]
    HEAD_DIM: gl.constexpr = desc_q.block_type.shape[3]
    s_layout: gl.constexpr = _accumulator_layout(num_warps, BLOCK_N)
    acc_layout: gl.constexpr = _accumulator_layout(num_warps, HEAD_DIM)
    # dS as wgmma's A operand from registers: two 16-bit k per thread and register.
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    constants: gl.constexpr = StepConstants(
        s_layout, acc_layout, p_layout, NUM_STAGES, CAUSAL, OVERLAP, TMA_ROWS=TMA_ROWS, LIMIT_MASK=LIMIT_MASK
    )

    # Causal: the last query blocks see the most keys; launching them first evens out the tail.
    m_block, batch_head = gl.program_id(0), gl.program_id(1)
    if HEAVIEST_FIRST:
        m_block, batch_head = heaviest_first(m_block, batch_head, gl.num_programs(0), gl.num_programs(1))
    m_block = gl.num_programs(0) - 1 - m_block if CAUSAL else m_block
    batch = batch_head // heads
    head = batch_head % heads
    kv_head = kv_head_index(head, heads, kv_heads)
    causal_offset = seqlen_k - seqlen_q if BOTTOM_RIGHT else 0
    start_m = m_block * BLOCK_M
    # The key blocks any of the CTA's rows sees; the top n_masked_blocks need the mask for some row.
    _, n_block_max, n_masked_blocks = block_range(
        start_m, seqlen_k, causal_offset, CAUSAL=CAUSAL, BOTTOM_RIGHT=BOTTOM_RIGHT, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N
    )
    ranges = backward_ranges.consumer_key_blocks(start_m, seqlen_k, causal_offset, n_block_max, n_masked_blocks,
                                                 CONSUMER_RANGES, BOTTOM_RIGHT, WG_M, BLOCK_N)  # fmt: skip
    smem, barriers = _allocate(desc_q, desc_k, NUM_STAGES)

    loader = ((desc_q, desc_do, desc_k, desc_v), smem, barriers, (batch, head, start_m, kv_head, 1, 0, n_block_max), ())
    consumer_args = (
        smem,
        barriers,
        desc_dq,
        (LseLog2, Delta),
        (batch, head, batch_head, start_m, ranges),
        (seqlen_q, seqlen_k, causal_offset),
        (softmax_scale, softmax_scale_log2),
    )
    gl.warp_specialize(
        [
            (_dq_consumer, (0, consumer_args, constants)),
            (_dq_consumer, (1, consumer_args, constants)),
            (_load_partition, (loader, NUM_STAGES)),
        ],
        [CONSUMER_WARPS, LOAD_WARPS],
        [CONSUMER_REGS, LOAD_REGISTERS],
    )


# ----------------------------------------------------------------------------------------------
# Host: operands, descriptors and the three launches
# ----------------------------------------------------------------------------------------------
def _tma_operand(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a TMA descriptor can address it: strides 16-byte aligned (``kernel_operand``) and no
    broadcast dim (stride 0, as autograd's dO of a sum can be), which TMA cannot express."""
    t = kernel_operand(t)
    if any(stride == 0 and size > 1 for stride, size in zip(t.stride(), t.shape, strict=True)):
        t = t.contiguous()
    return t


def _launches(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    d_out: torch.Tensor,
    problem: Problem,
    d_lse: torch.Tensor | None,
    tiles: BackwardTiles | None = None,
) -> tuple[list[Launch], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The preprocess, dK/dV and dQ (a dQ pass, or the in-kernel dQ's conversion) launches and the
    (dq, dk, dv) they write."""
    tiles = tiles or default_tiles(problem)
    if tiles.dq != "pass" and problem.head_dim != IN_KERNEL_HEAD_DIM:
        # Each consumer's dQᵀ share is half of D's rows: one m64 wgmma at D=128, too few rows below.
        raise ValueError(f"{BACKWARD_NAME}: dq={tiles.dq!r} needs head_dim 128, got {problem.head_dim}")
    q, k, v, out, d_out = (_tma_operand(t) for t in (q, k, v, out, d_out))
    # The atomic dQ's fp32 accumulator, zeroed by the preprocess; the reduce-adds' transposed one, zeroed here.
    dq_accum = torch.empty(q.shape, dtype=torch.float32, device=q.device) if tiles.dq == "atomic" else None
    accum_t = transposed_accumulator(problem, q.device) if tiles.dq == "reduce" else None
    row_align = ROW_ALIGN.value if tiles.tma_rows else 1  # tma_rows: rows padded to a legal TMA stride
    preprocess, delta, lse_log2 = tiled.preprocess_launch(out, d_out, lse, d_lse, problem, dq_accum, row_align)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    dtype = GLUON_DTYPES[q.dtype]
    rows = CONSUMER_ROWS
    scalars = (problem.heads, problem.kv_heads, problem.seqlen_q, problem.seqlen_k, problem.scale,
               problem.scale * LOG2_E)  # fmt: skip
    options = {
        "CAUSAL": problem.causal, "BOTTOM_RIGHT": problem.bottom_right, "OVERLAP": tiles.overlap,
        "TMA_ROWS": tiles.tma_rows, "HEAVIEST_FIRST": tiles.heaviest_first and problem.causal,
        "CONSUMER_RANGES": tiles.consumer_ranges and problem.causal, "LIMIT_MASK": tiles.limit_mask,
        "CONSUMER_REGS": BUDGET.consumer_registers, "num_warps": BUDGET.num_warps, "maxnreg": BUDGET.maxnreg,
    }  # fmt: skip
    dkdv = (
        _dkdv_kernel,
        (triton.cdiv(problem.seqlen_k, NUM_CONSUMERS.value * rows), problem.batch * problem.kv_heads),
        (
            descriptor(q, tiles.dkdv_block_m, dtype), descriptor(k, rows, dtype), descriptor(v, rows, dtype),
            descriptor(d_out, tiles.dkdv_block_m, dtype), descriptor(dk, rows, dtype), descriptor(dv, rows, dtype),
            # With dq "pass" the kernel never reads the accumulator: D stands in for it.
            *dkdv_rows(lse_log2, delta, problem, tiles.dkdv_block_m, tiles.tma_rows),
            accumulator_descriptor(accum_t, problem, tiles.dkdv_block_m) if accum_t is not None
            else delta if dq_accum is None else dq_accum, *scalars,
        ),
        {**options, "NUM_STAGES": tiles.dkdv_stages, "DQ": tiles.dq, "LATE_DV": tiles.late_dv},
    )  # fmt: skip
    if accum_t is not None:
        return [preprocess, dkdv, convert_launch(accum_t, dq, problem)], (dq, dk, dv)
    if dq_accum is not None:
        # dQ = softmax_scale · dQ_accum in the input dtype (the Triton rung's last kernel).
        convert = (
            tiled._dq_convert_kernel,
            (triton.cdiv(problem.seqlen_q, tiled.ROWS_BLOCK_M), problem.batch * problem.heads),
            (dq_accum, dq, problem.seqlen_q, problem.scale),
            {"HEAD_DIM": problem.head_dim, "BLOCK_M": tiled.ROWS_BLOCK_M},
        )
        return [preprocess, dkdv, convert], (dq, dk, dv)
    dq_launch = (
        _dq_kernel,
        (triton.cdiv(problem.seqlen_q, NUM_CONSUMERS.value * rows), problem.batch * problem.heads),
        (
            descriptor(q, rows, dtype), descriptor(k, tiles.dq_block_n, dtype), descriptor(v, tiles.dq_block_n, dtype),
            descriptor(d_out, rows, dtype), descriptor(dq, rows, dtype), lse_log2, delta, *scalars,
        ),
        {**options, "NUM_STAGES": tiles.dq_stages, "OVERLAP": tiles.overlaps_dq},
    )  # fmt: skip
    return [preprocess, dkdv, dq_launch], (dq, dk, dv)


def hopper_gradients(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, d_out: torch.Tensor,
    problem: Problem, *, d_lse: torch.Tensor | None = None, tiles: BackwardTiles | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """The rung's ``Gradients`` (``common.contract.registry``: dq, dk, dv from O, the LSE, dO and dLSE);
    ``tiles`` replaces the problem's default variant (``default_tiles``)."""
    return run_launches(_launches, q, k, v, out, lse, d_out, problem, d_lse, tiles=tiles)


def compile_sm90(problem: Problem, tiles: BackwardTiles | None = None) -> list[KernelBinary]:
    """The three kernels compiled for sm_90a as ``problem``'s launches build them (meta tensors: no GPU)."""
    return compile_launches(_launches, problem, tiles=tiles)


# ----------------------------------------------------------------------------------------------
# Capability check
# ----------------------------------------------------------------------------------------------
def supports(problem: Problem, device: torch.device) -> tuple[bool, str]:
    """fp16/bf16, D 64 or 128, GQA, both causal alignments and the LSE's gradient, on an sm_90 GPU; no
    ``cache_seqlens``, no paged cache."""
    if problem.dtype not in DTYPES:
        return False, f"{BACKWARD_NAME} runs fp16 and bf16, got {problem.dtype_name}"
    if problem.head_dim not in HEAD_DIMS:
        return False, f"{BACKWARD_NAME} needs head_dim in {list(HEAD_DIMS)}, got {problem.head_dim}"
    ok, reason = check_features(BACKWARD_NAME, problem, (GQA, BOTTOM_RIGHT, LSE))
    if not ok:
        return ok, reason
    return gluon_device_supported(BACKWARD_NAME, device, "warpgroup_mma is Hopper's")


BACKWARD = Backward(BACKWARD_NAME, hopper_gradients, supports, compile_sm90, source_file=__file__)
