"""Gluon rung ``hopper``: Triton's explicit dialect, warp-specialised by hand (counterparts:
``triton_impl/hopper.py``, ``cute_impl/hopper.py``; device code in ``triton_impl/gluon/_device.py``).

What it adds over ``triton/hopper``: the same algorithm (TMA tiles, wgmma from shared memory, online
softmax with exp2 and the folded scale, causal block skipping) with every decision that Triton's
compiler makes for ``triton/hopper`` written out, and the warp specialisation that Triton 3.6's
automatic ``warp_specialize`` cannot do on sm_90 (it takes one consumer warpgroup, at half speed):
one TMA load warp and two (D=128) or three (D=64) consumer warpgroups, each its own partition with
its own query rows and register budget (``setmaxnreg``: 24 for the load warp, 240 or 160 for each
consumer), so the consumers drift apart and one's softmax runs under another's wgmmas.

The three stacks side by side (what Triton decides / what Gluon makes you write / what CuTe makes
you write):
  * TMA: ``desc.load`` in ``triton_impl/hopper._attention_step``, the compiler builds the copies
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
rescaling and a persistent tile scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.runtime.jit import mangle_type

from common.contract.capability import FEATURES, check_features
from common.contract.problem import Problem
from common.contract.registry import Implementation, Runner, warmed_up
from common.contract.validation import kernel_operand, validate_for_problem
from common.toolchain.arch import check_sm90
from common.toolchain.compile import KernelBinary, compile_triton_sm90
from common.toolchain.releases import release_configs
from triton_impl._host import LOG2_E
from triton_impl.gluon._device import CONSUMER_WARPS, LOAD_REGISTERS, LOAD_WARPS, attention_kernel

HEAD_DIMS = (64, 128)
DTYPES = (torch.float16, torch.bfloat16)
# The register file one CTA may use (one CTA per SM).
CTA_REGISTERS = 65536
WARPGROUP_THREADS = 128
# setmaxnreg's ceiling, and the query rows of one consumer warpgroup (one m64 wgmma).
MAX_REGISTERS = 240
CONSUMER_ROWS = 64
GLUON_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}


@dataclass(frozen=True)
class GluonConfig:
    """Tile sizes, ring depth and consumer warpgroups; every field changes the generated code.

    The CTA's query tile is ``consumers`` × ``CONSUMER_ROWS`` rows, one slice per consumer."""

    block_n: int
    num_stages: int
    consumers: int = 2
    # The consumer warpgroups take turns issuing their wgmmas (FA3's ping-pong).
    pingpong: bool = False
    # Row max and row sum as trees of independent instructions (``_device._row_tree``), not as the chain
    # Triton 3.6 makes of ``gl.max`` / ``gl.sum`` over a thread's columns.
    row_tree: bool = False

    @property
    def block_m(self) -> int:
        return self.consumers * CONSUMER_ROWS

    @property
    def num_warps(self) -> int:
        """The default partition's warps: one consumer warpgroup (the other partitions add theirs)."""
        return CONSUMER_WARPS.value

    @property
    def maxnreg(self) -> int:
        """Registers per thread at launch: the register file over every partition's warps, each
        partition padded to whole warpgroups (the load warp's included)."""
        return CTA_REGISTERS // (self._warpgroups * WARPGROUP_THREADS) // 8 * 8

    @property
    def consumer_registers(self) -> int:
        """setmaxnreg of each consumer: what the load warpgroup's budget leaves, in steps of 8."""
        left = CTA_REGISTERS - LOAD_REGISTERS.value * WARPGROUP_THREADS
        return min(MAX_REGISTERS, left // (self.consumers * WARPGROUP_THREADS) // 8 * 8)

    @property
    def _warpgroups(self) -> int:
        return self.consumers + (LOAD_WARPS.value + 3) // 4


DEFAULT_CONFIGS = release_configs(
    "gluon/hopper", {64: GluonConfig(128, 2, consumers=3, pingpong=True), 128: GluonConfig(128, 2)}
)
# The kernel's FP8 scale arguments (Q_SCALE, K_SCALE, V_SCALE, q_blocks, kv_blocks), absent here.
FP16_SCALES = (None,) * 5
SCALE_ARGS = ("Q_SCALE", "K_SCALE", "V_SCALE", "q_blocks", "kv_blocks")


def launch_constexprs(config: GluonConfig, problem: Problem, quant_blocks: tuple[int, int] | None = None) -> dict:
    """The kernel's constexprs but num_warps; ``quant_blocks`` (FP8): the Q and K/V quantisation block
    rows. The problem features are flags, so a problem without them compiles the plain kernel."""
    q_rows, kv_rows = quant_blocks or (1, 1)
    return {
        "NUM_STAGES": config.num_stages,
        "CAUSAL": problem.causal,
        "GQA": problem.kv_heads != problem.heads,
        "BOTTOM_RIGHT": problem.bottom_right,
        "HAS_CACHE_SEQLENS": problem.has_cache_seqlens,
        "PINGPONG": config.pingpong,
        "NUM_CONSUMERS": config.consumers,
        "CONSUMER_REGS": config.consumer_registers,
        "FP8": quant_blocks is not None,
        "Q_QUANT_BLOCK": q_rows,
        "KV_QUANT_BLOCK": kv_rows,
        "ROW_TREE": config.row_tree,
    }


def _descriptor(tensor: torch.Tensor, box_rows: int, dtype: gl.dtype, box_cols: int | None = None) -> TensorDescriptor:
    """A 4-D TMA descriptor over (B, H, rows, cols): one (batch, head) box of box_rows × box_cols
    (default: all cols, D) per copy."""
    box = [1, 1, box_rows, box_cols or tensor.shape[-1]]
    layout = gl.NVMMASharedLayout.get_default_for(box, dtype)
    return TensorDescriptor(tensor, list(tensor.shape), list(tensor.stride()), box, layout)


class GluonAttention:
    """Prepared launch: descriptors, O and lse built once; calling it launches and returns O, or
    (O, lse) when the problem returns the LSE (the kernel writes lse either way).

    k and v are (B, Hkv, Sk, D): their descriptors cover the KV heads only, and the kernel's TMA
    coordinates name the KV head. ``cache_seqlens`` is read by the kernel at every launch."""

    def __init__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        problem: Problem,
        config: GluonConfig,
        cache_seqlens: torch.Tensor | None = None,
    ):
        batch, heads, seqlen_q, _ = q.shape
        dtype = GLUON_DTYPES[q.dtype]
        self.return_lse = problem.return_lse
        self.out = torch.empty_like(q)
        self.lse = torch.empty((batch, heads, seqlen_q), device=q.device, dtype=torch.float32)
        self._args = (
            _descriptor(q, CONSUMER_ROWS, dtype),
            _descriptor(k, config.block_n, dtype),
            _descriptor(v, config.block_n, dtype),
            _descriptor(self.out, CONSUMER_ROWS, dtype),
            self.lse,
            cache_seqlens,
            heads,
            problem.kv_heads,
            seqlen_q,
            problem.seqlen_k,
            problem.scale * LOG2_E,
            *FP16_SCALES,
        )
        self._options = {
            **launch_constexprs(config, problem),
            "num_warps": config.num_warps,
            "maxnreg": config.maxnreg,
        }
        self._grid = (triton.cdiv(seqlen_q, config.block_m), batch * heads)

    def __call__(self) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        attention_kernel[self._grid](*self._args, **self._options)
        return (self.out, self.lse) if self.return_lse else self.out


