"""Gluon rung ``hopper``: Triton's explicit dialect, warp-specialised by hand (counterparts:
``triton_impl/hopper.py``, ``cute_impl/hopper.py``). The kernel is here (``attention_kernel``, its
partitions and its pipelined step); the vocabulary it shares with ``gluon/decode`` (SeqlenInfo,
BlockRange, AttentionMask, OnlineSoftmax, the wgmma and P-register helpers) is in
``triton_impl/gluon/_device.py``, the launch glue shared with ``gluon/fp8`` in ``_host.py``.

``gluon/fp8`` launches this same kernel with its ``FP8`` constexpr set: Gluon has no subclassing and a
second copy would double the code, so each ``if FP8:`` below calls a step of ``triton_impl/gluon/fp8.py``
(``fp8.consumer_scales``, ``fp8.values_product``, ``fp8.accumulate``, ``fp8.rescale_factor``,
``fp8.block_scale``, ``fp8.operand_p``, ``fp8.P_EXPONENT``), and the FP8 idea is read there. What stays
here under the flag: the V ring of Vᵀ tiles and the load warp's column coordinates into Vᵀ, wgmma's k
per instruction (32), O's own shared buffer, and the schedule of ``_pipelined_step`` (P V into a fresh
accumulator; masked blocks finish P_(n-1) V_(n-1) before S_n is issued).

What it adds over ``triton/hopper``: the same algorithm (TMA tiles, wgmma from shared memory, online
softmax with exp2 and the folded scale, causal block skipping) with every decision that Triton's
compiler makes for ``triton/hopper`` written out, and the warp specialisation that Triton 3.6's
automatic ``warp_specialize`` cannot do on sm_90 (it takes one consumer warpgroup, at half speed):
one TMA load warp and two (D=128) or three (D=64) consumer warpgroups, each its own partition with
its own query rows and register budget (``setmaxnreg``: 24 for the load warp, 240 or 160 for each
consumer), so the consumers drift apart and one's softmax runs under another's wgmmas.

The three stacks side by side (what Triton decides / what Gluon makes you write / what CuTe makes
you write):
  * TMA: ``desc.load`` in ``triton_impl/hopper.attention_step``, the compiler builds the copies
    and their barriers / ``_load_partition`` calls ``tma.async_load`` into a ring slot after
    ``mbarrier.expect`` / ``HopperAttention.kernel`` in ``cute_impl/hopper.py`` builds TMA atoms
    and partitions them (``_tma_partition``).
  * Barriers: Triton's pipeliner allocates and phases them / ``q_ready``, ``k_ready``, ``v_ready``,
    ``k_empty``, ``v_empty`` and ``turn`` allocated and initialised in ``attention_kernel``, phased
    by block index in ``_load_partition`` and ``_ready_tile`` / ``PipelineTmaAsync`` producer and
    consumer objects in ``cute_impl/hopper.py``.
  * Warpgroup MMA: ``tl.dot``, with wait depths chosen by the compiler / ``warpgroup_mma(...,
    is_async=True)`` and ``warpgroup_mma_wait(n, deps)`` in ``_pipelined_step`` / ``cute.gemm`` on
    tiled-MMA fragments and ``warpgroup.wait_group`` (``next_block``).
  * Warp specialisation: ``tl.range(warp_specialize=True)`` / ``gl.warp_specialize`` with one
    function per partition (``_consumer``, ``_load_partition``) / a ``warp_idx`` branch per role.
  * Register budgets: chosen by the compiler / ``LOAD_REGISTERS`` and ``consumer_registers`` per
    partition, ``maxnreg`` at launch / ``setmaxregister_decrease`` / ``_increase`` per role.
  * Layouts: inferred / ``NVMMADistributedLayout`` for S and O, ``DotOperandLayout`` for P in
    registers, ``NVMMASharedLayout`` for tiles / ``make_smem_layout_a`` / ``_b`` and tiled MMAs.
  What Gluon still decides: register allocation and instruction order inside a partition, the
  order of a reduction (``gl.max`` over a thread's columns is a chain under Triton 3.6 and a tree
  under 3.9; gluon/fp8 writes its own tree), and where a barrier goes. An ``mbarrier.arrive`` from
  a multi-warp partition is lowered to a barrier over that partition plus one elected thread; this
  is why each consumer warpgroup is its own partition (one 8-warp partition kept the two
  warpgroups in lockstep).

Algorithm (``attention_kernel``: one CTA per ``consumers`` × 64 query rows of one (batch, head)):
  1. Load warp: TMA each consumer's Q tile once; for each key block, wait until its K slot is
     empty, TMA K; wait until its V slot is empty, TMA V; each copy completes its ready barrier.
  2. Each consumer, block 0: S = Q K₀ᵀ, ``attention_mask`` and ``online_softmax_update``, P in
     registers (bf16/fp16).
  3. Each consumer, block n ≥ 1 (``_pipelined_step``): rescale O by the previous alpha
     (``online_softmax_rescale``), issue S_n = Q K_nᵀ and O += P_(n-1) V_(n-1) (P from registers),
     wait for S_n only, online softmax of S_n (the ``block_range``'s unmasked blocks first, then its
     ``n_masked_blocks``: the causal diagonal and the ragged last block, through ``attention_mask``)
     while that P V runs, wait for it, free K_n's and V_(n-1)'s slots. With ``pingpong`` the
     consumers issue their wgmmas in turn (FA3's schedule; it pays at D=64 under Triton 3.6 only:
     Triton 3.9's schedule runs D=64 faster without it, ``common.toolchain.releases``).
  4. The last P V; ``online_softmax_finalize`` (O /= row_sum, lse); O through shared memory (the
     consumer's Q buffer) and a TMA store; lse to an fp32 (B, H, Sq) buffer.

Partitions and barriers: the load warp (``_load_partition``, ``LOAD_REGISTERS`` registers) fills two
rings of ``NUM_STAGES`` slots, each slot with a ready barrier (``k_ready``/``v_ready``, completed by
the TMA byte count) and an empty barrier (``k_empty``/``v_empty``, one arrival per consumer once the
wgmma reading it has retired, ``_release``); K_n's slot frees one step before V_n's, so the next K
copy is issued a step early. Each consumer (``_consumer`` → ``_softmax_partition``: the default
partition and one or two workers, 4 warps and ``CONSUMER_REGS`` registers each) owns 64 query rows.

Block ranges: every consumer visits the CTA's [0, n_block_max) blocks, as the load warp loads them;
the blocks below its own ``n_block_max - n_masked_blocks`` are seen in full by all its rows and skip
the mask; the causal diagonal, the ragged last block and blocks past its own causal range are masked.
Block 0 is peeled (it starts the pipeline) and always masked, which costs one masked block per tile.
A tile whose rows see no key (bottom-right with Sq > Sk, or a cache length of 0) still loads and
masks block 0: the pipeline needs one block, and the mask makes it O = 0, lse = -inf. The problem
features are constexprs (``GQA``, ``BOTTOM_RIGHT``, ``HAS_CACHE_SEQLENS``), so with them off the
kernel is the plain one: the KV head is the head, the causal offset a constant 0, Sk the argument.

Packed rows (``PACKED_GROUP`` > 1; gluon/decode's ``PACKED_PREFILL_MIN_ROWS``, off and untimed; cute/hopper's
``packed_group``): a decode step of many query rows a KV head runs here with Q, O and the LSE as (B, Hkv, group
· Sq, ...), row (head in group) · Sq + token (FlashAttention-3's pack-GQA, head-major), so one CTA's K/V blocks
serve the whole group and the step is a prefill's, compute-bound, not a split decode kernel's. The kernel sees
Hkv heads of group · Sq rows and no GQA; what changes is where a row's token comes from: the tokens are seqlen_q
// PACKED_GROUP, the bottom-right offset is Sk - Sq (per sequence with ``CacheSeqlens``), the causal mask takes
each row's diagonal at its token, row % Sq, and a tile may hold every token, so its block range
(``packed_block_range``) loads up to the last token's diagonal and leaves unmasked only the blocks token 0 sees
in full. fp16/bf16 only (gluon/fp8 never sets it); with it 1 the build is the unpacked one, instruction for
instruction.

Data movement: HBM → SMEM by ``cp.async.bulk.tensor`` on 4-D descriptors over (B, H, S, D) with a
(1, 1, rows, D) box, so each (batch, head) has its own bounds (a ragged tail reads zeros and the O
store clips rows past Sq); SMEM → tensor cores by ``wgmma.mma_async``; O registers → SMEM → HBM by
a TMA store.

Constraints: fp16 and bf16; D ∈ {64, 128}; any Sq, Sk ≥ 1, Sq ≠ Sk; causal (top-left) or not;
softmax_scale ≥ 0; exactly sm_90 (``warpgroup_mma`` is Hopper's instruction); Triton 3.6 or 3.9
(the TMA and barrier names differ between them, ``_device.py`` picks the one present). There is no
interpreter path: Gluon kernels compile only for a GPU target.

What the measurements taught (``docs/perf-log.md``, "Gluon ``hopper``"): separate consumer
partitions took the kernel from triton/hopper's speed well above it at D=128; a third
consumer is what D=64 needs; ping-pong costs more than it gives at D=128 in bf16 (gluon/fp8 takes it:
its softmax is as long as its GEMMs); P packed by inline ``cvt`` rather than Triton's conversion
saved Triton 3.6's ptxas a PRMT per word (it shows at D=64, where issue is tight). Not done: lazy O
rescaling and a persistent tile scheduler. Backward (``common.attention`` with inputs that require grad):
``triton_impl/gluon/backward.py``, from this rung's O and LSE.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma_wait,
)

from common.contract.problem import Problem
from common.contract.registry import Runner, warmed_up
from common.contract.validation import kernel_operand
from common.toolchain.compile import KernelBinary
from common.toolchain.releases import release_configs
from triton_impl._host import LOG2_E
from triton_impl.gluon import backward as gluon_backward
from triton_impl.gluon import fp8
from triton_impl.gluon._device import (
    _as_box,
    _operand_p,
    _partition_barrier,
    _ready_tile,
    _scores,
    _tma_load,
    _tma_store,
    _values_product,
    attention_mask,
    block_range,
    kv_head_index,
    online_softmax_finalize,
    online_softmax_rescale,
    online_softmax_update,
    seqlen_info,
)
from triton_impl.gluon._host import (
    CONSUMER_ROWS,
    CONSUMER_WARPS,
    GLUON_DTYPES,
    LOAD_REGISTERS,
    LOAD_WARPS,
    GluonConfig,
    compile_gluon_sm90,
    descriptor,
    descriptor_type,
    feature_arguments,
    gluon_implementation,
    gluon_supported,
    launch_constexprs,
    launch_options,
    validate_gluon_inputs,
)

RUNG = "gluon/hopper"
DTYPES = (torch.float16, torch.bfloat16)


class ConsumerConstants(NamedTuple):
    """What every consumer warpgroup and each of its pipelined steps share at compile time: built once
    by ``attention_kernel`` as a ``gl.constexpr`` (a plain tuple variable would turn its flags into
    tensors), read by field name on the device (Gluon takes NamedTuples; its ``aggregate`` is not
    public in Triton 3.6)."""

    s_layout: gl.NVMMADistributedLayout  # S = Q Kᵀ's accumulator
    o_layout: gl.NVMMADistributedLayout  # O's accumulator
    p_layout: gl.DotOperandLayout  # P as the A operand of P V, from registers
    NUM_STAGES: int
    CAUSAL: bool
    BOTTOM_RIGHT: bool
    PINGPONG: bool
    NUM_CONSUMERS: int
    FP8: bool
    P_EXPONENT: float  # the lift of P: fp8.P_EXPONENT with FP8, else 0
    Q_QUANT_BLOCK: int
    KV_QUANT_BLOCK: int
    ROW_TREE: bool
    PACKED_GROUP: int  # gluon/decode's packed rows (``attention_kernel``'s PACKED_GROUP); 1: rows are tokens


@gluon.jit
def packed_block_range(
    tokens, seqlen_k, causal_offset, CAUSAL: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, BLOCK_N: gl.constexpr
):  # fmt: skip
    """``block_range`` of a tile of packed rows (``PACKED_GROUP``; cute's ``BlockRange.create_exact`` with
    ``packed_seqlen_q``): rows (head in group) · Sq + token, so a tile may hold every token of the ``tokens`` (Sq).
    Its blocks seen in full by every row are token 0's, the blocks it loads end at token Sq - 1's diagonal: two
    one-row ranges of ``block_range``, ``(n_block_min, n_block_max, n_masked_blocks)`` as there."""
    _, first_token_max, first_token_masked = block_range(
        0, seqlen_k, causal_offset, CAUSAL=CAUSAL, BOTTOM_RIGHT=BOTTOM_RIGHT, BLOCK_M=1, BLOCK_N=BLOCK_N
    )
    _, n_block_max, _ = block_range(
        tokens - 1, seqlen_k, causal_offset, CAUSAL=CAUSAL, BOTTOM_RIGHT=BOTTOM_RIGHT, BLOCK_M=1, BLOCK_N=BLOCK_N
    )
    return 0, n_block_max, n_block_max - (first_token_max - first_token_masked)


# ----------------------------------------------------------------------------------------------
# Load partition: one warp issuing TMA copies
# ----------------------------------------------------------------------------------------------
@gluon.jit
def _load_partition(operands, NUM_STAGES: gl.constexpr, CONSUMERS: gl.constexpr, FP8: gl.constexpr):
    descs, smem, barriers, coords = operands
    desc_q, desc_k, desc_v, _ = descs
    q_smem, k_ring, v_ring = smem
    q_ready, k_ready, v_ready, k_empty, v_empty = barriers
    batch, head, kv_head, start_m, n_block_max = coords
    BLOCK_N: gl.constexpr = k_ring.shape[1]

    # One Q tile per consumer warpgroup, each with its own barrier.
    for consumer in gl.static_range(CONSUMERS):
        mbarrier.expect(q_ready.index(consumer), desc_q.block_type.nbytes)
        consumer_m = start_m + consumer * q_smem.shape[1]
        _tma_load(desc_q, [batch, head, consumer_m, 0], q_ready.index(consumer), _as_box(q_smem.index(consumer)))
    for n_block in range(n_block_max):
        stage = n_block % NUM_STAGES
        # A fresh mbarrier counts as having completed the phase before phase 0: the first lap waits on
        # phase 1 and passes at once.
        empty_phase = ((n_block // NUM_STAGES) & 1) ^ 1
        start_n = n_block * BLOCK_N
        mbarrier.wait(k_empty.index(stage), empty_phase)
        mbarrier.expect(k_ready.index(stage), desc_k.block_type.nbytes)
        # GQA: K and V of the KV head this query head reads, straight from its (B, Hkv, Sk, D) tensor.
        _tma_load(desc_k, [batch, kv_head, start_n, 0], k_ready.index(stage), _as_box(k_ring.index(stage)))
        mbarrier.wait(v_empty.index(stage), empty_phase)
        mbarrier.expect(v_ready.index(stage), desc_v.block_type.nbytes)
        # FP8 reads Vᵀ (B, H, D, Sk): its key block is a column block.
        v_coords = [batch, kv_head, 0, start_n] if FP8 else [batch, kv_head, start_n, 0]
        _tma_load(desc_v, v_coords, v_ready.index(stage), _as_box(v_ring.index(stage)))


# ----------------------------------------------------------------------------------------------
# Consumer partitions: ping-pong turns, one pipelined key block, the softmax partition
# ----------------------------------------------------------------------------------------------
@gluon.jit
def _take_turn(turn, event, PINGPONG: gl.constexpr):
    """Ping-pong: wait until the other consumer has issued its wgmmas of the same event."""
    if PINGPONG:
        mbarrier.wait(turn[0], event & 1)


@gluon.jit
def _pass_turn(turn, PINGPONG: gl.constexpr):
    """Ping-pong: let the other consumer issue its wgmmas while this one runs its softmax."""
    if PINGPONG:
        mbarrier.arrive(turn[1], count=1)


@gluon.jit
def _release(k_empty, v_empty, n_block, NUM_STAGES: gl.constexpr):
    """Hand K_n's and V_(n-1)'s slots back to the load warp (the wgmmas reading them have retired).

    Gluon lowers an arrive to one thread of the partition after a barrier over the partition's
    warps, so this warpgroup's arrival comes after all four of its warps passed their wait; the
    slot's barrier completes when every consumer warpgroup has arrived."""
    mbarrier.arrive(k_empty.index(n_block % NUM_STAGES), count=1)
    mbarrier.arrive(v_empty.index((n_block - 1) % NUM_STAGES), count=1)


