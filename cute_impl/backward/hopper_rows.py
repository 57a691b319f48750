"""LSE₂ and D through the ring for the CuTe ``hopper`` backward (``hopper.py``,
``BackwardTiles(tma_rows=True)``): the pieces the dK/dV kernel adds to load them by TMA.

What it changes: every dK/dV step needs, for each of its ``tile_m`` query rows, LSE₂ (for Pᵀ =
exp2(Sᵀ · scale_log2 − LSE₂)) and D (for dSᵀ = Pᵀ ∘ (dPᵀ − D)). Without this variant each consumer
thread reads its 2 · tile_m / 8 columns' values from HBM every step (``_device.read_row_values``: a
clamped index, a 64-bit address, a load and a select past Sq, about 150 SASS instructions per step at
tile_m = 64), and ptxas places some of the LSE₂ loads after the wait for Sᵀ and the D loads after the
dV product's issue, so their L2 latency sits in the step's critical path, while the other warpgroup's
tensor-core work is all that hides it. Here the producer warp adds two TMA boxes of ``tile_m`` fp32 to
each ring slot (LSE₂ and D of the query block, on the slot's barrier with its Q and dO), and the step
reads them from shared memory (16 ``LDS.64`` per thread at tile_m = 64, no bounds arithmetic): the
unmasked D=128 step goes from 585 to 436 SASS instructions (535 to 389 at D=64), as FlashAttention-4's
sm90 backward does (``flash_bwd_sm90.py`` loads LSE and dPsum with each Q and dO stage).

Rows past Sq: the box bounds zero-fill them, so LSE₂ and D are 0 there (not +inf and 0 as the HBM
reads give). Their P is then exp2(0) = 1 rather than 0, but their Q and dO rows are zero-filled too, so
dPᵀ and D are 0 in those columns: dV gains Pᵀ · 0, dK gains dSᵀ = 1 · (0 − 0) = 0, and their dQ rows are
never stored. A TMA source needs 16-byte outer strides: ``row_vectors`` allocates each head's row
padded to a multiple of four floats (the padding is never read: the box bounds stop at Sq).

Counterparts: ``hopper_dq.py`` (the other variant's pieces); FlashAttention-4's ``load_LSE`` and
``load_dPsum`` (one-dimensional bulk copies from LSE and dPsum padded by its preprocess).
"""

# No ``from __future__ import annotations``: ``cute.struct`` reads its field annotations as objects.
import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.nvgpu import cpasync

from common.contract.problem import Problem
from cute_impl.backward._device import read_row_values

# A TMA source's outer strides: multiples of 16 bytes; a TMA box in shared memory: 128-byte aligned.
TMA_STRIDE_BYTES = 16
TMA_SMEM_ALIGN_BYTES = 128
FLOAT_BYTES = 4
# A thread's staged values loaded ahead of their use into registers, at most: at 128 query rows per step
# a thread has 32 columns, and holding both vectors' values spilled (28 bytes at D=64).
HELD_COLUMNS = 16
# A step of this many query rows (m64n80 products, D=128) takes LSE₂ into Sᵀ's accumulator (``seed_scores``).
LSE_IN_ACCUMULATOR_ROWS = 80