def validate_gluon_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    problem: Problem,
    dtypes: tuple[torch.dtype, ...],
    rung: str,
    cache_seqlens: torch.Tensor | None = None,
) -> Problem:
    """Inputs of both Gluon rungs, with every problem feature (GQA, both alignments, cache_seqlens, lse)."""
    if problem.has_cache_seqlens != (cache_seqlens is not None):
        raise ValueError(
            f"{rung}: cache_seqlens must be given exactly when the problem has per-sequence lengths: "
            f"has_cache_seqlens={problem.has_cache_seqlens}, got cache_seqlens={cache_seqlens!r}"
        )
    checked = validate_for_problem(q, k, v, problem, cache_seqlens=cache_seqlens, dtypes=dtypes, head_dims=HEAD_DIMS)
    if checked.scale < 0:
        raise ValueError(f"softmax_scale must be >= 0 for {rung}, got {checked.scale}")
    return checked


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
    checked = validate_gluon_inputs(q, k, v, problem, DTYPES, "gluon/hopper", cache_seqlens)
    return warmed_up(bind(q, k, v, checked, cache_seqlens=cache_seqlens), q.device)


# ----------------------------------------------------------------------------------------------
# Capability check and static compile
# ----------------------------------------------------------------------------------------------
def gluon_supported(problem: Problem, device: torch.device, rung: str) -> tuple[bool, str]:
    """Device, head-dim, feature and scale checks of both Gluon rungs (after their own dtype check).
    Both implement every problem feature (GQA, both causal alignments, cache_seqlens, the LSE)."""
    ok, reason = check_features(rung, problem, FEATURES)
    if not ok:
        return ok, reason
    if problem.head_dim not in HEAD_DIMS:
        return False, f"{rung} needs head_dim in {list(HEAD_DIMS)}, got {problem.head_dim}"
    if problem.scale < 0:
        return False, f"{rung} needs softmax_scale >= 0, got {problem.scale}"
    if device.type != "cuda":
        return False, f"{rung} needs a CUDA GPU: Gluon has no interpreter path, got {device}"
    return check_sm90(rung, device, "warpgroup_mma is Hopper's")