@gluon.jit
def _pipelined_step(carry, n_block, step_args, constants: gl.constexpr, MASKED: gl.constexpr):
    """Issue S_n, issue O += P_(n-1) V_(n-1), softmax of S_n under that wgmma, free the slots.

    FP8: P_(n-1) V_(n-1) goes into a fresh accumulator; K_n's scale joins the softmax scale of S_n
    (positive, so the row max commutes with it). ``acc`` holds O over V_(n-2)'s scale s_v, and the
    carried ``alpha`` already includes s_v(n-2) / s_v(n-1) (``fp8.rescale_factor``), so one FFMA per
    element, acc · alpha + P V, both rescales O and adds the block: multiplying the product by its
    scale and O by alpha separately took a second pass over O's 64 registers per block."""
    smem, barriers, turn, mask_rows, seqlen, softmax_scale_log2, fp8_scales = step_args
    seqlen_k, causal_offset = seqlen
    p_layout: gl.constexpr = constants.p_layout
    NUM_STAGES: gl.constexpr = constants.NUM_STAGES
    PINGPONG: gl.constexpr = constants.PINGPONG
    FP8: gl.constexpr = constants.FP8
    KV_QUANT_BLOCK: gl.constexpr = constants.KV_QUANT_BLOCK
    acc, P, alpha, row_max, row_sum = carry
    q_smem, k_ring, v_ring = smem
    _, k_ready, v_ready, k_empty, v_empty = barriers
    BLOCK_N: gl.constexpr = k_ring.shape[1]

    if not FP8:
        # O is this block's wgmma accumulator: rescaled before the wgmma is issued.
        acc = online_softmax_rescale(acc, alpha)
    k_tile = _ready_tile(k_ring, k_ready, n_block, NUM_STAGES)
    v_tile = _ready_tile(v_ring, v_ready, n_block - 1, NUM_STAGES)
    FP8_MASKED: gl.constexpr = FP8 and MASKED
    _take_turn(turn, n_block, PINGPONG)
    if FP8_MASKED:
        # FP8 masked blocks (the ragged last block, the causal diagonal) run P_(n-1) V_(n-1) to the end
        # before S_n is issued: its product's and P's registers are free again while S_n is masked
        # (overlapped, 128-key blocks spilled). Non-causal tiles have at most one such block.
        pv = warpgroup_mma_wait(0, deps=[fp8.values_product(P, v_tile, p_layout)])
        acc = fp8.accumulate(acc, alpha, pv)
        s_token = _scores(q_smem, k_tile, constants.s_layout)
    else:
        s_token = _scores(q_smem, k_tile, constants.s_layout)
        pv_token = fp8.values_product(P, v_tile, p_layout) if FP8 else _values_product(P, v_tile, acc, p_layout)
    _pass_turn(turn, PINGPONG)
    if FP8:
        k_scales, v_scales = fp8_scales
        softmax_scale_log2 = softmax_scale_log2 * fp8.block_scale(k_scales, n_block, BLOCK_N, KV_QUANT_BLOCK)
    # wgmmas retire in order: waiting until one is in flight retires S_n, leaves P V running.
    S = warpgroup_mma_wait(0 if FP8_MASKED else 1, deps=[s_token])
    if MASKED:
        S = attention_mask(
            S * softmax_scale_log2, mask_rows, n_block * BLOCK_N, seqlen_k, causal_offset, CAUSAL=constants.CAUSAL
        )
    P_f32, alpha_n, row_max, row_sum = online_softmax_update(
        S, row_max, row_sum, softmax_scale_log2, S_SCALED=MASKED, MASKED=MASKED,
        P_EXPONENT=constants.P_EXPONENT, ROW_TREE=constants.ROW_TREE,
    )  # fmt: skip
    if FP8:
        if not MASKED:
            # P_n's words take the registers of P_(n-1)'s, which the running wgmma reads: made after it.
            pv = warpgroup_mma_wait(0, deps=[pv_token])
            acc = fp8.accumulate(acc, alpha, pv)
        P = fp8.operand_p(P_f32, p_layout)
        alpha = fp8.rescale_factor(alpha_n, v_scales, n_block, BLOCK_N, KV_QUANT_BLOCK)
    else:
        # As for FP8: P_n's words are written after the wgmma that reads P_(n-1)'s has retired.
        acc = warpgroup_mma_wait(0, deps=[pv_token])
        P = _operand_p(P_f32, v_ring.dtype, p_layout)
        alpha = alpha_n
    _release(k_empty, v_empty, n_block, NUM_STAGES)
    return acc, P, alpha, row_max, row_sum


