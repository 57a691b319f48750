"""triton/decode's merge of a tile's splits (``triton_impl/decode.py``; gluon/decode's in Gluon is
``gluon/_decode_merge.py``): the arrival protocol (``last_to_arrive``) that elects the tile's last CTA to
finish, and ``merge_splits``, which that CTA (fused merge) or the merge kernel (``_merge_kernel``, the
two-launch path) runs over the splits' partials in split order, element by element, so the same bits
whichever runs it; the stores of O, the LSE and the partials, and the packed rows they are for
(``packed_rows``); a D=256 tile's merge in row chunks (``merge_in_chunks``); and the balanced split's store and
merge (``store_balanced_partials``), in one level or, past ``decode.BALANCED_MERGE_GROUP`` shares an item, in runs
of that many and then the runs (gluon/decode's ``_decode_balanced._merge_in_groups``, the same counters and slabs).
Kept beside the rung so that the rung file stays readable.
"""

from __future__ import annotations

import triton
import triton.language as tl

from triton_impl._device import LOG2_E

# In the merge, natural-log LSEs are weighed by exp2((lseₛ - lse_max) · LOG2_E).
MERGE_LOG2_E = tl.constexpr(LOG2_E)
# The merge takes a tile of head dim MERGE_CHUNK_HEAD_DIM and more than MERGE_CHUNK_ROWS rows that many rows at a time,
# so that its O tiles fit the registers the key loop left (gluon/decode's MERGE_ROWS): WIDE_D256's 128-row tile spills
# 592 bytes merged at once (sm_90a); the default tiles merge in one go.
MERGE_CHUNK_HEAD_DIM, MERGE_CHUNK_ROWS = tl.constexpr(256), tl.constexpr(32)


@triton.jit
def last_to_arrive(Counter, num_splits):
    """True in the CTA that is the last of its tile's ``num_splits`` splits to have stored its partials,
    which then reads everyone's; that CTA also puts the counter back to 0, so the next launch (or a
    CUDA-graph replay) finds it zeroed with no host memset. Every split arrives, an empty one too (it
    stores O = 0 and LSE = -inf: no CTA returns early), so the count always reaches ``num_splits``.

    Why the partials are visible to it (PTX memory model): every thread stores its rows, then
    ``debug_barrier`` (bar.sync) orders those stores before whatever the CTA does next; the arrival is
    one gpu-scope acq_rel ``atom.add`` (Triton issues a scalar atomic from one thread and passes the old
    value to the others through shared memory, behind a barrier). Its release half is cumulative, so the
    whole CTA's stores that bar.sync ordered before it are published with it; the last CTA's acquire
    half reads the count every other arrival wrote, so it synchronises with each of their releases; the
    barrier behind the broadcast orders every thread's later loads after that acquire. Hence the
    partials the last CTA loads are the ones each split stored, which CUTLASS's split-K semaphore
    (bar.sync, then a release by one thread; an acquire, then bar.sync) relies on too. No other CTA
    touches the counter after the last arrival, and the kernel's end orders the reset before the next
    launch."""
    tl.debug_barrier()
    arrived = tl.atomic_add(Counter, 1, sem="acq_rel", scope="gpu")
    last = arrived == num_splits - 1
    if last:
        tl.store(Counter, 0)
    return last


