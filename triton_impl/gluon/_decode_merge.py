"""gluon/decode's fused merge, in Gluon: triton/decode's arrival protocol (``last_to_arrive``) and its
``merge_splits``, the same operations element by element in split order, so the same bits as its merge
kernel. ``triton_impl/gluon/decode.py`` calls them from its split kernel (``_merge_tile``), in the tile's
last CTA to arrive.
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