@gluon.jit
def _softmax_partition(
    descs,
    smem,
    o_smem,
    barriers,
    turn,
    coords,
    LSE,
    seqlen_q,
    seqlen,
    softmax_scale_log2,
    scales,
    constants: gl.constexpr,
    HANDS_FIRST_TURN: gl.constexpr,
):
    """One consumer warpgroup: its own BLOCK_M query rows (its Q tile and q_ready barrier), the
    CTA's K/V rings shared with the other consumer. With PINGPONG the two consumers take turns
    issuing their wgmmas in a ring (consumer 0 first: the last one hands it the first turn), so
    one's softmax runs under the others' GEMMs. O leaves through ``o_smem`` (the Q buffer itself
    for fp16/bf16; FP8 writes bf16 O, twice the bytes of its e4m3 Q tile, through its own buffer).

    ``seqlen``: this sequence's ``(seqlen_k, causal_offset)`` (:func:`seqlen_info`).
    FP8 (``scales``: the fp32 scales of Q (B, H, blocks), K and V (B, Hkv, blocks) and the block
    counts): this warpgroup's 64 rows lie in one Q quantisation block, whose scale joins the softmax
    scale; K's and V's scales are those of the KV head (``kv_batch_head`` = batch · Hkv + kv_head).
    ``constants``: the layouts and flags every consumer shares (:class:`ConsumerConstants`)."""
    _, _, _, desc_o = descs
    q_smem, k_ring, v_ring = smem
    q_ready, k_ready, v_ready, k_empty, _ = barriers
    batch, head, start_m, n_block_max, batch_head, kv_batch_head = coords
    seqlen_k, causal_offset = seqlen
    BLOCK_M: gl.constexpr = q_smem.shape[0]
    BLOCK_N: gl.constexpr = k_ring.shape[1]
    HEAD_DIM: gl.constexpr = q_smem.shape[1]
    s_layout: gl.constexpr = constants.s_layout
    p_layout: gl.constexpr = constants.p_layout
    NUM_STAGES: gl.constexpr = constants.NUM_STAGES
    CAUSAL: gl.constexpr = constants.CAUSAL
    PINGPONG: gl.constexpr = constants.PINGPONG
    FP8: gl.constexpr = constants.FP8
    KV_QUANT_BLOCK: gl.constexpr = constants.KV_QUANT_BLOCK
    PACKED_GROUP: gl.constexpr = constants.PACKED_GROUP
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    offs_m = start_m + gl.arange(0, BLOCK_M, layout=row_layout)
    # This warpgroup's unmasked blocks; it visits the CTA's n_block_max blocks, as the load warp
    # loads them (blocks past its own causal range are masked out in full).
    if PACKED_GROUP > 1:
        # Packed rows: the causal diagonal of row r is its token's, r % Sq (seqlen_q counts the packed rows).
        tokens = seqlen_q // PACKED_GROUP
        mask_rows = offs_m % tokens
        _, n_block_max_own, n_masked_blocks = packed_block_range(
            tokens, seqlen_k, causal_offset, CAUSAL=CAUSAL, BOTTOM_RIGHT=constants.BOTTOM_RIGHT, BLOCK_N=BLOCK_N
        )
    else:
        mask_rows = offs_m
        _, n_block_max_own, n_masked_blocks = block_range(
            start_m,
            seqlen_k,
            causal_offset,
            CAUSAL=CAUSAL,
            BOTTOM_RIGHT=constants.BOTTOM_RIGHT,
            BLOCK_M=BLOCK_M,
            BLOCK_N=BLOCK_N,
        )
    n_unmasked = n_block_max_own - n_masked_blocks
    if HANDS_FIRST_TURN:
        _pass_turn(turn, PINGPONG)
    if FP8:
        k_scales, v_scales, softmax_scale_log2, first_scale_log2 = fp8.consumer_scales(
            scales,
            start_m,
            batch_head,
            kv_batch_head,
            softmax_scale_log2,
            constants.Q_QUANT_BLOCK,
            KV_QUANT_BLOCK,
            BLOCK_N,
        )
        fp8_scales = (k_scales, v_scales)
    else:
        fp8_scales = scales
        first_scale_log2 = softmax_scale_log2

    # Block 0 starts the pipeline: its S and softmax run before the loop (masked: it may be ragged
    # or on the causal diagonal).
    mbarrier.wait(q_ready, 0)
    row_max = gl.full([BLOCK_M], float("-inf"), gl.float32, row_layout)
    row_sum = gl.zeros([BLOCK_M], gl.float32, row_layout)
    k_tile = _ready_tile(k_ring, k_ready, 0, NUM_STAGES)
    _take_turn(turn, 0, PINGPONG)
    s_token = _scores(q_smem, k_tile, s_layout)
    _pass_turn(turn, PINGPONG)
    S = warpgroup_mma_wait(0, deps=[s_token])
    mbarrier.arrive(k_empty.index(0), count=1)
    S = attention_mask(S * first_scale_log2, mask_rows, 0, seqlen_k, causal_offset, CAUSAL=CAUSAL)
    P_f32, alpha, row_max, row_sum = online_softmax_update(
        S, row_max, row_sum, first_scale_log2, S_SCALED=True, MASKED=True,
        P_EXPONENT=constants.P_EXPONENT, ROW_TREE=constants.ROW_TREE,
    )  # fmt: skip
    P = fp8.operand_p(P_f32, p_layout) if FP8 else _operand_p(P_f32, v_ring.dtype, p_layout)
    # FP8: acc is zero, so block 0's alpha (finite: 0 for rows that saw no key) needs no V-scale ratio.
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, constants.o_layout)
    # Blocks every row sees in full, then the causal diagonal and the ragged last block. What every
    # step shares is bound once: the tensors in a tuple, the layouts and flags in ``constants``.
    carry = (acc, P, alpha, row_max, row_sum)
    step_args = (smem, barriers, turn, mask_rows, seqlen, softmax_scale_log2, fp8_scales)
    for n_block in range(1, n_unmasked):
        carry = _pipelined_step(carry, n_block, step_args, constants, MASKED=False)
    FP8_FULL: gl.constexpr = FP8 and not CAUSAL
    if FP8_FULL:
        # Without the causal mask only the ragged last block is masked: one step, not a loop (as a loop,
        # Triton 3.9 kept its invariants live across it and spilled at 128 keys).
        n_block = gl.maximum(n_unmasked, 1)
        if n_block < n_block_max:
            carry = _pipelined_step(carry, n_block, step_args, constants, MASKED=True)
    else:
        for n_block in range(gl.maximum(n_unmasked, 1), n_block_max):
            carry = _pipelined_step(carry, n_block, step_args, constants, MASKED=True)
    acc, P, alpha, row_max, row_sum = carry

    # The last block's P V, then normalise (FP8: acc is O over the last V block's scale, s_v).
    if not FP8:
        acc = online_softmax_rescale(acc, alpha)
    v_tile = _ready_tile(v_ring, v_ready, n_block_max - 1, NUM_STAGES)
    _take_turn(turn, n_block_max, PINGPONG)
    pv_token = fp8.values_product(P, v_tile, p_layout) if FP8 else _values_product(P, v_tile, acc, p_layout)
    _pass_turn(turn, PINGPONG)
    if FP8:
        pv = warpgroup_mma_wait(0, deps=[pv_token])
        _, v_scales = fp8_scales
        acc = fp8.accumulate(acc, alpha, pv) * fp8.block_scale(v_scales, n_block_max - 1, BLOCK_N, KV_QUANT_BLOCK)
    else:
        acc = warpgroup_mma_wait(0, deps=[pv_token])

    # The LSE is (B, H, Sq) contiguous, indexed by the query head (batch_head), not the KV head.
    out, lse = online_softmax_finalize(acc, row_max, row_sum, P_EXPONENT=constants.P_EXPONENT)
    gl.store(LSE + batch_head.to(gl.int64) * seqlen_q + offs_m, lse, mask=offs_m < seqlen_q)

    # O through shared memory (o_smem: this warpgroup's Q buffer, free now, for fp16/bf16) and one
    # TMA store; rows past Sq are clipped by the descriptor's per-(batch, head) bounds.
    _partition_barrier()
    o_smem.store(out.to(desc_o.dtype))
    fence_async_shared()
    _partition_barrier()
    _tma_store(desc_o, [batch, head, start_m, 0], _as_box(o_smem))
    tma.store_wait(0)