@triton.jit
def merge_splits(
    OutPartial, LsePartial, row, row_ok, rows, num_splits,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, SPLITS_PER_STEP: tl.constexpr,
):  # fmt: skip
    """``(O, lse)`` of the packed rows ``row`` (their index in one split's (B, H, Sq) slab of ``rows``)
    merged from the splits' partials: lse = lse_max + log Σₛ exp(lseₛ - lse_max) and O = Σₛ exp(lseₛ -
    lse_max) · Oₛ / Σₛ exp(lseₛ - lse_max). The sums run split after split, element by element (no
    reduction across threads), so the bits depend only on the split order: the same whichever CTA
    merges, in kernel 1 or kernel 2, with any warp count. Each step unrolls ``SPLITS_PER_STEP`` splits,
    whose loads are independent and fly together (a step is one round trip to L2, not one a split).
    The loads are ``.cg``, from L2: the acquire of ``last_to_arrive`` already orders them after the
    other splits' stores, and L2 is where those stores are, never in an L1 line that another CTA of
    this SM may have filled earlier in the launch. Splits with no key (-inf) weigh 0; a row with no
    key at all gets O = 0 and lse = -inf."""
    offs_d = tl.arange(0, HEAD_DIM)
    lse_max = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    for first_split in range(0, num_splits, SPLITS_PER_STEP):
        for step in tl.static_range(SPLITS_PER_STEP):
            split = first_split + step
            lse_s = tl.load(
                LsePartial + split * rows + row,
                # tl.where, not row_ok & (a scalar): Triton 3.9's interpreter refuses the mixed mask.
                mask=tl.where(split < num_splits, row_ok, False),
                other=float("-inf"),
                cache_modifier=".cg",
            )
            lse_max = tl.maximum(lse_max, lse_s)
    lse_base = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    weight_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    for first_split in range(0, num_splits, SPLITS_PER_STEP):
        for step in tl.static_range(SPLITS_PER_STEP):
            split = first_split + step
            in_range = tl.where(split < num_splits, row_ok, False)
            partial_row = split * rows + row
            lse_s = tl.load(LsePartial + partial_row, mask=in_range, other=float("-inf"), cache_modifier=".cg")
            o_ptrs = OutPartial + partial_row[:, None] * HEAD_DIM + offs_d[None, :]
            o_s = tl.load(o_ptrs, mask=in_range[:, None], other=0.0, cache_modifier=".cg")
            weight = tl.math.exp2((lse_s - lse_base) * MERGE_LOG2_E)
            weight_sum += weight
            acc += weight[:, None] * o_s
    has_keys = weight_sum > 0.0
    out = acc * tl.where(has_keys, 1.0 / weight_sum, 0.0)[:, None]
    lse = tl.where(has_keys, lse_base + tl.log(weight_sum), float("-inf"))
    return out, lse


# ----------------------------------------------------------------------------------------------
# Packed rows of an M tile, the stores, and the merge of a D=256 tile in chunks
# ----------------------------------------------------------------------------------------------
@triton.jit
def packed_rows(m_block, kv_head, group, seqlen_q, BLOCK_M: tl.constexpr):
    """``(head, offs_m, row_ok)`` of M tile ``m_block`` of a KV head's packed rows: row r is token
    r % Sq of query head kv_head · group + r // Sq; rows past group · Sq are padding."""
    offs_r = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    return kv_head * group + offs_r // seqlen_q, offs_r % seqlen_q, offs_r < group * seqlen_q


@triton.jit
def store_output(out_rows, Lse, out, lse, row, row_ok, HEAD_DIM: tl.constexpr, RETURN_LSE: tl.constexpr):
    """O in the output dtype at ``out_rows`` = (Out, each row's offset), and the LSE when asked."""
    Out, row_offsets = out_rows
    offs_d = tl.arange(0, HEAD_DIM)
    tl.store(Out + row_offsets[:, None] + offs_d[None, :], out.to(Out.dtype.element_ty), mask=row_ok[:, None])
    if RETURN_LSE:
        tl.store(Lse + row, lse, mask=row_ok)


@triton.jit
def store_partials(OutPartial, LsePartial, partial_row, out, lse, row_ok, HEAD_DIM: tl.constexpr):
    """One split's fp32 O and LSE at rows ``partial_row`` of the partials, for the merge."""
    offs_d = tl.arange(0, HEAD_DIM)
    tl.store(OutPartial + partial_row[:, None] * HEAD_DIM + offs_d[None, :], out, mask=row_ok[:, None])
    tl.store(LsePartial + partial_row, lse, mask=row_ok)


