"""Host glue shared by the CuTe DSL Hopper rungs (``hopper.py`` and ``fp8.py``): compile, bind, launch.

None of this is kernel code. :class:`HopperAttentionConfig` is the one compile key: everything that changes
the generated code; :func:`default_config` picks it per problem, as measured. :class:`HopperKernels`
(``_host.CompiledKernels``) compiles the kernel once per configuration, always from fake tensors
(:func:`fake_arguments`), so a GPU launch and a CPU compile for the static analysis trace the same
function with the same argument types and produce the same PTX. At launch, :func:`tensor_arguments`
lists the torch tensors those fakes stand for, passed as they are (TVM-FFI, ``_host``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from cutlass import Float8E4M3FN, Float32, Int32

from common.contract.problem import Problem
from common.contract.registry import Runner
from common.toolchain.arch import SM90A
from cute_impl._host import (
    CUTE_DTYPES,
    CompiledKernels,
    cache_seqlens_tensor,
    fake_cache_seqlens,
    fake_stream,
    fake_tensor,
)
from triton_impl.fp8_quantiser import ROTATED_CORRECTIONS

# FP8 operands: e4m3 (torch's float8_e4m3fn tensors, passed as they are).
FP8_CUTLASS = Float8E4M3FN
# The SM count passed when compiling (it only sizes the persistent grid); launches pass the device's.
STATIC_SM_COUNT = 132
# Keys per block: S (tile_n / 2 registers), P and O must fit in the consumers' registers.
DEFAULT_TILE_N = 128

FP8Scales = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class HopperAttentionConfig:
    """Everything that changes the generated code (the compile-cache key)."""

    dtype: torch.dtype
    head_dim: int
    causal: bool
    tile_n: int = DEFAULT_TILE_N
    kv_stages: int = 2
    # 64-row consumer warpgroups per CTA: 3 only fits when S, P and O need <= 160 registers (D=64).
    consumer_warpgroups: int = 2
    # Consumer warpgroups take turns issuing WGMMA, so that one's softmax overlaps the other's GEMMs.
    pingpong: bool = True
    # FP8 (``fp8.py``): e4m3 operands, V transposed to (B, H, D, Sk) so that both WGMMA operands are
    # K-major, output in bf16.
    fp8: bool = False
    # One CTA per SM looping over query tiles (the SM count is a launch argument), instead of one CTA
    # per tile: the next tile's loads overlap this tile's last GEMM and epilogue.
    persistent: bool = False
    # FP8 block quantisation: Q's scale per consumer warpgroup's 64 rows, K's and V's per key block,
    # read in the kernel (``fp8.py``); per-tensor scales are read once per tile.
    block_scales: bool = False
    # GQA (kv_heads < heads): K and V boxes are read at the KV head h // (heads // kv_heads), a
    # division per tile; without it the query head indexes them directly.
    gqa: bool = False
    # The causal diagonal aligned bottom-right where that differs from top-left
    # (``Problem.bottom_right``): row i sees keys j <= i + seqlen_k - seqlen_q.
    bottom_right: bool = False
    # Per-sequence key lengths (``cache_seqlens``, a (B,) int32 kernel argument).
    has_cache_seqlens: bool = False
    # FP8 with block scales and rotation only: Q arrives in bf16/fp16 and each consumer warpgroup rotates,
    # scales and rounds its own 64 rows (``_fp8_query.QueryQuantiser``) instead of reading the fused
    # quantiser's e4m3 Q; the kernel then writes Q's block scales and takes the rotation's sign matrix.
    quantise_q: bool = False
    # With ``quantise_q``: the next tile's rotation wgmma issued at the end of a tile, after its last P V and
    # before its normalisation and O store, so that the tensor cores run it under that epilogue instead of
    # at the next tile's start (``hopper.py``, step 5).
    rotate_ahead: bool = False
    # With ``quantise_q`` (``fp8.LEAN_Q_QUANTISATION``): the same e4m3 Q with fewer instructions a tile, the amax
    # taken before x c and the e4m3 box written by stmatrix, the sign matrix's columns in
    # ``_fp8_query.paired_columns``' order (``_fp8_query.PairedBoxStore``).
    lean_quantise_q: bool = False
    # With ``quantise_q`` (``fp8.Q_QUOTIENT_CORRECTIONS``): Markstein corrections of each Q value's quotient by its
    # block scale after q = x · (1 / scale) (``_fp8_query.quotient``): 2 as the quantiser, or 1 (the same quotient).
    q_quotient_corrections: int = ROTATED_CORRECTIONS
    # Programmatic dependent launch (``fp8.py``'s ``PROGRAMMATIC_LAUNCH``): launched with programmatic stream
    # serialisation, so that the CTAs start while the kernel before (the fused quantiser, which signals
    # ``griddepcontrol.launch_dependents``) finishes; each role executes ``griddepcontrol.wait`` before its first
    # read of what that kernel writes (``hopper.py``, "Programmatic dependent launch").
    pdl: bool = False
    # cute/decode's packed rows (``decode.PACKED_PREFILL_MIN_ROWS``): q and O are (B, Hkv, group · Sq, D), row
    # (head in group) · Sq + token of one KV head's query heads, so the kernel's tokens are its rows // group and the
    # causal diagonal follows each row's token (FA3's pack-GQA, head-major as cute/decode packs); 1: rows are tokens.
    packed_group: int = 1
    # Key splits (FlashAttention-3's num_splits; cute/decode's packed prefill, ``decode.PACKED_PREFILL_SPLITS``): every
    # query tile is one tile per split of its key blocks (``_device.key_split_range``), the split count the leading
    # extent of O and the LSE, then fp32 partials (splits, B, H, Sq, D) and (splits, B, H, Sq) written from the
    # registers (normalised O, natural-log LSE), for cute/decode's merge kernel. 16-bit only.
    key_splits: bool = False
    # FP8 block scales addressed with 32-bit strides (``fp8.SCALE_INDEX_32BIT``): the (B, H, blocks) scale tensors are
    # small, and with 64-bit strides ptxas recomputes each key block's scale addresses from the batch and head
    # strides inside the key loop (six 64-bit multiply-adds for K's and V's each, uniform registers being short).
    scale_index_32: bool = False
    # FP8 (``fp8.FOLD_V_SCALE``): O kept in the frame of its last key block's V scale and owing the last softmax
    # update's row factor, so that each block's P V joins it in one FMA a value, acc = acc · (owed factor · s_v(last) /
    # s_v(this)) + P V, as gluon/fp8 accumulates, instead of an FMA with the V scale and a conditional multiply by
    # the row factor; the last block's V scale joins the output scale.
    fold_v_scale: bool = False

    @property
    def out_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.fp8 else self.dtype


def default_config(problem: Problem, fp8: bool = False) -> HopperAttentionConfig:
    """Tile sizes, warpgroups and ring depth per head dim, as measured on the H200 (the A/B runs are in
    docs/perf-log.md)."""
    # Persistent CTAs overlap the next tile's loads with this tile's epilogue; causal D=64 measured
    # faster with one CTA per tile.
    persistent = not (problem.causal and problem.head_dim == 64)
    # Ping-pong pays off for 16-bit only without the causal mask's work. FP8's GEMMs take half the bf16
    # time, so waiting for the turn costs more than the overlap it enforces (D=64: 3.0 % slower
    # non-causal; causal it measured 3.7 % faster, but with GQA, cache lengths and the LSE together it
    # spills; results/h200/fp8-d64/). D=128 with Q quantised in the kernel: 0.93x causal, 0.92x non-causal
    # (results/h200/cute-fp8-pingpong/, 2026-12-04), where gluon/fp8 gains 1.06x from it.
    pingpong = not fp8 and not problem.causal
    # D=64 has half the GEMM work per score: two warpgroups leave the softmax's latency exposed.
    consumer_warpgroups = 3 if problem.head_dim == 64 else 2
    return HopperAttentionConfig(
        dtype=problem.dtype,
        head_dim=problem.head_dim,
        causal=problem.causal,
        consumer_warpgroups=consumer_warpgroups,
        pingpong=pingpong,
        fp8=fp8,
        persistent=persistent,
        gqa=problem.kv_heads != problem.heads,
        bottom_right=problem.bottom_right,
        has_cache_seqlens=problem.has_cache_seqlens,
    )


def fake_arguments(config: HopperAttentionConfig) -> tuple[Any, ...]:
    """The kernel's arguments for compiling ``config``: q, k, v (V transposed for FP8), o, lse (``key_splits``: their
    fp32 partials), the key lengths (None without them), the three FP8 scale tensors (None for 16-bit), the rotation's
    (D, D) sign matrix (``quantise_q`` only, else None), the scalars and the stream."""
    element = FP8_CUTLASS if config.fp8 else CUTE_DTYPES[config.dtype]
    query = CUTE_DTYPES[config.dtype] if config.quantise_q else element
    operands = [fake_tensor(query, 4), fake_tensor(element, 4), fake_tensor(element, 4)]
    outputs = [fake_tensor(CUTE_DTYPES[config.out_dtype], 4), fake_tensor(Float32, 3)]
    if config.key_splits:  # the fp32 partials, the split count leading
        outputs = [fake_tensor(Float32, 5), fake_tensor(Float32, 4)]
    cache_seqlens = fake_cache_seqlens() if config.has_cache_seqlens else None
    scale_bits = 32 if config.scale_index_32 else 64
    scales = [fake_tensor(Float32, 3, scale_bits) for _ in range(3)] if config.fp8 else [None] * 3
    rotation = fake_tensor(CUTE_DTYPES[config.dtype], 2) if config.quantise_q else None
    # The scalars' values do not enter the code: softmax_scale_log2, output_scale, SM count.
    scalars = [Float32(1.0), Float32(1.0), Int32(STATIC_SM_COUNT)]
    return (*operands, *outputs, cache_seqlens, *scales, rotation, *scalars, fake_stream())


def tensor_arguments(
    config: HopperAttentionConfig,
    tensors: tuple[torch.Tensor, ...],
    scales: FP8Scales | None,
    cache_seqlens: torch.Tensor | None = None,
    rotation: torch.Tensor | None = None,
) -> tuple[Any, ...]:
    """q, k, v, o, lse, the key lengths (and the FP8 scales, else None), the rotation's sign matrix (else
    None) as the kernel takes them at launch: the runtime counterparts of ``fake_arguments``' tensors."""
    if config.fp8 != (scales is not None):
        raise ValueError(
            f"FP8 operands need their scales and 16-bit ones none: fp8={config.fp8}, scales given={scales is not None}"
        )
    if config.has_cache_seqlens != (cache_seqlens is not None):
        raise ValueError(
            f"cache_seqlens must be given exactly when compiled for them: has_cache_seqlens="
            f"{config.has_cache_seqlens}, cache_seqlens given={cache_seqlens is not None}"
        )
    if config.quantise_q != (rotation is not None):
        raise ValueError(
            f"the rotation's sign matrix must be given exactly when Q is quantised in the kernel: quantise_q="
            f"{config.quantise_q}, rotation given={rotation is not None}"
        )
    lengths = None if cache_seqlens is None else cache_seqlens_tensor(cache_seqlens)
    return (*tensors, lengths, *((None,) * 3 if scales is None else scales), rotation)