@gluon.jit
def _consumer(index: gl.constexpr, consumer_args, constants: gl.constexpr):
    """Consumer ``index``: its slice of the CTA's query rows, Q and O buffers, Q barrier and turn.
    ``consumer_args`` (tensors, buffers, barriers) and ``constants`` (layouts and flags) are what every
    consumer shares, built once by ``attention_kernel``."""
    descs, io_smem, q_ready, turn, rings, ring_barriers, tile, shapes = consumer_args
    NUM_CONSUMERS: gl.constexpr = constants.NUM_CONSUMERS
    q_smem, o_smem = io_smem
    k_ring, v_ring = rings
    k_ready, v_ready, k_empty, v_empty = ring_barriers
    batch, head, start_m, n_block_max, batch_head, kv_batch_head = tile
    LSE, seqlen_q, seqlen, softmax_scale_log2, scales = shapes
    WG_M: gl.constexpr = q_smem.shape[1]
    _softmax_partition(
        descs,
        (q_smem.index(index), k_ring, v_ring),
        o_smem.index(index),
        (q_ready.index(index), k_ready, v_ready, k_empty, v_empty),
        (turn.index(index), turn.index((index + 1) % NUM_CONSUMERS)),
        (batch, head, start_m + index * WG_M, n_block_max, batch_head, kv_batch_head),
        LSE,
        seqlen_q,
        seqlen,
        softmax_scale_log2,
        scales,
        constants,
        HANDS_FIRST_TURN=index == NUM_CONSUMERS - 1,
    )


