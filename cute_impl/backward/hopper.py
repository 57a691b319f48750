"""Backward rung ``hopper`` in the CuTe DSL, FlashAttention-3's backward on sm_90a, the backward of
``cute/hopper`` (counterparts: ``triton_impl/gluon/backward.py``; the previous rung ``tiled.py``).

What it adds over ``tiled``: the same algorithm (P recomputed from the saved LSE, dK and dV in
registers, dQ by a separate pass, three launches; the default computes dQ in the dK/dV kernel instead,
``dq="reduce"`` below) on Hopper's machinery, which removes the three
limits the tiled rung measured: every product is a ``wgmma.mma_async`` of one warpgroup (64 rows,
operands read by the tensor cores straight from swizzled shared memory, no ldmatrix per warp);
the tiles stream through a TMA ring of ``stages`` slots filled by a producer warp ahead of the
consumers (``cp.async.bulk.tensor`` + mbarriers, no CTA-wide barrier per step); and the query step
is 64 rows at D=128 rather than 16, because a warpgroup's accumulators are spread over 128 threads.

As in ``tiled``, the key block is the rows (M) of every product of the dK/dV kernel: Sᵀ = K Qᵀ and
dPᵀ = V dOᵀ (both operands K-major in shared memory), then dV += Pᵀ dO and dK += dSᵀ Q, whose A
operands Pᵀ and dSᵀ are the previous accumulators converted in registers (the m64nN accumulator
fragment is the m64k16 A fragment, ``scores_to_operand_a``) and whose B operands are Q and dO read
MN-major: the same shared memory as their K-major tiles, described by a second layout (``sQt``,
``sdOt``; the 128-byte swizzle atom of 8 rows × 64 columns is both a K-major and an MN-major atom).
The dQ kernel is the forward's shape: S = Q Kᵀ, dP = dO Vᵀ, dQ += dS K with K read MN-major.

Algorithm (three launches):
  1. ``tiled``'s ``_PreprocessKernel``: D = rowsum(dO ∘ O) − dLSE and LSE₂ = LSE · LOG2_E (+inf for a
     row that sees no key, so its P is 0), both (B, H, Sq) fp32.
  2. ``_DKDVKernel`` (one CTA per ``KEY_TILE`` = 128 keys of one (batch, KV head); a producer warp and
     two consumer warpgroups of 64 keys each):
     a. Producer: TMA each warpgroup's K and V boxes once; then, for every query head of the group
        and every query block that sees these keys, Q and dO into the next ring slot.
     b. Consumer, per slot (``dkdv_step``): issue Sᵀ = K Qᵀ and dPᵀ = V dOᵀ; read LSE₂ of its
        columns; wait for Sᵀ; Pᵀ = exp2(Sᵀ · softmax_scale_log2 − LSE₂) (masked blocks: 0 past the
        causal diagonal and the key tail); issue dV += Pᵀ dO; wait for dPᵀ; dSᵀ = Pᵀ ∘ (dPᵀ − D);
        issue dK += dSᵀ Q; wait for both; release the slot. Masked blocks first, then the rest.
     c. dK ·= softmax_scale; dK and dV stored from the accumulators (rows past Sk not written), or, with
        ``staged_epilogue``, by stmatrix into the warpgroup's own K and V boxes and TMA-stored from there
        (``hopper_epilogue.py``; rows past Sk clipped by the TMA unit).
  3. ``hopper_pass.DQPassKernel`` (one CTA per 128 query rows of one (batch, head), longest first when causal):
     the producer TMAs each warpgroup's Q and dO boxes once and streams K and V; each consumer
     (``dq_step``) issues S = Q Kᵀ and dP = dO Vᵀ, masks S (-inf), P = exp2(S · scale_log2 − LSE₂),
     dS = P ∘ (dP − D), issues dQ += dS K; at the end dQ ·= softmax_scale, stored from registers.

Data movement: HBM →(TMA, ring of ``stages`` slots; rows past the sequence zero-filled by the box
bounds)→ SMEM (128-byte swizzle) →(wgmma descriptors)→ tensor cores → fp32 accumulators in the
consumers' registers (``setmaxnreg``: 240 / 24 per consumer / producer thread). LSE₂ and D: from HBM.

Tiles (``BackwardTiles``, ``CANDIDATES``): ``tile_m`` query rows per dK/dV step (the N of Sᵀ), the dQ
kernel's ``dq_tile_n`` keys per step, ``stages`` ring slots, and two overlaps: ``dkdv_overlap`` leaves
a step's dV and dK products in flight under the next step's Sᵀ and dPᵀ (and its exp2), ``dq_overlap``
the dQ product under the next S and dP; a slot is then freed one step later (``SlotRelease``). At
D=128 a consumer thread holds dK and dV (2 · 64 fp32), Sᵀ and dPᵀ (2 · tile_m / 2) and Pᵀ, dSᵀ in 16
bits: 64 query rows per step fit 240 registers as the step is written (237 used); 80 (FlashAttention-4's
non-causal D=128 tile, dq="reduce" only) fit once Sᵀ's accumulator starts at −LSE₂ / scale_log2 and dSᵀ
reads the 16-bit Pᵀ (``hopper_rows.lse_in_accumulator``), dQ then computed transposed (``hopper_dq.py``);
with ``late_dv`` (FlashAttention-4's order: dV += Pᵀ dO issued after dSᵀ, Pᵀ converted to 16 bits only then,
so the two copies are never both live) dSᵀ reads fp32 Pᵀ instead (sm_90a, P1's unmasked step: 602 → 522 SASS
instructions, 6.5 a query row against the 64-row step's 6.8; FlashAttention-4's own 80-row step: 465, 40 of
them its sequence mask); only 32 leave ptxas the room to keep overlapped wgmmas asynchronous (the static test
checks the SASS for serialised ones).

Constraints: fp16/bf16; D ∈ {64, 128}; any Sq, Sk ≥ 1; causal (top-left or bottom-right) or not; GQA
and MQA (dK and dV summed over the group's query heads in registers, no atomics); the LSE's gradient;
exactly sm_90 (WGMMA, setmaxnreg). Refused: ``cache_seqlens``, paged caches, D = 256, fp32.

What the measurements taught (H200, B=2 H=16 S=8192 D=128 bf16, TFLOP/s counting the five products,
``results/h200/backward-compare/``): 421 (395 causal) with the separate dQ pass, 2.5× ``tiled``, its
tensor cores running seven products for the five counted, which FA3/FA4 avoid by computing dQ in the
dK/dV kernel and adding it to an fp32 dQ by bulk reduce-adds from shared memory, by a warp of its own.

The variant ``dq="reduce"`` (``BackwardTiles.dq``, ``hopper_dq.py``) does that, and is the default
(``default_tiles``): step 2 also shares dSᵀ through shared memory and issues a dQ tile = dS K (five
products per step), warp 1 of the producer warpgroup adds each step's dQ tile into an fp32 dQaccum by
``cp.reduce.async.bulk``, and step 3 becomes a postprocess (dQ = softmax_scale · dQaccum). dK and dV
are deterministic; dQ's adds land in no fixed order (under ``torch.use_deterministic_algorithms`` the
rung runs the separate pass). First GPU run (``results/h200/backward-cute-dq-reduce/``): 453.9 / 431.7
TFLOP/s at P1 / causal, 360.3 at D=64 (B=4 H=32): +9-11 % over the separate pass.

The defaults stage dK and dV in the K and V boxes and TMA-store them (``BackwardTiles.staged_epilogue``,
``hopper_epilogue.py``) instead of storing from the accumulators two bytes a store (128 ``STG.E.U16`` per
consumer thread at D=128; ``results/h200/backward-staged-epilogue/``: 559.6 → 580.0 / 529.1 → 549.7 /
498.5 → 507.1 / 370.3 → 422.9 TFLOP/s at P1 / causal / D=64 B=4 H=32 / B=8 S=2048 causal).

Limits (not done): no ping-pong between the consumer warpgroups, no persistent scheduler;
dq="reduce" zeroes its dQaccum by a separate fill (``torch.zeros``: 29 µs at B=8 H=16 S=2048 D=128, 134 MB,
``results/h200/backward-kernels-2026-11-30/``): the candidates ``*_zeropre`` (``BackwardTiles.zero_in_preprocess``)
allocate it by ``torch.empty`` and have the preprocess zero it, each CTA its 64 rows' share by 16-byte stores
issued before its loads of O and dO, the last CTA of a head the layout's padding too, as FlashAttention-4's
preprocess does (timed level with the fill, left off: ``results/h200/backward-zero-in-preprocess/``; level again
once the preprocess loaded its LSE ahead, 2026-12-04: ``results/h200/backward-zero-in-preprocess-2026-12-04/``);
dq="reduce" takes 64 query rows per step, 128 at D=64
(FA3's D=64 step, the D=64 default; dV then issued after dSᵀ, ptxas serialised the loop otherwise) or 80
at D=128 (FA4's non-causal step, the non-causal D=128 default with ``late_dv``), and its
dK/dV overlap only at D=64. ``tma_rows`` (``hopper_rows.py``, the default: 540.8 / 485.5 / 439.0 TFLOP/s,
P1 / causal / D=64) loads LSE₂ and D by TMA into the ring. ``late_dv`` (64 and 80 rows at D=128, 128 at D=64;
``bench/cute_bwd_gap_ab.sh``) is in every default. ``rebased_operands`` (``hopper_desc.py``): the wgmma
descriptors of the boxes a runtime index picks (each warpgroup's K and V, dQ's Kᵀ share and dS buffer) built from
the box's own address, not re-added in 64 bits every k-step (sm_90a, P1's unmasked step: 438 → 410 SASS
instructions, 160 → 138 uniform ones; ``bench/cute_bwd_desc_ab.sh``): in the non-causal D=128 default, 80 rows a
step (``DEFAULTS``: the measurements). Candidates: ``bench.backward --candidates``.

Short causal rows (``CHAINED_CAUSAL``, issue #40; the last is the causal D=128 default): ``dependent_launch`` chains
the three launches by programmatic dependent launch (the dK/dV CTAs' launch, set-up and K/V loads under the
preprocess's last wave, the postprocess's launch under the dK/dV kernel's tail; ``griddepcontrol.wait`` before each
first read of the previous kernel's writes), with or without ``zero_in_preprocess``; ``postprocess_reversed`` has the
postprocess take the (batch, head) items last first, so that it starts on the dQaccum the dK/dV kernel's last CTAs
leave in L2. Timed against ``UNCHAINED_CAUSAL`` (H200, 2026-12-04, ``results/h200/backward-chained-causal/`` and
``backward-chained-causal-20rounds/``): the full chain faster in all nine medians of three calls (4, 10 and 20
rounds) at B=8 S=2048, B=16 S=1024 and P1 causal, +0.4 to +1.6 %, each inside its rounds' spread; dK and dV bit for
bit the unchained build's. Taken on that consistency.

Where it stands (H200, 2026-12-04, ``compare.py --backward --rounds 4``,
``results/h200/backward-anchors-2026-12-04-chained/``): 606 / 571 / 529 / 451 TFLOP/s at P1 / P1 causal / D=64 B=4
H=32 / B=8 S=2048 causal, 1.01 / 1.02 / 1.02 / 0.97× FlashAttention-4's sm90 backward and 1.12-1.20× cuDNN's.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import cpasync, warpgroup

from common.contract.capability import BOTTOM_RIGHT, GQA, LSE
from common.contract.problem import Problem
from common.contract.registry import Backward
from common.toolchain.arch import SM90A, check_sm90
from common.toolchain.compile import KernelBinary
from cute_impl._device import LOG2_E
from cute_impl._hopper_device import (
    CONSUMER_REGISTERS,
    PRODUCER_REGISTERS,
    ROWS_PER_WARPGROUP,
    THREADS_PER_WARPGROUP,
    WARPS_PER_WARPGROUP,
    head_major,
    one_stage,
    rows_by_cols,
    scores_to_operand_a,
    sequence_major,
    tma_partition,
    warpgroup_gemm,
    warpgroup_mmas,
)
from cute_impl._host import (
    CUTE_DTYPES,
    CompiledKernels,
    fake_stream,
    fake_tensor,
    generic_view,
    mma_sync_supports,
)
from cute_impl.backward import hopper_desc, hopper_dq, hopper_epilogue, hopper_pass, hopper_rows, tiled
from cute_impl.backward._device import (
    CONSUMER_WARPGROUPS,
    MN_MAJOR,
    BackwardOperands,
    SlotRelease,
    allocate_rings,
    cute_gradients,
    fixed_layout,
    heaviest_first,
    load_fixed,
    load_pair,
    query_block_range,
    shared_storage,
    smem_tensor,
    store_rows,
    streamed_layouts,
)

HEAD_DIMS = (64, 128)
KEY_TILE = CONSUMER_WARPGROUPS * ROWS_PER_WARPGROUP
THREADS_PER_CTA = (1 + CONSUMER_WARPGROUPS) * THREADS_PER_WARPGROUP


@dataclass(frozen=True)
class BackwardTiles:
    """One variant: ``tile_m`` query rows per dK/dV step, ``dq_tile_n`` keys per dQ step, ``stages``
    slots in each kernel's ring of streamed tiles."""

    tile_m: int
    dq_tile_n: int
    stages: int
    # A step's last products (dV += Pᵀ dO and dK += dSᵀ Q; dQ += dS K) stay in flight under the next
    # step's first two, its slot freed one step later (``SlotRelease``). Only where ptxas keeps the wgmmas
    # asynchronous: at D=128 with 64 rows per step in flight across the loop's back edge (and with
    # anything in flight across the dK/dV kernel's loop over the group's heads) it serialises every
    # wgmma of the loop (one wait per instruction in the SASS).
    dkdv_overlap: bool = False
    dq_overlap: bool = False
    # "pass": dQ by the separate kernel (deterministic); "reduce": dQ in the dK/dV kernel, added into an
    # fp32 dQaccum by bulk reduce-adds (``hopper_dq.py``; not bitwise deterministic).
    dq: str = "pass"
    # LSE₂ and D of each query block loaded by TMA with its Q and dO into the ring slot and read from shared
    # memory by the dK/dV kernel, instead of 2 · tile_m / 8 bounds-checked loads from HBM per thread per step.
    tma_rows: bool = False
    # Causal: the dK/dV kernel's CTAs taken block-major in groups of (batch, KV head) items that fill a wave,
    # so that no item's heaviest key blocks start in the last wave (``_device.heaviest_first``).
    heaviest_first: bool = False
    # dK and dV staged by stmatrix in the K and V boxes the consumers no longer need and stored by TMA
    # (``hopper_epilogue.py``), instead of two bytes a store from the accumulators (``_device.store_rows``).
    staged_epilogue: bool = False
    # dq="reduce": dQaccum allocated by ``torch.empty`` and zeroed by the preprocess, each CTA its rows' share by
    # 16-byte stores before its reads of O and dO (``tiled._PreprocessKernel``), instead of a separate fill.
    zero_in_preprocess: bool = False
    # FlashAttention-4's order in the dK/dV step: dV += Pᵀ dO issued once dSᵀ is computed (after the wait for
    # dPᵀ, before dSᵀ is shared), Pᵀ converted to 16 bits only then, so that fp32 Pᵀ and its 16-bit copy are never
    # both live; at 80 rows dSᵀ then reads fp32 Pᵀ, not the 16-bit copy (80 conversions a step fewer).
    late_dv: bool = False
    # The wgmma descriptors of the shared-memory boxes that a runtime index picks (each warpgroup's K and V, its
    # share of Kᵀ and the step's dS buffer for dQ) built from the box's own address (``hopper_desc.py``), so that
    # the k-steps do not redo a 64-bit add with carry on each descriptor.
    rebased_operands: bool = False
    # dq="reduce": programmatic dependent launch along the chain preprocess → dK/dV → postprocess. The preprocess
    # signals ``griddepcontrol.launch_dependents`` as each CTA starts; the dK/dV kernel, launched with programmatic
    # stream serialisation, signals likewise, loads K and V, and waits (``griddepcontrol.wait``) before its first
    # read of what the preprocess writes (LSE₂, D, dQaccum: the producer before the ring, the dQ writer and the
    # consumers before anything); the postprocess, launched so too, waits before reading dQaccum. The dK/dV CTAs'
    # launch, set-up and K/V loads then run under the preprocess's last wave, the postprocess's launch under the
    # dK/dV kernel's tail, as FlashAttention-4 chains its preprocess and main kernel.
    dependent_launch: bool = False
    # dq="reduce": the postprocess takes the (batch, head) items last first, so that it starts on the dQaccum that
    # the dK/dV kernel's last CTAs (the last items, heaviest_first's last group) leave in L2 (``hopper_dq.py``).
    postprocess_reversed: bool = False

    def __post_init__(self) -> None:
        # Overlapped, a slot is freed one step late: one slot would deadlock the producer.
        if (self.dkdv_overlap or self.dq_overlap) and self.stages < 2:
            raise ValueError(f"overlapped steps need two ring slots or more, got {self}")
        if self.dq not in ("pass", "reduce"):
            raise ValueError(f"dq is 'pass' or 'reduce', got {self.dq!r}")
        if (self.dependent_launch or self.postprocess_reversed) and self.dq != "reduce":
            raise ValueError(f"dependent_launch and postprocess_reversed need dq='reduce''s postprocess, got {self}")
        if self.zero_in_preprocess and self.dq != "reduce":
            raise ValueError(f"zero_in_preprocess zeroes dq='reduce''s dQaccum (the pass has none), got {self}")
        # dQ's M is 64 query rows (a step's 64, D split between the warpgroups, or 128, one half each) or, at
        # 80 rows, half of D (dQᵀ; ``hopper_dq.dq_box``); it retires within its step (dK may not); no dQ kernel.
        if self.dq == "reduce" and (self.tile_m not in (64, 80, 128) or self.dq_overlap):
            raise ValueError(f"dq='reduce' takes 64, 80 or 128 query rows per step and no dq_overlap, got {self}")
        # 80 rows seed Sᵀ with the staged LSE₂ (``hopper_rows.seed_scores``); the separate pass has no dQᵀ.
        if self.tile_m == 80 and (self.dq != "reduce" or not self.tma_rows or self.dkdv_overlap):
            raise ValueError(f"80 query rows per step take dq='reduce' and tma_rows, not overlapped, got {self}")

    @property
    def label(self) -> str:
        rows = ("_tmarows" if self.tma_rows else "") + ("_heaviestfirst" if self.heaviest_first else "")
        rows += ("_stagedepi" if self.staged_epilogue else "") + ("_zeropre" if self.zero_in_preprocess else "")
        rows += ("_latedv" if self.late_dv else "") + ("_rebase" if self.rebased_operands else "")
        rows += ("_pdl" if self.dependent_launch else "") + ("_postrev" if self.postprocess_reversed else "")
        if self.dq == "reduce":
            return f"m{self.tile_m}_s{self.stages}_dqreduce" + ("_dkdvoverlap" if self.dkdv_overlap else "") + rows
        overlaps = ("_dkdvoverlap" if self.dkdv_overlap else "") + ("_dqoverlap" if self.dq_overlap else "")
        return f"m{self.tile_m}_dqn{self.dq_tile_n}_s{self.stages}" + overlaps + rows


