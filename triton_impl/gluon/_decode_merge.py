"""gluon/decode's fused merge, in Gluon: triton/decode's arrival protocol (``last_to_arrive``) and its
``merge_splits``, the same operations element by element in split order, so the same bits as its merge
kernel. ``triton_impl/gluon/decode.py`` calls them from its split kernel (``_merge_tile``), in the tile's
last CTA to arrive; also the packed rows of an M tile (``_packed_rows``, GQA packing) and the O and LSE
stores (``_store_output``) that the split kernel shares with the merge.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from triton_impl._host import LOG2_E
from triton_impl.gluon._device import _partition_barrier

# Rows the fused merge takes at a time (so that its O tiles stay a few registers a thread).
MERGE_ROWS = gl.constexpr(16)
# The merge weighs natural-log LSEs by exp2((lseₛ - lse_max) · LOG2_E), as triton/decode's.
MERGE_LOG2_E = gl.constexpr(LOG2_E)


@gluon.jit
def _last_to_arrive(Counter, num_splits):
    """True in the CTA that is the last of its tile's ``num_splits`` splits to have stored its
    partials; that CTA puts the counter back to 0. triton/decode's ``last_to_arrive``, where the
    memory-ordering argument is: a barrier over the warpgroup orders every thread's partial stores
    before the one gpu-scope acq_rel atomic (a scalar atomic: one thread, its old value passed to the
    others through shared memory behind a barrier), whose acquire in the last CTA orders its loads."""
    _partition_barrier()
    arrived = gl.atomic_add(Counter, 1, sem="acq_rel", scope="gpu")
    last = arrived == num_splits - 1
    if last:
        gl.store(Counter, 0)
    return last


@gluon.jit
def _merge_splits(partials, row, row_ok, offs_d, SPLITS_PER_STEP: gl.constexpr, layout: gl.constexpr):
    """triton/decode's ``merge_splits`` on rows in a distributed layout: the same operations, element
    by element, in the same split order, so the same bits as its merge kernel."""
    OutPartial, LsePartial, rows, num_splits = partials
    lse_max = gl.full_like(row_ok, float("-inf"), dtype=gl.float32)
    for first_split in range(0, num_splits, SPLITS_PER_STEP):
        for step in gl.static_range(SPLITS_PER_STEP):
            split = first_split + step
            lse_s = gl.load(
                LsePartial + split * rows + row,
                mask=row_ok & (split < num_splits),
                other=float("-inf"),
                cache_modifier=".cg",
            )
            lse_max = gl.maximum(lse_max, lse_s)
    lse_base = gl.where(lse_max == float("-inf"), 0.0, lse_max)
    weight_sum = gl.zeros_like(lse_max)
    HEAD_DIM: gl.constexpr = offs_d.shape[0]
    acc = gl.zeros([MERGE_ROWS, HEAD_DIM], gl.float32, layout)
    for first_split in range(0, num_splits, SPLITS_PER_STEP):
        for step in gl.static_range(SPLITS_PER_STEP):
            split = first_split + step
            in_range = row_ok & (split < num_splits)
            partial_row = split * rows + row
            lse_s = gl.load(LsePartial + partial_row, mask=in_range, other=float("-inf"), cache_modifier=".cg")
            o_ptrs = OutPartial + partial_row[:, None] * HEAD_DIM + offs_d[None, :]
            o_s = gl.load(o_ptrs, mask=in_range[:, None], other=0.0, cache_modifier=".cg")
            weight = gl.exp2((lse_s - lse_base) * MERGE_LOG2_E)
            weight_sum += weight
            acc += weight[:, None] * o_s
    has_keys = weight_sum > 0.0
    out = acc * gl.where(has_keys, 1.0 / weight_sum, 0.0)[:, None]
    lse = gl.where(has_keys, lse_base + gl.log(weight_sum), float("-inf"))
    return out, lse


@gluon.jit
def _packed_rows(m_block, kv_head, group, seqlen_q, BLOCK_M: gl.constexpr, layout: gl.constexpr):
    """GQA packing, in ``layout``: row r of M tile ``m_block`` is token r % Sq of query head
    kv_head · group + r // Sq. Returns ``(head, token, row_ok)``; rows past group · Sq pad the tile."""
    offs_r = m_block * BLOCK_M + gl.arange(0, BLOCK_M, layout=layout)
    return kv_head * group + offs_r // seqlen_q, offs_r % seqlen_q, offs_r < group * seqlen_q