# ----------------------------------------------------------------------------------------------
# Kernel: allocate shared memory and barriers, fork the partitions
# ----------------------------------------------------------------------------------------------
# Triton compiles a separate kernel for an integer argument equal to 1, with the value folded in. For
# seqlen_k = 1 that folding leaves FP8's P words with repeated inputs, and Triton 3.6's ptxas (CUDA
# 12.8) then assembles one word's upper half from a register it never writes (F2FP ... MERGE_C):
# garbage e4m3 P, non-finite rows on the H200. One kernel for every key length avoids it.
@gluon.jit(do_not_specialize=["seqlen_k"])
def attention_kernel(
    desc_q,
    desc_k,
    desc_v,
    desc_o,
    LSE,
    CacheSeqlens,
    heads,
    kv_heads,
    seqlen_q,
    seqlen_k,
    softmax_scale_log2,
    Q_SCALE,
    K_SCALE,
    V_SCALE,
    q_blocks,
    kv_blocks,
    NUM_STAGES: gl.constexpr,
    CAUSAL: gl.constexpr,
    GQA: gl.constexpr,
    BOTTOM_RIGHT: gl.constexpr,
    HAS_CACHE_SEQLENS: gl.constexpr,
    PINGPONG: gl.constexpr,
    NUM_CONSUMERS: gl.constexpr,
    CONSUMER_REGS: gl.constexpr,
    FP8: gl.constexpr,
    Q_QUANT_BLOCK: gl.constexpr,
    KV_QUANT_BLOCK: gl.constexpr,
    ROW_TREE: gl.constexpr,
    num_warps: gl.constexpr,
    PACKED_GROUP: gl.constexpr = 1,
):
    """fp16/bf16, or (FP8) e4m3 Q, K and Vᵀ with fp32 scales per (batch, head, quantisation block)
    (Q_SCALE etc., None for fp16/bf16; K's and V's per KV head) and O in bf16. K and V have
    ``kv_heads`` heads (``GQA`` when fewer than ``heads``); ``CacheSeqlens`` is the (B,) int32 key
    lengths (``HAS_CACHE_SEQLENS``, else None); ``LSE`` the (B, H, Sq) fp32 output.
    ``PACKED_GROUP`` > 1 (gluon/decode's packed rows, fp16/bf16 only): Q, O and LSE are (B, Hkv, group · Sq, ...)
    with ``heads`` = ``kv_heads`` and ``seqlen_q`` = group · Sq rows, row (head in group) · Sq + token; the tokens
    are ``seqlen_q // PACKED_GROUP``, each row's causal diagonal is its token's and the bottom-right offset is
    Sk - Sq, as in the unpacked problem."""
    # Each consumer warpgroup (num_warps = 4) owns WG_M = 64 query rows: one m64 wgmma per GEMM.
    WG_M: gl.constexpr = desc_q.block_type.shape[2]
    BLOCK_M: gl.constexpr = NUM_CONSUMERS * WG_M
    BLOCK_N: gl.constexpr = desc_k.block_type.shape[2]
    HEAD_DIM: gl.constexpr = desc_q.block_type.shape[3]
    dtype: gl.constexpr = desc_q.dtype
    # wgmma's k per instruction: 32 bytes of operand (16 fp16/bf16, 32 e4m3).
    INSTR_K: gl.constexpr = 32 if FP8 else 16
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, INSTR_K]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, HEAD_DIM, INSTR_K]
    )
    tile_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)

    # Causal tiles near the bottom do the most work: launching them first shortens the tail.
    m_block = gl.num_programs(0) - 1 - gl.program_id(0) if CAUSAL else gl.program_id(0)
    batch_head = gl.program_id(1)
    batch = batch_head // heads
    head = batch_head % heads
    kv_head = kv_head_index(head, heads, kv_heads) if GQA else head
    kv_batch_head = batch * kv_heads + kv_head if GQA else batch_head
    # Packed rows: the sequence's tokens (not its rows) set the bottom-right offset, and a tile may hold every token.
    tokens = seqlen_q // PACKED_GROUP if PACKED_GROUP > 1 else seqlen_q
    seqlen_k, causal_offset = seqlen_info(
        CacheSeqlens, batch, tokens, seqlen_k, HAS_CACHE_SEQLENS=HAS_CACHE_SEQLENS, BOTTOM_RIGHT=BOTTOM_RIGHT
    )
    start_m = m_block * BLOCK_M
    if PACKED_GROUP > 1:
        _, n_block_max, _ = packed_block_range(
            tokens, seqlen_k, causal_offset, CAUSAL=CAUSAL, BOTTOM_RIGHT=BOTTOM_RIGHT, BLOCK_N=BLOCK_N
        )
    else:
        _, n_block_max, _ = block_range(
            start_m, seqlen_k, causal_offset, CAUSAL=CAUSAL, BOTTOM_RIGHT=BOTTOM_RIGHT, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N
        )
    if BOTTOM_RIGHT or HAS_CACHE_SEQLENS:
        # Rows that see no key still take block 0 (loaded, then masked in full): the consumers'
        # pipeline starts with it, and the mask makes their O 0 and their lse -inf.
        n_block_max = gl.maximum(n_block_max, 1)

    q_smem = gl.allocate_shared_memory(dtype, [NUM_CONSUMERS, WG_M, HEAD_DIM], tile_layout)
    k_ring = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], tile_layout)
    if FP8:
        # fp8 wgmma reads B K-major only: the host stores Vᵀ, and a V tile is D × BLOCK_N (keys contiguous).
        vt_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([HEAD_DIM, BLOCK_N], dtype)
        v_ring = gl.allocate_shared_memory(dtype, [NUM_STAGES, HEAD_DIM, BLOCK_N], vt_layout)
        o_tile_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([WG_M, HEAD_DIM], desc_o.dtype)
        o_smem = gl.allocate_shared_memory(desc_o.dtype, [NUM_CONSUMERS, WG_M, HEAD_DIM], o_tile_layout)
    else:
        v_ring = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], tile_layout)
        o_smem = q_smem
    q_ready = gl.allocate_shared_memory(gl.int64, [NUM_CONSUMERS, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    # turn.index(i): consumer i may issue its wgmmas (ping-pong), arrived by the other consumer.
    turn = gl.allocate_shared_memory(gl.int64, [NUM_CONSUMERS, 1], mbarrier.MBarrierLayout())
    for consumer in gl.static_range(NUM_CONSUMERS):
        mbarrier.init(q_ready.index(consumer), count=1)
        mbarrier.init(turn.index(consumer), count=1)
    for stage in gl.static_range(NUM_STAGES):
        mbarrier.init(k_ready.index(stage), count=1)
        mbarrier.init(v_ready.index(stage), count=1)
        # A slot is empty once every consumer warpgroup has arrived.
        mbarrier.init(k_empty.index(stage), count=NUM_CONSUMERS)
        mbarrier.init(v_empty.index(stage), count=NUM_CONSUMERS)
    # mbarrier.init is a generic-proxy write and the TMA unit completes these barriers through the
    # async proxy: the PTX memory model orders the two only through a proxy fence (Triton's own TMA
    # pipeline emits the same fence.proxy.async after its inits); warp_specialize's entry barrier
    # then orders it before every partition's first use.
    fence_async_shared()

    descs = (desc_q, desc_k, desc_v, desc_o)
    rings = (k_ring, v_ring)
    ring_barriers = (k_ready, v_ready, k_empty, v_empty)
    tile = (batch, head, start_m, n_block_max, batch_head, kv_batch_head)
    seqlen = (seqlen_k, causal_offset)
    shapes = (LSE, seqlen_q, seqlen, softmax_scale_log2, (Q_SCALE, K_SCALE, V_SCALE, q_blocks, kv_blocks))
    loader = (
        descs,
        (q_smem, k_ring, v_ring),
        (q_ready, k_ready, v_ready, k_empty, v_empty),
        (batch, head, kv_head, start_m, n_block_max),
    )
    # What every consumer shares, written once: the tensors, buffers and barriers in a tuple, the
    # layouts and flags in a constexpr NamedTuple.
    consumer_args = (descs, (q_smem, o_smem), q_ready, turn, rings, ring_barriers, tile, shapes)
    constants: gl.constexpr = ConsumerConstants(
        s_layout=s_layout,
        o_layout=o_layout,
        # P as wgmma's A operand from registers: 32 bits of k per thread and register (2 × 16-bit, 4 × e4m3).
        p_layout=gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4 if FP8 else 2),
        NUM_STAGES=NUM_STAGES,
        CAUSAL=CAUSAL,
        BOTTOM_RIGHT=BOTTOM_RIGHT,
        PINGPONG=PINGPONG,
        NUM_CONSUMERS=NUM_CONSUMERS,
        FP8=FP8,
        # FP8 lifts P by 2^P_EXPONENT before its e4m3 conversion; the lift cancels in O and leaves the LSE.
        P_EXPONENT=fp8.P_EXPONENT if FP8 else 0.0,
        Q_QUANT_BLOCK=Q_QUANT_BLOCK,
        KV_QUANT_BLOCK=KV_QUANT_BLOCK,
        ROW_TREE=ROW_TREE,
        PACKED_GROUP=PACKED_GROUP,
    )
    # The first partition runs in the kernel's own warps; the others are workers with their warp
    # counts and register budgets.
    if NUM_CONSUMERS == 2:
        gl.warp_specialize(
            [
                (_consumer, (0, consumer_args, constants)),
                (_consumer, (1, consumer_args, constants)),
                (_load_partition, (loader, NUM_STAGES, NUM_CONSUMERS, FP8)),
            ],
            [CONSUMER_WARPS, LOAD_WARPS],
            [CONSUMER_REGS, LOAD_REGISTERS],
        )
    else:
        gl.warp_specialize(
            [
                (_consumer, (0, consumer_args, constants)),
                (_consumer, (1, consumer_args, constants)),
                (_consumer, (2, consumer_args, constants)),
                (_load_partition, (loader, NUM_STAGES, NUM_CONSUMERS, FP8)),
            ],
            [CONSUMER_WARPS, CONSUMER_WARPS, LOAD_WARPS],
            [CONSUMER_REGS, CONSUMER_REGS, LOAD_REGISTERS],
        )


# ----------------------------------------------------------------------------------------------
# Host: configuration, prepared launch, bind, prepare
# ----------------------------------------------------------------------------------------------
# D=128 without ping-pong: with it P1 ran 0.961x as fast causal and 0.983x non-causal (H200, 2026-12-04,
# results/h200/gluon-hopper-pingpong/), where gluon/fp8's causal kernel gains 1.06x from it.
DEFAULT_CONFIGS = release_configs(RUNG, {64: GluonConfig(128, 2, consumers=3, pingpong=True), 128: GluonConfig(128, 2)})
# The kernel's FP8 scale arguments (Q_SCALE, K_SCALE, V_SCALE, q_blocks, kv_blocks), absent here.
FP16_SCALES = (None,) * 5
SCALE_ARGS = ("Q_SCALE", "K_SCALE", "V_SCALE", "q_blocks", "kv_blocks")


class GluonAttention:
    """Prepared launch: descriptors, O and lse built once; calling it launches and returns O, or
    (O, lse) when the problem returns the LSE (the kernel writes lse either way).

    k and v are (B, Hkv, Sk, D): their descriptors cover the KV heads only, and the kernel's TMA
    coordinates name the KV head. ``cache_seqlens`` is read by the kernel at every launch.
    ``packed_group`` > 1 (gluon/decode's packed rows): q is ``problem``'s rows packed as (B, Hkv, group · Sq, D), so
    O and the LSE are (B, Hkv, group · Sq, ...) too, and the kernel takes them for Hkv heads of their own (no GQA)
    whose tokens are the rows // group (``PACKED_GROUP``); the features (causal alignment, cache lengths) are
    ``problem``'s."""

    def __init__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, config: GluonConfig,
        cache_seqlens: torch.Tensor | None = None, packed_group: int = 1,
    ):  # fmt: skip
        batch, heads, seqlen_q, _ = q.shape
        dtype = GLUON_DTYPES[q.dtype]
        self.return_lse = problem.return_lse
        self.out = torch.empty_like(q)
        self.lse = torch.empty((batch, heads, seqlen_q), device=q.device, dtype=torch.float32)
        self._args = (
            descriptor(q, CONSUMER_ROWS, dtype),
            descriptor(k, config.block_n, dtype),
            descriptor(v, config.block_n, dtype),
            descriptor(self.out, CONSUMER_ROWS, dtype),
            self.lse,
            cache_seqlens,
            heads,
            problem.kv_heads,
            seqlen_q,
            problem.seqlen_k,
            problem.scale * LOG2_E,
            *FP16_SCALES,
        )
        self._options = launch_options(config, problem)
        if packed_group > 1:
            self._options.update(GQA=False, PACKED_GROUP=packed_group)
        self._grid = (triton.cdiv(seqlen_q, config.block_m), batch * heads)

    def __call__(self) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        attention_kernel[self._grid](*self._args, **self._options)
        return (self.out, self.lse) if self.return_lse else self.out