@triton.jit
def merge_in_chunks(
    partials, partial_offset, outputs, batch, kv_head, m_block, group, heads, seqlen_q, rows, num_splits,
    RETURN_LSE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, SPLITS_PER_STEP: tl.constexpr,
    INTO_PARTIALS: tl.constexpr = False,
):  # fmt: skip
    """The merge of M tile ``m_block`` MERGE_CHUNK_ROWS rows at a time (a D=256 tile of more rows, whose O tiles in
    one go would spill): each chunk's packed rows r, their partials at ``partial_offset`` + r of ``partials``
    (OutPartial, LsePartial), merged and stored to ``outputs`` (Out, Lse, O's batch, head and row strides), or with
    ``INTO_PARTIALS`` back into the first split's rows of ``partials`` (a run of the two-level merge). The same
    operations per element as one :func:`merge_splits`: the same bits."""
    OutPartial, LsePartial = partials
    Out, Lse, stride_ob, stride_oh, stride_om = outputs
    for chunk in tl.static_range(BLOCK_M // MERGE_CHUNK_ROWS):
        chunk_block = m_block * (BLOCK_M // MERGE_CHUNK_ROWS) + chunk
        head, offs_m, row_ok = packed_rows(chunk_block, kv_head, group, seqlen_q, MERGE_CHUNK_ROWS)
        packed_row = chunk_block * MERGE_CHUNK_ROWS + tl.arange(0, MERGE_CHUNK_ROWS)
        out, lse = merge_splits(
            OutPartial, LsePartial, partial_offset + packed_row, row_ok, rows, num_splits,
            HEAD_DIM=HEAD_DIM, BLOCK_M=MERGE_CHUNK_ROWS, SPLITS_PER_STEP=SPLITS_PER_STEP,
        )  # fmt: skip
        if INTO_PARTIALS:
            store_partials(OutPartial, LsePartial, partial_offset + packed_row, out, lse, row_ok, HEAD_DIM=HEAD_DIM)
        else:
            out_rows = (Out, batch * stride_ob + head * stride_oh + offs_m * stride_om)
            row = (batch * heads + head) * seqlen_q + offs_m
            store_output(out_rows, Lse, out, lse, row, row_ok, HEAD_DIM=HEAD_DIM, RETURN_LSE=RETURN_LSE)


# ----------------------------------------------------------------------------------------------
# The balanced split's store and merge, in one level or in runs (``decode.BALANCED_MERGE_GROUP``)
# ----------------------------------------------------------------------------------------------
@triton.jit
def merge_slabs(
    partials, stride, count, outputs, tile, row_ok,
    RETURN_LSE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, SPLITS_PER_STEP: tl.constexpr,
    INTO_PARTIALS: tl.constexpr,
):  # fmt: skip
    """Merge M tile ``tile``'s rows of ``count`` slabs ``stride`` rows apart, from ``partials`` (OutPartial and
    LsePartial at the first slab), into O and the LSE (``outputs``: Out, Lse, O's batch, head and row strides) or,
    with ``INTO_PARTIALS``, into the first slab itself; in chunks where :func:`merge_in_chunks` says."""
    OutFirst, LseFirst = partials
    Out, Lse, stride_ob, stride_oh, stride_om = outputs
    batch, kv_head, m_block, group, heads, seqlen_q = tile
    if HEAD_DIM >= MERGE_CHUNK_HEAD_DIM and BLOCK_M > MERGE_CHUNK_ROWS:
        merge_in_chunks(
            partials, 0, outputs, batch, kv_head, m_block, group, heads, seqlen_q, stride, count,
            RETURN_LSE, HEAD_DIM, BLOCK_M, SPLITS_PER_STEP, INTO_PARTIALS,
        )  # fmt: skip
    else:
        item_row = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
        out, lse = merge_splits(
            OutFirst, LseFirst, item_row, row_ok, stride, count,
            HEAD_DIM=HEAD_DIM, BLOCK_M=BLOCK_M, SPLITS_PER_STEP=SPLITS_PER_STEP,
        )  # fmt: skip
        if INTO_PARTIALS:
            store_partials(OutFirst, LseFirst, item_row, out, lse, row_ok, HEAD_DIM=HEAD_DIM)
        else:
            head, offs_m, _ = packed_rows(m_block, kv_head, group, seqlen_q, BLOCK_M)
            out_rows = (Out, batch * stride_ob + head * stride_oh + offs_m * stride_om)
            row = (batch * heads + head) * seqlen_q + offs_m
            store_output(out_rows, Lse, out, lse, row, row_ok, HEAD_DIM=HEAD_DIM, RETURN_LSE=RETURN_LSE)


@triton.jit
def store_balanced_partials(
    workspace, outputs, tile, work, out, lse, row_ok,
    RETURN_LSE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, SPLITS_PER_STEP: tl.constexpr,
    M_TILE_MAJOR: tl.constexpr, MERGE_GROUP: tl.constexpr,
):  # fmt: skip
    """Step 5 of the balanced split for a share of an item of several (``work``: share, split, item shares): its
    partials into slab ``share`` of group · Sq rows, then the merge of the item's slabs (from share - split on).
    One level (``MERGE_GROUP`` 0, or an item of at most that many shares): the item's last share to arrive merges
    them all. In runs: each run of ``MERGE_GROUP`` consecutive shares has its own arrival counter, at its first slab
    past the grid's slabs · M tiles; the run's last share to arrive merges the run into the run's first slab, and the
    item's last run to arrive merges the runs' first slabs, ``MERGE_GROUP`` slabs apart. A CTA's merge chain is then
    cdiv(G, step) + cdiv(runs, step) load steps of each pass, not cdiv(shares, step); the run boundaries are fixed
    by the plan, so the bits do not depend on which CTA arrives last."""
    OutPartial, LsePartial, Counters = workspace
    batch, kv_head, m_block, group, heads, seqlen_q = tile
    share, split, item_shares = work
    rows = tl.cast(group * seqlen_q, tl.int64)
    item_row = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    store_partials(OutPartial, LsePartial, share * rows + item_row, out, lse, row_ok, HEAD_DIM=HEAD_DIM)
    first = share - split
    item = (OutPartial + first * rows * HEAD_DIM, LsePartial + first * rows)
    # The item's arrival counter: (batch, KV head, M tile); the M tiles on the grid's y (x under M_TILE_MAJOR).
    m_tiles = tl.num_programs(0 if M_TILE_MAJOR else 1)
    item_counter = Counters + (batch * (heads // group) + kv_head) * m_tiles + m_block
    # A run's merge unrolls half the splits a step of the item's: the item's merge's values are live across it, and
    # at the full step the kernel took 24 more registers at 64 rows, D=64 (Triton 3.6: 158 -> 182, two CTAs an SM
    # instead of three; seed 73's row 2 1.27x slower on the H200). A run is at most MERGE_GROUP slabs.
    RUN_MERGE_STEP: tl.constexpr = SPLITS_PER_STEP // 2 if SPLITS_PER_STEP > 1 else 1
    if MERGE_GROUP == 0:
        merges_item, stride, count = last_to_arrive(item_counter, item_shares), rows, item_shares
    else:
        one_level = item_shares <= MERGE_GROUP
        runs = (item_shares + MERGE_GROUP - 1) // MERGE_GROUP
        stride, count = tl.where(one_level, rows, rows * MERGE_GROUP), tl.where(one_level, item_shares, runs)
        if one_level:
            merges_item = last_to_arrive(item_counter, item_shares)
        else:
            run_first = first + split // MERGE_GROUP * MERGE_GROUP
            run_shares = tl.minimum(item_shares - (run_first - first), MERGE_GROUP)
            slabs = tl.num_programs(1 if M_TILE_MAJOR else 0)
            merges_item = last_to_arrive(Counters + (slabs + run_first) * m_tiles + m_block, run_shares)
            if merges_item:
                run = (OutPartial + run_first * rows * HEAD_DIM, LsePartial + run_first * rows)
                merge_slabs(
                    run, rows, run_shares, outputs, tile, row_ok, RETURN_LSE, HEAD_DIM, BLOCK_M, RUN_MERGE_STEP,
                    True,
                )  # fmt: skip
                merges_item = last_to_arrive(item_counter, runs)
    # The item's slabs (one level), or its runs' first slabs, G apart, into O.
    if merges_item:
        merge_slabs(
            item, stride, count, outputs, tile, row_ok, RETURN_LSE, HEAD_DIM, BLOCK_M, SPLITS_PER_STEP, False
        )  # fmt: skip