# The causal D=128 step before the chain (the default until 2026-12-04), and the chained candidates built on it; the
# last, every switch on, is the causal D=128 default.
UNCHAINED_CAUSAL = BackwardTiles(
    64, 64, 2, dq="reduce", tma_rows=True, heaviest_first=True, staged_epilogue=True, late_dv=True
)
CHAINED_CAUSAL = (
    replace(UNCHAINED_CAUSAL, dependent_launch=True),
    replace(UNCHAINED_CAUSAL, dependent_launch=True, zero_in_preprocess=True),
    replace(UNCHAINED_CAUSAL, dependent_launch=True, zero_in_preprocess=True, postprocess_reversed=True),
)

# The first of each head dim is the deterministic default (``default_tiles``); ``DEFAULTS`` names the others'.
# D=128: 64 query rows per dK/dV step is the register limit (docstring), 32 leave room to overlap; the
# dQ kernel's S and dP take dq_tile_n / 2 registers each beside dQ's 64 (at 128 keys, no room to overlap).
CANDIDATES: dict[int, tuple[BackwardTiles, ...]] = {
    64: (
        BackwardTiles(64, 128, 2),
        BackwardTiles(64, 128, 3, dkdv_overlap=True, dq_overlap=True),
        BackwardTiles(64, 64, 3, dkdv_overlap=True, dq_overlap=True),
        BackwardTiles(64, 64, 2),
        BackwardTiles(64, 64, 2, dq="reduce"),
        BackwardTiles(64, 64, 2, dq="reduce", tma_rows=True),
        BackwardTiles(64, 64, 3, dkdv_overlap=True, dq="reduce", tma_rows=True),
        BackwardTiles(128, 64, 2, dq="reduce", tma_rows=True, heaviest_first=True),
        BackwardTiles(128, 64, 2, dq="reduce", tma_rows=True, staged_epilogue=True, zero_in_preprocess=True),
        BackwardTiles(128, 64, 2, dq="reduce", tma_rows=True, staged_epilogue=True, late_dv=True),
        BackwardTiles(128, 64, 2, dq="reduce", tma_rows=True, staged_epilogue=True, rebased_operands=True),
        BackwardTiles(
            128, 64, 2, dq="reduce", tma_rows=True, staged_epilogue=True, late_dv=True, rebased_operands=True
        ),
        BackwardTiles(128, 64, 2, dq="reduce", tma_rows=True),
        BackwardTiles(128, 64, 2, dq="reduce", tma_rows=True, staged_epilogue=True),
    ),
    128: (
        BackwardTiles(64, 64, 2),
        BackwardTiles(32, 64, 3, dkdv_overlap=True, dq_overlap=True),
        BackwardTiles(32, 64, 4, dkdv_overlap=True, dq_overlap=True),
        BackwardTiles(64, 64, 3, dq_overlap=True),
        BackwardTiles(64, 128, 2),
        BackwardTiles(64, 64, 2, dq="reduce"),
        BackwardTiles(80, 64, 2, dq="reduce", tma_rows=True),
        BackwardTiles(64, 64, 2, dq="reduce", tma_rows=True),
        BackwardTiles(
            64, 64, 2, dq="reduce", tma_rows=True, heaviest_first=True, staged_epilogue=True, zero_in_preprocess=True
        ),
        BackwardTiles(80, 64, 2, dq="reduce", tma_rows=True, staged_epilogue=True, late_dv=True),
        BackwardTiles(64, 64, 2, dq="reduce", tma_rows=True, heaviest_first=True, staged_epilogue=True, late_dv=True),
        BackwardTiles(80, 64, 2, dq="reduce", tma_rows=True, staged_epilogue=True, late_dv=True, rebased_operands=True),
        BackwardTiles(
            64, 64, 2, dq="reduce", tma_rows=True, heaviest_first=True, staged_epilogue=True, rebased_operands=True
        ),
        # Issue #40's short causal rows (B8 S2048): the causal default chained by PDL, with the fill or without it,
        # and without it with the postprocess's items last first.
        *CHAINED_CAUSAL,
        BackwardTiles(64, 64, 2, dq="reduce", tma_rows=True, heaviest_first=True),
        BackwardTiles(64, 64, 2, dq="reduce", tma_rows=True, heaviest_first=True, staged_epilogue=True),
    ),
}