def supports(problem: Problem, device: torch.device) -> tuple[bool, str]:
    if problem.dtype not in DTYPES:
        return False, f"gluon/hopper runs fp16 and bf16, got {problem.dtype_name}"
    return gluon_supported(problem, device, "gluon/hopper")


def descriptor_type(dtype: torch.dtype, box_rows: int, head_dim: int, box_cols: int | None = None) -> str:
    """The signature type of a 4-D descriptor, as the JIT would derive it from a real one."""
    cols = box_cols or head_dim
    sample = torch.empty((1, 1, box_rows, cols), dtype=dtype)
    gluon_dtype = gl.float8e4nv if dtype == torch.float8_e4m3fn else GLUON_DTYPES[dtype]
    return mangle_type(_descriptor(sample, box_rows, gluon_dtype))


def feature_arguments(problem: Problem) -> tuple[dict[str, str], dict[str, object]]:
    """Signature types and constexpr values of the feature arguments for a static compile, as a
    launch passes them: ``CacheSeqlens`` an int32 pointer, or None without per-sequence lengths."""
    if problem.has_cache_seqlens:
        return {"CacheSeqlens": "*i32", "kv_heads": "i32"}, {}
    return {"CacheSeqlens": "constexpr", "kv_heads": "i32"}, {"CacheSeqlens": None}


def compile_kernel_sm90(
    signature: dict[str, str], constexprs: dict[str, object], config: GluonConfig, kernel: object = attention_kernel
) -> KernelBinary:
    """Compile a Gluon kernel for sm_90a without a GPU, through ``common.reporting.static``'s Triton path."""
    from triton.experimental.gluon._runtime import GluonASTSource

    options = {"num_warps": config.num_warps, "maxnreg": config.maxnreg}
    return compile_triton_sm90(
        kernel, signature, constexprs, aligned=("LSE",), options=options, source_type=GluonASTSource
    )


def compile_sm90(problem: Problem, config: GluonConfig | None = None) -> list[KernelBinary]:
    """The kernel for sm_90a at the default configuration of this head dim (no GPU needed)."""
    config = config or DEFAULT_CONFIGS[problem.head_dim]
    q_type = descriptor_type(problem.dtype, CONSUMER_ROWS, problem.head_dim)
    kv_type = descriptor_type(problem.dtype, config.block_n, problem.head_dim)
    feature_types, feature_values = feature_arguments(problem)
    signature = {
        "desc_q": q_type,
        "desc_k": kv_type,
        "desc_v": kv_type,
        "desc_o": q_type,
        "LSE": "*fp32",
        "heads": "i32",
        **feature_types,
        "seqlen_q": "i32",
        "seqlen_k": "i32",
        "softmax_scale_log2": "fp32",
        **dict.fromkeys(SCALE_ARGS, "constexpr"),
    }
    constexprs = {
        **dict.fromkeys(SCALE_ARGS),
        **feature_values,
        **launch_constexprs(config, problem),
        "num_warps": config.num_warps,
    }
    return [compile_kernel_sm90(signature, constexprs, config)]


IMPLEMENTATION = Implementation(
    name="gluon/hopper",
    stack="gluon",
    rung="hopper",
    prepare=prepare,
    bind=bind,
    supports=supports,
    compile_sm90=compile_sm90,
    runs_on_cpu=False,
    required_ptx=("wgmma.mma_async", "cp.async.bulk.tensor", "mbarrier", "setmaxnreg"),
    forbidden_ptx=("cp.async",),
    source_file=__file__,
    default_configs=DEFAULT_CONFIGS,
    notes="Gluon has no interpreter path: it runs only on an sm_90 GPU",
)