@gluon.constexpr_function
def _q_load_layout(head_dim, num_warps):
    """Registers of the Q tile as it is loaded: 16-byte vectors along D, a warp over whole rows."""
    columns = min(32, head_dim // 8)
    return gl.BlockedLayout([1, 8], [32 // columns, columns], [num_warps, 1], [1, 0])


@gluon.jit
def _store_output(outputs, batch, head, token, row, row_ok, offs_d, out, lse, RETURN_LSE: gl.constexpr):
    """O of the packed rows (``head``, ``token``) in the output dtype, and their LSE at ``row`` of (B, H, Sq)."""
    Out, Lse, stride_ob, stride_oh, stride_om = outputs
    o_rows = batch.to(gl.int64) * stride_ob + head.to(gl.int64) * stride_oh + token * stride_om
    gl.store(Out + o_rows[:, None] + offs_d[None, :], out.to(Out.dtype.element_ty), mask=row_ok[:, None])
    if RETURN_LSE:
        gl.store(Lse + row, lse, mask=row_ok)


@gluon.jit
def _store_partials(OutPartial, LsePartial, partial_row, out, lse, row_ok, offs_d):
    """A split's fp32 partial O and LSE at rows ``partial_row`` of the workspace."""
    HEAD_DIM: gl.constexpr = offs_d.shape[0]
    gl.store(OutPartial + partial_row[:, None] * HEAD_DIM + offs_d[None, :], out, mask=row_ok[:, None])
    gl.store(LsePartial + partial_row, lse, mask=row_ok)


@gluon.jit
def _merge_tile(
    partials, outputs, tile, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr, SPLITS_PER_STEP: gl.constexpr,
    RETURN_LSE: gl.constexpr, num_warps: gl.constexpr, PACKED: gl.constexpr = False,
    INTO_PARTIALS: gl.constexpr = False,
):  # fmt: skip
    """Merge the tile's real rows (group · Sq of its ``BLOCK_M``, often 4 to 16) ``MERGE_ROWS`` at a
    time, in Q's load layout (whole rows per warp), and store O and the LSE. The partials' rows are
    (B, H, Sq) rows, or with ``PACKED`` (the balanced split's slabs) the item's packed rows. ``INTO_PARTIALS``
    (packed only): store the merged O and LSE as a partial in the first slab instead (the balanced split's merge in
    groups, ``_decode_balanced._merge_in_groups``)."""
    batch, kv_head, group, heads, seqlen_q, m_block = tile
    layout: gl.constexpr = _q_load_layout(HEAD_DIM, num_warps)
    row_layout: gl.constexpr = gl.SliceLayout(1, layout)
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))
    # The chunks of MERGE_ROWS rows that hold a real row (a runtime loop: one copy of the merge's code).
    first_chunk = m_block * (BLOCK_M // MERGE_ROWS)
    end_chunk = gl.minimum(first_chunk + BLOCK_M // MERGE_ROWS, (group * seqlen_q + MERGE_ROWS - 1) // MERGE_ROWS)
    for chunk in range(first_chunk, end_chunk):
        head, token, row_ok = _packed_rows(chunk, kv_head, group, seqlen_q, MERGE_ROWS, row_layout)
        row = (batch.to(gl.int64) * heads + head) * seqlen_q + token
        partial_row = (head - kv_head * group) * seqlen_q + token if PACKED else row
        out, lse = _merge_splits(partials, partial_row, row_ok, offs_d, SPLITS_PER_STEP, layout)
        if INTO_PARTIALS:
            first_out, first_lse, _, _ = partials
            _store_partials(first_out, first_lse, partial_row, out, lse, row_ok, offs_d)
        else:
            _store_output(outputs, batch, head, token, row, row_ok, offs_d, out, lse, RETURN_LSE)