@dataclass(frozen=True)
class HopperBackwardConfig:
    """Everything that changes the generated code of the dK/dV and dQ kernels (the compile key; its tiles
    without ``zero_in_preprocess``, which only the preprocess reads: both variants share these binaries)."""

    dtype: torch.dtype
    head_dim: int
    causal: bool
    bottom_right: bool
    gqa: bool
    tiles: BackwardTiles


# ----------------------------------------------------------------------------------------------
# 2. dK and dV: 128 keys per CTA, the query blocks (of every head of the group) streamed
# ----------------------------------------------------------------------------------------------
class _DKDVKernel:
    """Sᵀ = K Qᵀ → Pᵀ → dPᵀ = V dOᵀ → dV += Pᵀ dO → dSᵀ → dK += dSᵀ Q per query block, in wgmma."""

    def __init__(self, config: HopperBackwardConfig):
        self.dtype = CUTE_DTYPES[config.dtype]
        self.head_dim = config.head_dim
        self.causal = config.causal
        self.bottom_right = config.bottom_right
        self.tile_m = config.tiles.tile_m
        self.stages = config.tiles.stages
        self.overlap = config.tiles.dkdv_overlap
        self.dq_reduce = config.tiles.dq == "reduce"
        self.tma_rows = config.tiles.tma_rows
        self.heaviest_first = config.tiles.heaviest_first and config.causal
        self.staged_epilogue = config.tiles.staged_epilogue
        self.late_dv = config.tiles.late_dv
        self.rebase = config.tiles.rebased_operands
        self.pdl = config.tiles.dependent_launch
        self.threads_per_cta = THREADS_PER_CTA

    @cute.jit
    def __call__(
        self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor, mLSE2: cute.Tensor,
        mDelta: cute.Tensor, mdK: cute.Tensor, mdV: cute.Tensor, softmax_scale: Float32,
        mdQaccum: cute.Tensor | None, stream: cuda.CUstream,
    ):  # fmt: skip
        """q, do (B, H, Sq, D); k, v, dk, dv (B, Hkv, Sk, D); lse2, delta (B, H, Sq) fp32; dq="reduce":
        dq_accum (B, H, query blocks, 2, tile_m · D/2) fp32, zeroed (``hopper_dq.py``), else None."""
        # Every tensor addressed through a generic pointer (``_host.generic_view``), as measured.
        mQ, mK, mV, mdO, mLSE2, mDelta, mdK, mdV = [generic_view(t) for t in (mQ, mK, mV, mdO, mLSE2, mDelta, mdK, mdV)]
        if cutlass.const_expr(mdQaccum is not None):
            mdQaccum = generic_view(mdQaccum)
        mQ, mK, mV, mdO, mdK, mdV = (sequence_major(t) for t in (mQ, mK, mV, mdO, mdK, mdV))  # (S, D, (H, B))
        mLSE2, mDelta = head_major(mLSE2), head_major(mDelta)  # (Sq, (H, B))
        D, rows = self.head_dim, ROWS_PER_WARPGROUP
        st_mma, grad_mma = warpgroup_mmas(self.dtype, self.tile_m, D, MN_MAJOR.sm90_mma_major_mode())
        sKV_layout = fixed_layout(self.dtype, D, CONSUMER_WARPGROUPS)  # (64, D, warpgroup)
        sQ_layout, sQt_layout = streamed_layouts(self.dtype, self.tile_m, D, self.stages)
        load = cpasync.CopyBulkTensorTileG2SOp()
        tma_atom_K, mK_tma = cpasync.make_tiled_tma_atom(load, mK, one_stage(sKV_layout), (rows, D))
        tma_atom_V, mV_tma = cpasync.make_tiled_tma_atom(load, mV, one_stage(sKV_layout), (rows, D))
        tma_atom_Q, mQ_tma = cpasync.make_tiled_tma_atom(load, mQ, one_stage(sQ_layout), (self.tile_m, D))
        tma_atom_dO, mdO_tma = cpasync.make_tiled_tma_atom(load, mdO, one_stage(sQ_layout), (self.tile_m, D))
        self.kv_bytes = 2 * CONSUMER_WARPGROUPS * cute.size_in_bytes(self.dtype, one_stage(sKV_layout))
        self.q_bytes = 2 * cute.size_in_bytes(self.dtype, one_stage(sQ_layout))
        extra = hopper_dq.dq_storage_fields(self.dtype, D, self.tile_m) if self.dq_reduce else {}
        row_atoms = (None, None)
        if cutlass.const_expr(self.tma_rows):  # mLSE2 and mDelta become TMA coordinates
            row_atoms, (mLSE2, mDelta) = hopper_rows.tma_atoms(mLSE2, mDelta, self.tile_m)
            self.q_bytes += hopper_rows.slot_bytes(self.tile_m)
            extra = {**extra, **hopper_rows.storage_fields(self.tile_m, self.stages)}
        self.shared_storage = shared_storage(self.dtype, sKV_layout, sQ_layout, self.stages, extra)
        store_atoms = (None, None)
        if cutlass.const_expr(self.staged_epilogue):  # mdK and mdV become TMA coordinates
            store_atoms, (mdK, mdV) = hopper_epilogue.tma_store_atoms(mdK, mdV, one_stage(sKV_layout), D)
        self.kernel(
            st_mma, grad_mma, tma_atom_K, mK_tma, tma_atom_V, mV_tma, tma_atom_Q, mQ_tma, tma_atom_dO, mdO_tma,
            mLSE2, mDelta, mdK, mdV, softmax_scale, sKV_layout, sQ_layout, sQt_layout, mdQaccum, *row_atoms,
            *store_atoms, mQ.shape[2][0] // mK.shape[2][0],
        ).launch(
            grid=[cute.ceil_div(mK.shape[0], KEY_TILE), mK.shape[2][0], mK.shape[2][1]],
            block=[self.threads_per_cta, 1, 1],
            smem=self.shared_storage.size_in_bytes(),
            stream=stream,
            min_blocks_per_mp=1,
            use_pdl=self.pdl,
        )  # fmt: skip

    @cute.kernel
    def kernel(
        self, st_mma: cute.TiledMma, grad_mma: cute.TiledMma, tma_atom_K: cute.CopyAtom, mK: cute.Tensor,
        tma_atom_V: cute.CopyAtom, mV: cute.Tensor, tma_atom_Q: cute.CopyAtom, mQ: cute.Tensor,
        tma_atom_dO: cute.CopyAtom, mdO: cute.Tensor, mLSE2: cute.Tensor, mDelta: cute.Tensor, mdK: cute.Tensor,
        mdV: cute.Tensor, softmax_scale: Float32, sKV_layout: cute.ComposedLayout, sQ_layout: cute.ComposedLayout,
        sQt_layout: cute.ComposedLayout, mdQaccum: cute.Tensor | None, tma_atom_LSE2: cute.CopyAtom | None,
        tma_atom_Delta: cute.CopyAtom | None, tma_atom_dK: cute.CopyAtom | None, tma_atom_dV: cute.CopyAtom | None,
        group: Int32,
    ):  # fmt: skip
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        warp_group = cute.arch.make_warp_uniform(tidx // THREADS_PER_WARPGROUP)
        if cutlass.const_expr(self.pdl):  # the postprocess may launch once every CTA has started (it waits)
            cute.arch.griddepcontrol_launch_dependents()
        n_block, kv_head, batch = cute.arch.block_idx()
        if cutlass.const_expr(self.heaviest_first):
            n_block, kv_head, batch = heaviest_first(n_block, kv_head, batch)
        seqlen_q, seqlen_k = mQ.shape[0], mK.shape[0]
        D, rows = self.head_dim, ROWS_PER_WARPGROUP
        causal_offset = 0
        if cutlass.const_expr(self.bottom_right):
            causal_offset = seqlen_k - seqlen_q
        # The key block's first key and its query blocks are computed in each role's branch: computed
        # before, ptxas spilled the first key around the branch (4 bytes per thread). The query heads per KV
        # head (``group``) come divided by the launch: divided here, ptxas spilled the quotient (80 rows).
        query_blocks = functools.partial(
            query_block_range, tile_n=KEY_TILE, tile_m=self.tile_m, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
            causal=self.causal, causal_offset=causal_offset,
        )  # fmt: skip

        # ==== Shared memory and barriers ==============================================================
        storage, (kv_producer, kv_consumer), q_ring = allocate_rings(
            self.shared_storage, self.stages, self.kv_bytes, self.q_bytes, CONSUMER_WARPGROUPS * WARPS_PER_WARPGROUP
        )
        q_producer, q_consumer = q_ring.make_participants()
        sK = smem_tensor(storage.fixed_a, sKV_layout)  # (64, D, warpgroup)
        sV = smem_tensor(storage.fixed_b, sKV_layout)  # (64, D, warpgroup)
        sQ = smem_tensor(storage.ring_a, sQ_layout)  # (tile_m, D, stage)
        sdO = smem_tensor(storage.ring_b, sQ_layout)  # (tile_m, D, stage)
        sQt = smem_tensor(storage.ring_a, sQt_layout)  # (D, tile_m, stage): sQ read MN-major
        sdOt = smem_tensor(storage.ring_b, sQt_layout)  # (D, tile_m, stage)
        staged = None
        if cutlass.const_expr(self.tma_rows):
            staged = hopper_rows.staged_rows(storage, self.tile_m, self.stages)  # (tile_m, stage) each

        # ==== Producer warp: K and V once, then Q and dO per query block ==============================
        if warp_group == 0:
            cute.arch.setmaxregister_decrease(PRODUCER_REGISTERS)
            if warp_idx == 0:
                m_block_min, _, m_block_max = query_blocks(n_block * KEY_TILE)
                kv_bh = (kv_head, batch)
                gK = cute.local_tile(mK[None, None, kv_bh], (rows, D), (None, 0))  # (64, D, Sk/64)
                gV = cute.local_tile(mV[None, None, kv_bh], (rows, D), (None, 0))  # (64, D, Sk/64)
                tKsK, tKgK = tma_partition(tma_atom_K, sK, gK)  # (TMA, warpgroup), (TMA, Sk/64)
                tVsV, tVgV = tma_partition(tma_atom_V, sV, gV)
                load_fixed((tma_atom_K, tma_atom_V), (tKgK, tVgV), (tKsK, tVsV), n_block * CONSUMER_WARPGROUPS,
                           kv_producer)  # fmt: skip
                if cutlass.const_expr(self.pdl):  # K and V are the caller's; LSE₂ and D the preprocess's
                    cute.arch.griddepcontrol_wait()
                for head_in_group in cutlass.range(group, unroll=1):
                    bh = (kv_head * group + head_in_group, batch)
                    gQ = cute.local_tile(mQ[None, None, bh], (self.tile_m, D), (None, 0))  # (tile_m, D, m)
                    gdO = cute.local_tile(mdO[None, None, bh], (self.tile_m, D), (None, 0))  # (tile_m, D, m)
                    tQsQ, tQgQ = tma_partition(tma_atom_Q, sQ, gQ)  # (TMA, stage), (TMA, m)
                    tdOsdO, tdOgdO = tma_partition(tma_atom_dO, sdO, gdO)
                    loads = ((tma_atom_Q, tma_atom_dO), (tQgQ, tdOgdO), (tQsQ, tdOsdO))  # (atoms, sources, slots)
                    if cutlass.const_expr(self.tma_rows):  # LSE₂ and D of the block into the same slot
                        loads = hopper_rows.add_loads(loads, (tma_atom_LSE2, tma_atom_Delta), staged, (mLSE2, mDelta),
                                                      bh)  # fmt: skip
                    atoms, sources, slots = loads
                    for m_block in cutlass.range(m_block_min, m_block_max, unroll=1):
                        q_producer = load_pair(atoms, tuple(g[None, m_block] for g in sources), slots, q_producer)
            if cutlass.const_expr(self.dq_reduce):  # noqa: SIM102 (a compile-time and a runtime test)
                if warp_idx == 1:  # dq="reduce": adds the consumers' dQ tiles into dQaccum
                    if cutlass.const_expr(self.pdl):  # dQaccum zeroed before (by the preprocess or a fill)
                        cute.arch.griddepcontrol_wait()
                    n_start = n_block * KEY_TILE
                    columns = hopper_dq.dq_columns(D, self.tile_m)
                    hopper_dq.dq_writer(mdQaccum, storage.dQ, columns, query_blocks, group, kv_head, batch, n_start)

        # ==== Consumer warpgroups: 64 keys each =======================================================
        if warp_group > 0:
            cute.arch.setmaxregister_increase(CONSUMER_REGISTERS[CONSUMER_WARPGROUPS])
            if cutlass.const_expr(self.pdl):  # without tma_rows they read LSE₂ and D from HBM
                cute.arch.griddepcontrol_wait()
            n_start = n_block * KEY_TILE
            m_block_min, m_block_unmasked, m_block_max = query_blocks(n_start)
            w = warp_group - 1
            wg_tidx = tidx % THREADS_PER_WARPGROUP
            st_thr = st_mma.get_slice(wg_tidx)
            grad_thr = grad_mma.get_slice(wg_tidx)
            sK_w = hopper_desc.box(sK, w, sKV_layout.inner, self.rebase)  # (64, D)
            sV_w = hopper_desc.box(sV, w, sKV_layout.inner, self.rebase)  # (64, D)
            tSrK = st_thr.make_fragment_A(st_thr.partition_A(sK_w))  # (MMA, 1, D/16)
            tdPrV = st_thr.make_fragment_A(st_thr.partition_A(sV_w))  # (MMA, 1, D/16)
            tSrQ = st_thr.make_fragment_B(st_thr.partition_B(sQ))  # (MMA, 1, D/16, stage)
            tdPrdO = st_thr.make_fragment_B(st_thr.partition_B(sdO))  # (MMA, 1, D/16, stage)
            tdKrQt = grad_thr.make_fragment_B(grad_thr.partition_B(sQt))  # (MMA, 1, tile_m/16, stage)
            tdVrdOt = grad_thr.make_fragment_B(grad_thr.partition_B(sdOt))  # (MMA, 1, tile_m/16, stage)
            acc_dK = grad_thr.make_fragment_C(grad_thr.partition_shape_C((rows, D)))  # ((2, 2, D/8), 1, 1)
            acc_dV = grad_thr.make_fragment_C(grad_thr.partition_shape_C((rows, D)))  # ((2, 2, D/8), 1, 1)
            acc_dK.fill(0.0)
            acc_dV.fill(0.0)
            tdVrPt = cute.make_rmem_tensor(grad_thr.partition_shape_A((rows, self.tile_m)), self.dtype)
            tdKrdSt = cute.make_rmem_tensor(grad_thr.partition_shape_A((rows, self.tile_m)), self.dtype)
            gemms = (
                functools.partial(warpgroup_gemm, st_mma, tA=tSrK, tB=tSrQ, accumulate=False),
                functools.partial(warpgroup_gemm, st_mma, tA=tdPrV, tB=tdPrdO, accumulate=False),
                functools.partial(warpgroup_gemm, grad_mma, acc_dV, tA=tdVrPt, tB=tdVrdOt, accumulate=True),
                functools.partial(warpgroup_gemm, grad_mma, acc_dK, tA=tdKrdSt, tB=tdKrQt, accumulate=True),
            )
            acc_shape = st_thr.partition_shape_C((rows, self.tile_m))  # ((2, 2, tile_m/8), 1, 1)
            tScS = st_thr.partition_C(cute.make_identity_tensor((rows, self.tile_m)))  # (key, query) per value
            key_start = n_start + w * rows
            release = SlotRelease(q_ring, self.stages, self.overlap)
            dq = None
            if cutlass.const_expr(self.dq_reduce):
                dq = hopper_dq.DQReduce(storage, self.dtype, D, self.tile_m, st_mma, w, wg_tidx, self.rebase)
            epilogue = None
            if cutlass.const_expr(self.staged_epilogue):
                atoms = (tma_atom_dK, tma_atom_dV)
                epilogue = hopper_epilogue.StagedEpilogue(atoms, grad_mma, sK, sV, w, wg_tidx, self.dq_reduce)
            steps_done = Int32(0)
            kv_consumer.wait_and_advance()  # K and V stay for the whole CTA: never released
            for head_in_group in cutlass.range(group, unroll=1):
                bh = (kv_head * group + head_in_group, batch)
                step = functools.partial(
                    self.dkdv_step, gemms, (tdVrPt, tdKrdSt), acc_shape, tScS,
                    (*hopper_rows.step_rows(mLSE2, mDelta, staged, bh), seqlen_q, seqlen_k, causal_offset), key_start,
                    softmax_scale * LOG2_E, release, dq,
                )  # fmt: skip
                for m_block in cutlass.range(m_block_min, m_block_unmasked, unroll=1):
                    q_consumer, steps_done = step(q_consumer, steps_done, m_block, masked=True)
                for m_block in cutlass.range(m_block_unmasked, m_block_max, unroll=1):
                    q_consumer, steps_done = step(q_consumer, steps_done, m_block, masked=False)
                warpgroup.wait_group(0)  # overlapped: the head's last dV and dK

            # ---- dK carries the softmax scale of S = softmax_scale · Q Kᵀ; dV none ------------------
            acc_dK.store(acc_dK.load() * softmax_scale)
            kv_bh = (kv_head, batch)
            box = n_block * CONSUMER_WARPGROUPS + w
            if cutlass.const_expr(self.staged_epilogue):  # through the K and V boxes, by TMA (rows past Sk clipped)
                epilogue.store(acc_dK, acc_dV, mdK[None, None, kv_bh], mdV[None, None, kv_bh], box)
            else:
                cKV = cute.make_identity_tensor((rows, D))
                gdK = cute.local_tile(mdK[None, None, kv_bh], (rows, D), (box, 0))  # (64, D)
                gdV = cute.local_tile(mdV[None, None, kv_bh], (rows, D), (box, 0))  # (64, D)
                store_rows(grad_thr, acc_dK, gdK, cKV, seqlen_k - key_start)
                store_rows(grad_thr, acc_dV, gdV, cKV, seqlen_k - key_start)

    @cute.jit
    def dkdv_step(
        self, gemms: tuple, operands_a: tuple, acc_shape: cute.Shape, tScS: cute.Tensor, rows: tuple,
        key_start: Int32, softmax_scale_log2: Float32, release: SlotRelease, dq, q_consumer, steps_done: Int32,
        m_block: Int32, masked: cutlass.Constexpr,
    ):  # fmt: skip
        """One query block from the ring: the four products, Pᵀ and dSᵀ between them (``masked``: the
        causal diagonal and the key tail get Pᵀ = 0; the query tail needs no mask: its Q and dO are zero-
        filled, its LSE₂ +inf or, staged, 0: ``hopper_rows.py``); ``dq`` (``hopper_dq.DQReduce`` or None): dQ too."""
        st_gemm, dpt_gemm, dv_gemm, dk_gemm = gemms
        tdVrPt, tdKrdSt = operands_a
        gLSE2, gDelta, seqlen_q, seqlen_k, causal_offset = rows
        slot = q_consumer.wait_and_advance()
        acc_St = cute.make_rmem_tensor(acc_shape, Float32)  # ((2, 2, tile_m/8), 1, 1)
        acc_dPt = cute.make_rmem_tensor(acc_shape, Float32)
        m_start = m_block * self.tile_m
        cS = rows_by_cols(tScS)  # (key, query) of every value, rows by columns
        St, dPt = rows_by_cols(acc_St), rows_by_cols(acc_dPt)
        columns = cute.size(St, mode=[1])
        # 80 query rows: Sᵀ's accumulator starts at −LSE₂ / scale_log2 and dSᵀ reads the 16-bit Pᵀ (below), so
        # neither LSE₂ nor fp32 Pᵀ takes registers beside the four accumulators (``hopper_rows.py``).
        lse_in_acc = hopper_rows.lse_in_accumulator(self.tile_m)
        if cutlass.const_expr(lse_in_acc):
            hopper_rows.seed_scores(St, gLSE2, cS, slot.index, softmax_scale_log2)
        st_gemm(acc_St, stage=slot.index, accumulate=lse_in_acc)
        dpt_gemm(acc_dPt, stage=slot.index)

        # ---- Pᵀ = exp2(Sᵀ · scale_log2 − LSE₂[query]), read while the products run ----------------
        lse2 = hopper_rows.step_values(gLSE2, m_start, cS, slot.index, seqlen_q, Float32.inf, self.tma_rows)
        # Sᵀ has retired (overlapped: so have the previous step's dV and dK, issued before it).
        warpgroup.wait_group(1)
        release.free_previous(steps_done)
        for r in cutlass.range_constexpr(cute.size(St, mode=[0])):
            key = key_start + cS[r, 0][0]
            # Row r keeps the columns from first_visible on: causal, query q sees the key when q +
            # causal_offset >= key; a key past Sk is seen by none (first_visible past the tile).
            first_visible = 0
            if cutlass.const_expr(self.causal):
                first_visible = key - causal_offset - m_start
            first_visible = cutlass.select_(key < seqlen_k, first_visible, self.tile_m)
            for c in cutlass.range_constexpr(columns):
                exponent = St[r, c] * softmax_scale_log2
                if cutlass.const_expr(not lse_in_acc):
                    exponent = exponent - lse2[c]
                p = cute.math.exp2(exponent, fastmath=True)
                if cutlass.const_expr(masked):
                    p = Float32(cutlass.select_(cS[r, c][1] >= first_visible, p, 0.0))
                St[r, c] = p
        # 128 query rows: dV waits for dSᵀ (in flight, its Pᵀ and dV registers made ptxas serialise the loop);
        # ``late_dv``: so it does at any size, and Pᵀ's 16-bit copy is made after dSᵀ (FlashAttention-4's order).
        late_dv = self.late_dv or self.tile_m == 2 * ROWS_PER_WARPGROUP
        if cutlass.const_expr(not self.late_dv):
            scores_to_operand_a(acc_St, tdVrPt)
        if cutlass.const_expr(not late_dv):
            dv_gemm(stage=slot.index)

        # ---- dSᵀ = Pᵀ ∘ (dPᵀ − D[query]) --------------------------------------------------------
        # 80 rows: from dV's 16-bit Pᵀ (fp32 Pᵀ is dead from here); ``late_dv``: from fp32 Pᵀ, converted after dSᵀ.
        if cutlass.const_expr(lse_in_acc and not self.late_dv):
            St = rows_by_cols(cute.make_tensor(tdVrPt.iterator, acc_St.layout))
        delta = hopper_rows.step_values(gDelta, m_start, cS, slot.index, seqlen_q, Float32(0.0), self.tma_rows)
        warpgroup.wait_group(0 if late_dv else 1)
        for r in cutlass.range_constexpr(cute.size(St, mode=[0])):
            for c in cutlass.range_constexpr(columns):
                dPt[r, c] = Float32(St[r, c]) * (dPt[r, c] - delta[c])
        scores_to_operand_a(acc_dPt, tdKrdSt)
        if cutlass.const_expr(self.late_dv):
            scores_to_operand_a(acc_St, tdVrPt)
        if cutlass.const_expr(late_dv):
            dv_gemm(stage=slot.index)
        if cutlass.const_expr(dq is not None):
            dq.share_dS(tdKrdSt, acc_dPt.layout, steps_done)
            acc_dQ = dq.issue(steps_done)
        dk_gemm(stage=slot.index)
        if cutlass.const_expr(dq is not None):
            dq.hand_over(acc_dQ)
        release.step_done(slot)
        return q_consumer, steps_done + 1


# ----------------------------------------------------------------------------------------------
# Host: compile once per configuration (from fakes), validate, allocate, launch
# ----------------------------------------------------------------------------------------------
def _fake_dkdv_arguments(config: HopperBackwardConfig) -> tuple:
    element = CUTE_DTYPES[config.dtype]
    operands = [fake_tensor(element, 4) for _ in range(4)]
    rows = [fake_tensor(Float32, 3) for _ in range(2)]
    gradients = [fake_tensor(element, 4) for _ in range(2)]
    dq_accum = fake_tensor(Float32, 5) if config.tiles.dq == "reduce" else None
    return (*operands, *rows, *gradients, Float32(1.0), dq_accum, fake_stream())


def _fake_dq_arguments(config: HopperBackwardConfig) -> tuple:
    element = CUTE_DTYPES[config.dtype]
    operands = [fake_tensor(element, 4) for _ in range(4)]
    rows = [fake_tensor(Float32, 3) for _ in range(2)]
    return (*operands, *rows, fake_tensor(element, 4), Float32(1.0), fake_stream())


def _fake_postprocess_arguments(config: HopperBackwardConfig) -> tuple:
    return (fake_tensor(Float32, 5), fake_tensor(CUTE_DTYPES[config.dtype], 4), Float32(1.0), fake_stream())


def _postprocess_kernel(config: HopperBackwardConfig) -> hopper_dq.DQPostprocessKernel:
    tiles = config.tiles
    dtype = CUTE_DTYPES[config.dtype]
    return hopper_dq.DQPostprocessKernel(
        dtype, config.head_dim, tiles.tile_m, tiles.dependent_launch, tiles.postprocess_reversed
    )


# The binaries' names: this prefix and the kernel's key.
NAME = "cute_backward_hopper_"
KERNELS = {
    "dkdv": CompiledKernels(_DKDVKernel, _fake_dkdv_arguments, arch=SM90A),
    "dq": CompiledKernels(hopper_pass.DQPassKernel, _fake_dq_arguments, arch=SM90A),
    "postprocess": CompiledKernels(_postprocess_kernel, _fake_postprocess_arguments, arch=SM90A),
}


def _kernel_names(config: HopperBackwardConfig) -> tuple[str, ...]:
    """The kernels after the preprocess: dK/dV then dQ's pass, or dK/dV with dQ then dQ's postprocess."""
    return ("dkdv", "postprocess") if config.tiles.dq == "reduce" else ("dkdv", "dq")


# The defaults by (head dim, causal), each a candidate. Both knobs were timed against the staged tiles (each head
# dim's last candidate) in one call, each beside FA4 (H200, results/h200/backward-late-dv-rebase/): ``late_dv`` won
# on all four anchors (P1 565.1 → 577.1, P1 causal 540.5 → 557.2, D=64 B=4 H=32 502.6 → 509.8, B=8 S=2048 causal
# 414.8 → 421.5 TFLOP/s); the 80-row step with both knobs is the fastest non-causal D=128 step (P1 577.0 → 601.7,
# 0.999x FA4; without the rebase 588.4), FA4's tile choice too, which keeps 64 rows when causal. At D=64 both knobs
# together beat each alone in one process (results/h200/backward-cute-d64-both/: 519.7 against late_dv's 514.4 and
# the rebase's 515.2, FA4 522.9).
_D64_DEFAULT = BackwardTiles(
    128, 64, 2, dq="reduce", tma_rows=True, staged_epilogue=True, late_dv=True, rebased_operands=True
)
DEFAULTS: dict[tuple[int, bool], BackwardTiles] = {
    (64, False): _D64_DEFAULT,
    (64, True): _D64_DEFAULT,
    (128, False): BackwardTiles(
        80, 64, 2, dq="reduce", tma_rows=True, staged_epilogue=True, late_dv=True, rebased_operands=True
    ),
    (128, True): CHAINED_CAUSAL[-1],
}


def default_tiles(head_dim: int, causal: bool) -> BackwardTiles:
    """``DEFAULTS[head_dim, causal]``: dQ by bulk reduce-adds, LSE₂ and D by TMA, dK and dV stored by TMA,
    FlashAttention-4's dV order (``late_dv``), at D=64 128 query rows a step with rebased descriptors, at D=128
    causal 64 rows with the heaviest CTAs first, non-causal 80 rows with rebased descriptors; while
    ``torch.use_deterministic_algorithms`` is on, the head dim's first candidate, whose separate dQ pass gives
    bit-identical gradients run after run (as torch's own nondeterministic kernels give way to deterministic ones
    under that switch)."""
    if torch.are_deterministic_algorithms_enabled():
        return CANDIDATES[head_dim][0]
    return DEFAULTS[head_dim, causal]


def backward_config(problem: Problem, tiles: BackwardTiles | None = None) -> HopperBackwardConfig:
    """The compile key of ``problem``'s dK/dV and dQ kernels (``tiles``: ``default_tiles``)."""
    return HopperBackwardConfig(
        dtype=problem.dtype,
        head_dim=problem.head_dim,
        causal=problem.causal,
        bottom_right=problem.bottom_right,
        gqa=problem.kv_heads != problem.heads,
        tiles=replace(tiles or default_tiles(problem.head_dim, problem.causal), zero_in_preprocess=False),
    )


def preprocess_config(problem: Problem, tiles: BackwardTiles, has_dlse: bool) -> tiled.BackwardConfig:
    """The compile key of ``tiled``'s preprocess as this rung runs it (``zero_in_preprocess``: zeroing dQaccum)."""
    return replace(
        tiled.backward_config(problem, has_dlse),
        zero_dq_accum=tiles.zero_in_preprocess,
        launch_dependents=tiles.dependent_launch,
    )


def dq_accumulator(problem: Problem, tiles: BackwardTiles, device: torch.device) -> torch.Tensor:
    """dq="reduce"'s fp32 dQaccum, (B, H, query blocks, 2, tile_m · D/2), contiguous: zeroed here, or, with
    ``zero_in_preprocess``, left as ``torch.empty`` gives it for the preprocess to zero."""
    query_blocks = -(-problem.seqlen_q // tiles.tile_m)
    chunk = tiles.tile_m * problem.head_dim // CONSUMER_WARPGROUPS
    shape = (problem.batch, problem.heads, query_blocks, CONSUMER_WARPGROUPS, chunk)
    allocate = torch.empty if tiles.zero_in_preprocess else torch.zeros
    return allocate(shape, dtype=torch.float32, device=device)


def _launch(
    operands: BackwardOperands, problem: Problem, device: torch.device, tiles: BackwardTiles | None = None
) -> None:
    """``tiled``'s preprocess, then the dK/dV and dQ kernels (dq="reduce": dK/dV adding into a zeroed fp32
    dQaccum, zeroed by a fill or by the preprocess, then its postprocess), on the current stream."""
    tiles = tiles or default_tiles(problem.head_dim, problem.causal)
    config = backward_config(problem, tiles)
    delta, lse_log2 = hopper_rows.row_vectors(problem, device)
    q, k, v, out, d_out, lse, d_lse, dq, dk, dv = operands
    dq_accum = dq_accumulator(problem, tiles, device) if tiles.dq == "reduce" else None
    preprocess = tiled.KERNELS["preprocess"].kernel(preprocess_config(problem, tiles, d_lse is not None))
    zeroed_here = dq_accum.view(problem.batch, problem.heads, -1) if tiles.zero_in_preprocess else None
    preprocess(out, d_out, lse, d_lse, lse_log2, delta, zeroed_here)
    if dq_accum is not None:
        KERNELS["dkdv"].kernel(config)(q, k, v, d_out, lse_log2, delta, dk, dv, problem.scale, dq_accum)
        KERNELS["postprocess"].kernel(config)(dq_accum, dq, problem.scale)
        return
    KERNELS["dkdv"].kernel(config)(q, k, v, d_out, lse_log2, delta, dk, dv, problem.scale, None)
    KERNELS["dq"].kernel(config)(q, k, v, d_out, lse_log2, delta, dq, problem.scale)


def compile_sm90(problem: Problem, has_dlse: bool = False, tiles: BackwardTiles | None = None) -> list[KernelBinary]:
    """The preprocess (``tiled``'s), dK/dV and dQ kernels (dq="reduce": dK/dV and the postprocess) for
    sm_90a at ``problem``'s configuration."""
    tiles = tiles or default_tiles(problem.head_dim, problem.causal)
    config = backward_config(problem, tiles)
    preprocess_key = preprocess_config(problem, tiles, has_dlse)
    preprocess = tiled.KERNELS["preprocess"].binaries(preprocess_key, NAME + "preprocess")
    return [
        *preprocess,
        *(binary for name in _kernel_names(config) for binary in KERNELS[name].binaries(config, NAME + name)),
    ]


# ----------------------------------------------------------------------------------------------
# Capability check
# ----------------------------------------------------------------------------------------------
def supports(problem: Problem, device: torch.device) -> tuple[bool, str]:
    """Exactly sm_90 (WGMMA, TMA, setmaxnreg), fp16/bf16, D 64 or 128, softmax_scale > 0, and the
    features GQA, both causal alignments and a differentiable LSE; ``cache_seqlens`` and paged caches
    are refused."""
    ok, reason = check_sm90(BACKWARD_NAME, device, "sm_90a: TMA, WGMMA, setmaxnreg")
    if not ok:
        return ok, reason
    return mma_sync_supports(BACKWARD_NAME, problem, device, head_dims=HEAD_DIMS, features=(GQA, BOTTOM_RIGHT, LSE))


BACKWARD_NAME = "cute/backward/hopper"
_gradients = cute_gradients(BACKWARD_NAME, supports, _launch)


def hopper_gradients(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, d_out: torch.Tensor,
    problem: Problem, *, d_lse: torch.Tensor | None = None, tiles: BackwardTiles | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(dq, dk, dv) of q (B, H, Sq, D), k and v (B, Hkv, Sk, D) from the forward's O and LSE and the loss's
    d_out (and d_lse); ``tiles`` replaces the head dim's default variant (``CANDIDATES``)."""
    return _gradients(q, k, v, out, lse, d_out, problem, d_lse=d_lse, tiles=tiles)


BACKWARD = Backward(
    name=BACKWARD_NAME,
    gradients=hopper_gradients,
    supports=supports,
    compile_sm90=compile_sm90,
    runs_on_cpu=False,
    source_file=__file__,
)