def bind(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, *, cache_seqlens: torch.Tensor | None = None
) -> GluonAttention:
    """Descriptors, O and lse for validated q, k, v at the default configuration; no launch."""
    q, k, v = (kernel_operand(t) for t in (q, k, v))
    return GluonAttention(q, k, v, problem, DEFAULT_CONFIGS[problem.head_dim], cache_seqlens)


def prepare(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, *, cache_seqlens: torch.Tensor | None = None
) -> Runner:
    """Validate, bind at the default configuration, and compile by one warm-up launch."""
    checked = validate_gluon_inputs(q, k, v, problem, DTYPES, RUNG, cache_seqlens)
    return warmed_up(bind(q, k, v, checked, cache_seqlens=cache_seqlens), q.device)


# ----------------------------------------------------------------------------------------------
# Capability check and static compile
# ----------------------------------------------------------------------------------------------
def supports(problem: Problem, device: torch.device) -> tuple[bool, str]:
    if problem.dtype not in DTYPES:
        return False, f"{RUNG} runs fp16 and bf16, got {problem.dtype_name}"
    return gluon_supported(problem, device, RUNG)


def compile_kernel_sm90(signature: dict[str, str], constexprs: dict[str, object], config: GluonConfig) -> KernelBinary:
    """``attention_kernel`` for sm_90a without a GPU (gluon/hopper's and gluon/fp8's signatures)."""
    options = {"num_warps": config.num_warps, "maxnreg": config.maxnreg}
    constexprs = {"PACKED_GROUP": 1, **constexprs}  # the unpacked kernel unless told (gluon/decode's packed rows)
    return compile_gluon_sm90(attention_kernel, signature, constexprs, options, aligned=("LSE",))