class HopperKernels(CompiledKernels[HopperAttentionConfig]):
    """``HopperAttention`` compiled once per configuration, from :func:`fake_arguments` (for sm_90a,
    on the GPU as on a CPU); :meth:`launcher` binds tensors and returns the launch-only run."""

    def __init__(self, kernel_class: Callable[[HopperAttentionConfig], Any]):
        super().__init__(kernel_class, fake_arguments, arch=SM90A)

    def launcher(
        self, config: HopperAttentionConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        softmax_scale_log2: float, output_scale: float, sm_count: int | None = None, scales: FP8Scales | None = None, *,
        cache_seqlens: torch.Tensor | None = None, return_lse: bool = False, rotation: torch.Tensor | None = None,
    ) -> Runner:  # fmt: skip
        """Compile (cached on ``config``), allocate O and LSE once, and return the launch-only ``run``.

        ``sm_count`` caps a persistent grid (default: the device's SMs; tests pass fewer so that every
        CTA walks many tiles). ``scales`` (FP8 only): Q's e4m3 scales (B, H, blocks), K's and V's
        (B, Hkv, blocks), fp32 (with ``quantise_q`` q is bf16/fp16 and the kernel writes Q's scales into
        ``scales[0]``; ``rotation`` is the transposed (D, D) sign matrix of the Hadamard rotation, in q's
        dtype). ``cache_seqlens``: the (B,) int32 key lengths, read at every launch.
        The kernel always writes the LSE; ``run()`` returns (O, lse) when ``return_lse``, else O. A ``key_splits``
        configuration writes partials that a merge must follow: cute/decode launches it (``_decode_packed_splits``)."""
        if config.key_splits:
            raise ValueError(f"key_splits launches through cute/decode's packed prefill, not alone: {config}")
        batch, heads, seqlen_q, head_dim = q.shape
        o = torch.empty((batch, heads, seqlen_q, head_dim), dtype=config.out_dtype, device=q.device)
        lse = torch.empty((batch, heads, seqlen_q), dtype=torch.float32, device=q.device)
        args = tensor_arguments(config, (q, k, v, o, lse), scales, cache_seqlens, rotation)
        # The SM count is a launch argument (read here, at run time), so compiling never queries a device.
        sm_count = sm_count or torch.cuda.get_device_properties(q.device).multi_processor_count
        scalars = (float(softmax_scale_log2), float(output_scale), int(sm_count))
        run = self.runner(config, (*args, *scalars), (o, lse) if return_lse else o)
        run.lse = lse  # for a future backward pass and for tests
        run.config = config  # for tests: the compile key it launches
        return run