def row_vectors(problem: Problem, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """LSE₂ and D, (B, H, Sq) fp32 for the preprocess to fill, each head's row starting
    ``TMA_STRIDE_BYTES``-aligned (the storage padded past Sq, never read there) so that a TMA can read
    them; every variant takes them so."""
    align = TMA_STRIDE_BYTES // FLOAT_BYTES
    padded = (problem.batch, problem.heads, -(-problem.seqlen_q // align) * align)
    return tuple(torch.empty(padded, dtype=torch.float32, device=device)[..., : problem.seqlen_q] for _ in "01")


def slot_bytes(tile_m: int) -> int:
    """The bytes LSE₂ and D add to a ring slot's transaction count."""
    return 2 * tile_m * FLOAT_BYTES


def stage_stride(tile_m: int) -> int:
    """The floats between two ring slots' staged LSE₂ (or D): tile_m rounded up so that every slot's box
    starts ``TMA_SMEM_ALIGN_BYTES``-aligned (80 rows: 96, else slot 1 would start 320 bytes in)."""
    align = TMA_SMEM_ALIGN_BYTES // FLOAT_BYTES
    return -(-tile_m // align) * align


def storage_fields(tile_m: int, stages: int) -> dict:
    """The shared memory of each ring slot's LSE₂ and D, (tile_m, stage) fp32 each, slots ``stage_stride``
    floats apart."""
    values = cute.struct.MemRange[cutlass.Float32, stage_stride(tile_m) * stages]
    return {name: cute.struct.Align[values, TMA_SMEM_ALIGN_BYTES] for name in ("lse2", "delta")}


def staged_rows(storage, tile_m: int, stages: int) -> tuple[cute.Tensor, cute.Tensor]:
    """sLSE2 and sDelta (``storage_fields``): two (tile_m, stage) tensors."""
    layout = cute.make_layout((tile_m, stages), stride=(1, stage_stride(tile_m)))
    return storage.lse2.get_tensor(layout), storage.delta.get_tensor(layout)


def tma_atoms(mLSE2: cute.Tensor, mDelta: cute.Tensor, tile_m: int) -> tuple[tuple, tuple]:
    """The TMA atoms of LSE₂ and D, (Sq, (H, B)) fp32, one (tile_m,) box per query block, and their TMA
    coordinate tensors (what the producer then indexes instead of the vectors)."""
    load = cpasync.CopyBulkTensorTileG2SOp()
    (atom_lse2, tma_lse2), (atom_delta, tma_delta) = (
        cpasync.make_tiled_tma_atom(load, m, cute.make_layout(tile_m), (tile_m,)) for m in (mLSE2, mDelta)
    )
    return (atom_lse2, atom_delta), (tma_lse2, tma_delta)


def add_loads(loads: tuple, atoms: tuple, staged: tuple, vectors: tuple, bh: tuple) -> tuple:
    """A ring's ``loads`` (atoms, sources (TMA, m), slots (TMA, stage)) with LSE₂'s and D's appended: their
    ``atoms``, the head ``bh``'s blocks of their TMA coordinate ``vectors`` and their ``staged`` slots."""
    tile_m = cute.size(staged[0], mode=[0])
    blocks = [cute.local_tile(m[None, bh], (tile_m,), (None,)) for m in vectors]  # (tile_m, m) each
    views = [
        cpasync.tma_partition(atom, 0, cute.make_layout(1), cute.group_modes(s, 0, 1), cute.group_modes(g, 0, 1))
        for atom, s, g in zip(atoms, staged, blocks, strict=True)
    ]  # ((TMA, stage), (TMA, m)) each
    loaded_atoms, sources, slots = loads
    return (*loaded_atoms, *atoms), (*sources, *(g for _, g in views)), (*slots, *(s for s, _ in views))


def step_rows(mLSE2: cute.Tensor, mDelta: cute.Tensor, staged: tuple | None, bh: tuple) -> tuple:
    """Where a dK/dV step reads LSE₂ and D: the ``staged`` ring copies (this variant), else the head's
    (Sq,) vectors in HBM."""
    return staged if staged is not None else (mLSE2[None, bh], mDelta[None, bh])


class StagedColumns:
    """A staged vector's values at a fragment's query columns, read from shared memory where used
    (``column[c]``), not held in registers."""

    def __init__(self, staged: cute.Tensor, cS: cute.Tensor, stage: cutlass.Int32):
        self.staged, self.cS, self.stage = staged, cS, stage

    def __getitem__(self, c: int) -> cutlass.Float32:
        return self.staged[self.cS[0, c][1], self.stage]


@cute.jit
def step_values(
    vector: cute.Tensor, m_start: cutlass.Int32, cS: cute.Tensor, stage: cutlass.Int32, seqlen_q: cutlass.Int32,
    past_end: cutlass.Float32, staged: cutlass.Constexpr,
) -> "cute.Tensor | StagedColumns":  # fmt: skip
    """LSE₂ or D at the query columns of a (key, query) fragment ``cS`` (rows by columns), one value per
    column: ``staged``, from ring slot ``stage`` of its (tile_m, stage) copy (past ``HELD_COLUMNS``, read
    where used: ``StagedColumns``); else from the (Sq,) vector in HBM, ``past_end`` past Sq."""
    columns = cute.size(cS, mode=[1])
    if cutlass.const_expr(staged and columns > HELD_COLUMNS):
        return StagedColumns(vector, cS, stage)
    values = cute.make_rmem_tensor(columns, cutlass.Float32)
    for c in cutlass.range_constexpr(columns):
        if cutlass.const_expr(staged):
            values[c] = vector[cS[0, c][1], stage]
        else:
            values[c] = read_row_values(vector, m_start + cS[0, c][1], seqlen_q, past_end)
    return values


def lse_in_accumulator(tile_m: int) -> bool:
    """Whether the dK/dV step of ``tile_m`` query rows seeds Sᵀ's accumulator with −LSE₂ / scale_log2
    (``seed_scores``) and computes dSᵀ from the 16-bit Pᵀ. At 80 rows a consumer thread holds dK and dV
    (128 fp32), Sᵀ and dPᵀ (40 each); with LSE₂'s 20 values and fp32 Pᵀ beside its 16-bit copy as well,
    ptxas serialised every wgmma of the loop (it needed 256 registers of the 240)."""
    return tile_m == LSE_IN_ACCUMULATOR_ROWS


def seed_scores(
    St: cute.Tensor, staged: cute.Tensor, cS: cute.Tensor, stage: cutlass.Int32, softmax_scale_log2: cutlass.Float32
) -> None:
    """Sᵀ's accumulator (rows by columns) set to −LSE₂[query] / scale_log2 from ring slot ``stage`` of the
    staged LSE₂, so that the wgmma that adds K Qᵀ leaves Sᵀ − LSE₂ / scale_log2 and Pᵀ = exp2(acc ·
    scale_log2). The subtraction moves into the fp32 accumulation (|LSE₂| / scale_log2 ≈ 10² against
    fp32's 2⁻²⁴: an exponent off by about 10⁻⁵ · scale_log2); +inf (a row that sees no key) stays −inf.
    Plain Python, unrolled while the calling kernel is traced: as a ``@cute.jit`` function, the DSL's
    preprocessor failed to rewrite it in a pytest run that had called ``@cute.jit`` functions directly."""
    lse2 = StagedColumns(staged, cS, stage)
    for r in range(cute.size(St, mode=[0])):
        for c in range(cute.size(St, mode=[1])):
            St[r, c] = lse2[c] * (-1.0 / softmax_scale_log2)