def kernel_signature(problem: Problem, operand_types: dict[str, str], scale_types: dict[str, str]) -> dict[str, str]:
    """The kernel's signature for a static compile: the descriptors' types (``operand_types``, by
    name), the problem features' and the FP8 scale arguments' (``scale_types``; constexpr when absent)."""
    feature_types, _ = feature_arguments(problem)
    return {
        **operand_types,
        "LSE": "*fp32",
        "heads": "i32",
        **feature_types,
        "seqlen_q": "i32",
        "seqlen_k": "i32",
        "softmax_scale_log2": "fp32",
        **scale_types,
    }


def compile_sm90(problem: Problem, config: GluonConfig | None = None, packed_group: int = 1) -> list[KernelBinary]:
    """The kernel for sm_90a at the default configuration of this head dim (no GPU needed); ``packed_group`` > 1:
    gluon/decode's packed rows of ``problem`` (as ``GluonAttention`` launches them: no GQA, ``PACKED_GROUP``)."""
    config = config or DEFAULT_CONFIGS[problem.head_dim]
    q_type = descriptor_type(problem.dtype, CONSUMER_ROWS, problem.head_dim)
    kv_type = descriptor_type(problem.dtype, config.block_n, problem.head_dim)
    operand_types = {"desc_q": q_type, "desc_k": kv_type, "desc_v": kv_type, "desc_o": q_type}
    signature = kernel_signature(problem, operand_types, dict.fromkeys(SCALE_ARGS, "constexpr"))
    constexprs = {
        **dict.fromkeys(SCALE_ARGS),
        **feature_arguments(problem)[1],
        **launch_constexprs(config, problem),
        "num_warps": config.num_warps,
        "PACKED_GROUP": packed_group,
    }
    if packed_group > 1:
        constexprs["GQA"] = False
    return [compile_kernel_sm90(signature, constexprs, config)]


IMPLEMENTATION = gluon_implementation(
    "hopper", supports, compile_sm90, prepare=prepare, bind=bind, required_ptx=("setmaxnreg",),
    source_file=__file__, default_configs=DEFAULT_CONFIGS, backward=gluon_backward.BACKWARD,
)  # fmt: skip
