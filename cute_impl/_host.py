"""Host-side glue shared by the CuTe rungs: dtypes, operands, the compile cache, the validating
``prepare``, fake operands for CPU compiles, and the launch setup of the ``mma.sync`` rungs (tiled,
pipelined, decode).

None of this is kernel code. Every kernel is compiled once per configuration from fake tensors with
dynamic shape and strides (:class:`CompiledKernels`), so one compilation serves every shape and a GPU
launch and a CPU compile for the static analysis trace the same function with the same argument
types. The compile goes through TVM-FFI (``cute.EnableTVMFFI``): the compiled function then takes
torch tensors, Python floats and ints and ``None`` as they are, checks each tensor against its fake
(dtype, rank, unit stride of the last dimension, alignment, device) in compiled code and launches on
torch's current stream. A launch converts nothing in Python: no DLPack capsule and no CuTe tensor per
operand per call, which were most of an eager decode step's host time (a growing KV cache hands new
tensors to every call; results/h200/generate-profile/).
"""

import importlib.util
from collections.abc import Callable, Collection, Hashable, Sequence
from dataclasses import dataclass, fields
from typing import Any, Generic, NamedTuple, TypeVar

# Every CuTe kernel compiles through TVM-FFI (below), which the CuTe DSL imports only at the first compile: without
# it a rung would import, pass its capability check and fail at its first launch. Refused here instead, as an
# absent optional package (compare.py reports the reason), without paying its import (about 1 s) up front.
if importlib.util.find_spec("tvm_ffi") is None:
    raise ModuleNotFoundError(
        "No module named 'tvm_ffi': the CuTe rungs compile through TVM-FFI (pyproject.toml pins apache-tvm-ffi)",
        name="tvm_ffi",
    )

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.nvgpu import cpasync, warp
from cutlass.cute.runtime import make_fake_stream, make_fake_tensor
from cutlass.cute.typing import AddressSpace

from common.contract import splits
from common.contract.capability import FEATURES, check_common, check_features
from common.contract.problem import Problem
from common.contract.registry import Implementation, Runner, per_call_inputs, warmed_up
from common.contract.validation import (
    OPERAND_ALIGNMENT_BYTES,
    kernel_operand,
    validate_for_problem,
)
from common.toolchain.compile import KernelBinary, compile_cute_sm90

Config = TypeVar("Config", bound=Hashable)

CUTE_DTYPES = {torch.float16: cutlass.Float16, torch.bfloat16: cutlass.BFloat16}
# mma.sync with bf16 operands and cp.async are sm_80 features (Hopper runs them too).
MMA_SYNC_MIN_CAPABILITY = (8, 0)


# Compile option: the compiled function takes torch tensors and Python scalars directly (see above).
TVM_FFI = cute.EnableTVMFFI


def fake_stream() -> Any:
    """The stream argument of every kernel: TVM-FFI's environment stream, which the call sets to
    torch's current stream on the tensors' device, read at every launch so that a CUDA-graph capture
    on a side stream records it. The compiled function takes no stream argument."""
    return make_fake_stream(use_tvm_ffi_env_stream=True)


def fake_cache_seqlens() -> Any:
    """What ``cache_seqlens_tensor`` passes at launch: (B,) int32, contiguous, 4-byte aligned."""
    return make_fake_tensor(cutlass.Int32, (cute.sym_int(),), (1,), assumed_align=4)


def fake_block_table() -> Any:
    """What ``block_table_tensor`` passes at launch: (B, max_pages_per_seq) int32, rows contiguous."""
    shape, stride = (cute.sym_int(), cute.sym_int()), (cute.sym_int64(), 1)
    return make_fake_tensor(cutlass.Int32, shape, stride, assumed_align=4)


def generic_view(tensor: cute.Tensor | None) -> cute.Tensor | None:
    """``tensor`` (or None) addressed through a generic pointer, in a launcher's ``@cute.jit
    __call__``. TVM-FFI passes a CUDA tensor only as global memory (the DSL calls a generic tensor a
    CPU one), while the kernels read the key lengths and block tables, and the TMA rungs address every
    operand, through generic pointers: their code as compiled and measured since the fakes were
    generic. This keeps that code; global pointers change it (``ld.global`` for the key lengths)."""
    if tensor is None:
        return None
    address = tensor.iterator
    iterator = cute.make_ptr(
        tensor.element_type, address.toint(), AddressSpace.generic, assumed_align=address.alignment
    )
    return cute.make_tensor(iterator, tensor.layout)


def block_table_tensor(block_table: torch.Tensor) -> torch.Tensor:
    """The (B, max_pages_per_seq) int32 block table as the kernel takes it (each row's entries made
    adjacent; the runtime counterpart of the fake)."""
    return block_table if block_table.stride(1) == 1 else block_table.contiguous()


def cache_seqlens_tensor(cache_seqlens: torch.Tensor) -> torch.Tensor:
    """The (B,) int32 key lengths as the kernel takes them (the runtime counterpart of the fake)."""
    if not cache_seqlens.is_contiguous():
        raise ValueError(f"cache_seqlens must be contiguous, got stride {cache_seqlens.stride()}")
    return cache_seqlens


def fake_tensor(element_type: type, rank: int, stride_bits: int = 64) -> Any:
    """What a launch passes for a torch operand, without data: a CUDA tensor (global memory) with
    every dimension and outer stride symbolic, the last dimension contiguous, 16-byte aligned
    (``kernel_operand`` guarantees both, and the TVM-FFI call checks them). The compiled function reads
    each tensor's sizes and strides in the order this type declares (a static head dim here would
    shift every stride after it). ``stride_bits``: 64, or 32 for a tensor of fewer than 2^31 elements."""
    if stride_bits not in (32, 64):
        raise ValueError(f"a fake tensor's strides are 32 or 64 bits, got {stride_bits}")
    sizes = tuple(cute.sym_int() for _ in range(rank))
    stride = cute.sym_int64 if stride_bits == 64 else cute.sym_int
    strides = (*(stride() for _ in range(rank - 1)), 1)
    return make_fake_tensor(element_type, sizes, strides, assumed_align=OPERAND_ALIGNMENT_BYTES)


class CompiledKernels(Generic[Config]):
    """A kernel class compiled once per configuration (the compile key: everything that changes the
    generated code), always from fake tensors and always through TVM-FFI.

    ``kernel_class(config)`` is the ``@cute.jit`` launcher object (with ``threads_per_cta``);
    ``fake_arguments(config)`` its whole argument list without data (tensors, scalars, and
    :func:`fake_stream` last). :meth:`kernel` compiles for launches on the GPU (for ``arch``, default
    the device's own): the result takes the launch arguments without the stream. :meth:`binaries`
    compiles the same for sm_90a on a CPU for the static analysis, keeping PTX and cubin: the same
    trace with the same options, so the machine code the analysis sees is the one that runs.
    """

    def __init__(
        self,
        kernel_class: Callable[[Config], Any],
        fake_arguments: Callable[[Config], Sequence[Any]],
        *,
        arch: str | None = None,
    ):
        self.kernel_class = kernel_class
        self.fake_arguments = fake_arguments
        self.arch = arch
        self.compiled: dict[Config, Callable[..., None]] = {}

    def kernel(self, config: Config) -> Callable[..., None]:
        """The kernel of ``config``, compiled on first use; it takes torch tensors, ``None`` where the
        configuration has no tensor, and Python floats and ints for the scalars."""
        if config not in self.compiled:
            options = (TVM_FFI,) if self.arch is None else (cute.GPUArch(self.arch), TVM_FFI)
            compile_for = cute.compile[options]
            self.compiled[config] = compile_for(self.kernel_class(config), *self.fake_arguments(config))
        return self.compiled[config]

    def binaries(self, config: Config, name: str) -> list[KernelBinary]:
        """The same compile for sm_90a on a CPU, keeping PTX and cubin for the static analysis."""
        kernel = self.kernel_class(config)
        fakes = self.fake_arguments(config)
        return [compile_cute_sm90(kernel, *fakes, name=name, threads=kernel.threads_per_cta, options=(TVM_FFI,))]

    def runner(self, config: Config, arguments: Sequence[Any], result: Any) -> Runner:
        """Compile (cached on ``config``) and return the launch-only ``run()``: it passes ``arguments``
        (the launch counterparts of the fakes, without the stream: the call launches on torch's
        current stream) and returns ``result``."""
        return launch_runner(self.kernel(config), Launch(config, tuple(arguments), result))


@dataclass(frozen=True)
class ProblemConfig:
    """The compile key of the rungs without tile choices (naive, online): the dtype, the head dim and
    the problem's compile-time features."""

    dtype: torch.dtype
    head_dim: int
    causal: bool
    bottom_right: bool  # causal diagonal shifted by causal_offset = seqlen_k - Sq
    has_cache_seqlens: bool  # a (B,) int32 kernel argument: each sequence's seqlen_k
    return_lse: bool  # the kernel also writes the (B, H, Sq) fp32 LSE

    @staticmethod
    def of(problem: Problem) -> "ProblemConfig":
        """The key of ``problem``: each field is the Problem's attribute of the same name."""
        return ProblemConfig(**{field.name: getattr(problem, field.name) for field in fields(ProblemConfig)})


def feature_flags(problem: Problem) -> dict[str, bool]:
    """The problem features as the compile-time flags of a tile rung's key (tiled's and pipelined's
    ``TileConfig``), named as their fields: GQA (Hkv < H), the bottom-right diagonal, per-sequence key
    lengths, the LSE (the CuTe counterpart of Triton's ``feature_constexprs``)."""
    return {
        "gqa": problem.kv_heads != problem.heads,
        "bottom_right": problem.bottom_right,
        "has_cache_seqlens": problem.has_cache_seqlens,
        "return_lse": problem.return_lse,
    }


def fake_attention_arguments(config: Any) -> tuple[Any, ...]:
    """The arguments of the prefill kernels (online, tiled, pipelined) without data, as
    :func:`attention_launch` passes them: q, k, v, o (B, H or Hkv, S, D), the (B, H, Sq) LSE (None
    unless ``config.return_lse``), the key lengths (None unless ``config.has_cache_seqlens``), the
    softmax scale (its value does not enter the code) and the stream."""
    element = CUTE_DTYPES[config.dtype]
    operands = [fake_tensor(element, 4) for _ in range(4)]
    lse = fake_tensor(cutlass.Float32, 3) if config.return_lse else None
    lengths = fake_cache_seqlens() if config.has_cache_seqlens else None
    return (*operands, lse, lengths, cutlass.Float32(1.0), fake_stream())


class Launch(NamedTuple):
    """What one ``bind`` launches: the compile key, the kernel's arguments (the launch counterparts of
    its fakes, without the stream), what ``run()`` returns, what the plan chose that callers may
    read on ``run`` (decode's ``num_splits``), and the torch work ``run()`` does before the kernel
    (``prologue``: decode's packed q for cute/hopper's kernel; None: none)."""

    config: Hashable
    arguments: tuple[Any, ...]
    result: Any
    chosen: dict[str, Any] | None = None
    prologue: Callable[[], None] | None = None


def launch_runner(kernel: Callable[..., Any], launch: Launch) -> Runner:
    """The launch-only ``run()`` of ``launch`` on its compiled ``kernel``, carrying what the plan chose."""
    arguments, result, prologue = launch.arguments, launch.result, launch.prologue
    if prologue is None:

        def run() -> Any:
            kernel(*arguments)
            return result

    else:

        def run() -> Any:
            prologue()
            kernel(*arguments)
            return result

    for attribute, value in (launch.chosen or {}).items():
        setattr(run, attribute, value)
    return run


class PlannedBinder:
    """A rung's bind less what its ``launch_plan`` decided (``planned``): ``binder(q, k, v, cache_seqlens,
    block_table)`` allocates through ``plan_launch`` and launches the compiled kernel of ``planned``'s configuration,
    looked up once (at the first call, after ``prepare`` compiled it) instead of hashing the configuration per bind.
    ``ready``: every q, k, v passed is kernel-addressable (the plan key proves it): no ``kernel_operand``."""

    def __init__(self, host: "RungHost", problem: Problem, planned: Any, ready: bool, decisions: tuple[bool, int]):
        self.host, self.problem, self.planned, self.ready, self.decisions = host, problem, planned, ready, decisions
        self.compiled: Callable[..., Any] | None = None

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache_seqlens: torch.Tensor | None,
        block_table: torch.Tensor | None,
    ) -> Runner:  # fmt: skip
        if not self.ready:
            q, k, v = (kernel_operand(t) for t in (q, k, v))
        launch = self.host.plan_launch(
            q, k, v, self.problem, cache_seqlens=cache_seqlens, block_table=block_table, planned=self.planned
        )
        if self.compiled is None:
            self.compiled = self.host.kernels.kernel(launch.config)
        return launch_runner(self.compiled, launch)

    def grown(self, problem: Problem, device: torch.device) -> "PlannedBinder":
        """The binder of ``problem``, a longer cache of this binder's family (the registry's growing binder): where
        Sk leaves the rung's ``seqlen_k_decisions`` as they were, this binder's launch plan and compiled kernel for
        ``problem`` (``plan_launch`` reads the problem only for what the family shares; the kernel takes Sk from
        K's shape), else a new binder on a new ``launch_plan``. The module switches stay those read when the family
        was planned (``clear_plan_cache()`` re-reads them)."""
        unchanged = splits.same_padded_split(self.decisions[0], problem, self.problem)
        if not unchanged and self.host.seqlen_k_decisions(problem, device) != self.decisions:
            return self.host.make_binder(problem, device, self.host.launch_plan(problem, device), self.ready)
        longer = PlannedBinder(self.host, problem, self.planned, self.ready, self.decisions)
        longer.compiled = self.compiled
        return longer


class RungHost:
    """One rung's host entry points, configured once: validate → plan → bind.

    ``plan(problem, **options)`` is the compile key of a problem (:meth:`compile_sm90` compiles it);
    ``launch_plan(problem, device)`` (optional) what ``plan_launch`` decides before it allocates, which it
    takes back as ``planned=`` (the registry's ``plan_bind``), with ``seqlen_k_decisions(problem, device)`` the part
    of it that Sk enters, ``(balanced, count)``: the balanced split or not and the split count (equal decisions: an
    equal launch plan; :meth:`PlannedBinder.grown`);
    ``plan_launch(q, k, v, problem, *, cache_seqlens, **options)`` allocates the outputs of validated,
    kernel-ready q, k, v and returns the :class:`Launch`. ``head_dims``, ``features`` (names of
    ``common.contract.capability.FEATURES``) and ``problem_check`` (the rung's own limits, as its
    ``supports`` states them) are what :meth:`prepare` validates against.
    """

    def __init__(
        self,
        name: str,
        kernels: CompiledKernels,
        *,
        plan: Callable[..., Hashable],
        plan_launch: Callable[..., Launch],
        head_dims: Collection[int],
        features: Collection[str] = FEATURES,
        problem_check: Callable[[Problem], tuple[bool, str]] | None = None,
        launch_plan: Callable[[Problem, torch.device], Any] | None = None,
        seqlen_k_decisions: Callable[[Problem, torch.device], tuple[bool, int]] | None = None,
    ):
        self.name = name
        self.kernels = kernels
        self.plan = plan
        self.plan_launch = plan_launch
        self.launch_plan = launch_plan
        self.seqlen_k_decisions = seqlen_k_decisions
        self.head_dims = tuple(head_dims)
        self.features = tuple(features)
        self.problem_check = problem_check

    def prepare(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, *,
        cache_seqlens: torch.Tensor | None = None, block_table: torch.Tensor | None = None, **options: Any,
    ) -> Runner:  # fmt: skip
        """Validate q (B, H, Sq, D), k and v (B, Hkv, Sk, D) or, with a ``block_table``, page pools
        (num_pages, page_size, Hkv, D) (and ``cache_seqlens``) against the rung's
        head dims, features and limits, bind them to the Problem they describe (compiling on first
        use), and launch once to warm up. ``options`` go to ``plan_launch`` (decode's ``num_splits``).
        The tensors are checked with every feature ``problem`` states; a feature the rung lacks is
        then refused by name (every CuTe rung implements GQA, the one the tensors' shapes carry)."""
        checked = validate_for_problem(
            q, k, v, problem, cache_seqlens=cache_seqlens, block_table=block_table, head_dims=self.head_dims
        )
        checks = [check_features(self.name, checked, self.features)]
        if self.problem_check is not None:
            checks.append(self.problem_check(checked))
        for ok, reason in checks:
            if not ok:
                raise ValueError(reason)
        run = self.bind(q, k, v, checked, **per_call_inputs(checked, cache_seqlens, block_table), **options)
        return warmed_up(run, q.device)

    def bind(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: Problem, **inputs: Any) -> Runner:
        """The launch-only ``run()`` of validated q, k, v (compiled on first use, cached on the plan);
        ``inputs``: the per-call inputs (``cache_seqlens``) and the options of ``plan_launch``."""
        q, k, v = (kernel_operand(t) for t in (q, k, v))
        launch = self.plan_launch(q, k, v, problem, **inputs)
        return launch_runner(self.kernels.kernel(launch.config), launch)

    def make_binder(self, problem: Problem, device: torch.device, planned: Any, ready: bool) -> PlannedBinder:
        """:meth:`bind` in two for a rung with ``launch_plan`` (``planned`` is its answer for ``problem`` and
        ``device``): a :class:`PlannedBinder` (the registry's ``make_binder``)."""
        return PlannedBinder(self, problem, planned, ready, self.seqlen_k_decisions(problem, device))

    def compile_sm90(self, problem: Problem, **options: Any) -> list[KernelBinary]:
        """The kernels of ``plan(problem)`` compiled for sm_90a on fake tensors (no GPU needed)."""
        return self.kernels.binaries(self.plan(problem, **options), self.name.replace("/", "_"))

    def implementation(self, **entry_fields: Any) -> Implementation:
        """The registry entry of this rung (as ``triton_impl._host.TritonEntry.implementation``): its
        name, stack and rung, ``prepare``, ``bind`` and ``compile_sm90``, no CPU path, and ``entry_fields``."""
        stack, rung = self.name.split("/")
        return Implementation(
            name=self.name, stack=stack, rung=rung, prepare=self.prepare, bind=self.bind,
            compile_sm90=self.compile_sm90, runs_on_cpu=False, plan_bind=self.launch_plan,
            # Only a rung whose launch plan is made once per plan has a configuration fixed by the plan key.
            make_binder=None if self.launch_plan is None else self.make_binder, **entry_fields,
        )  # fmt: skip


def attention_launch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    problem: Problem,
    *,
    plan: Callable[[Problem], Hashable],
    cache_seqlens: torch.Tensor | None = None,
    scale_factor: float = 1.0,
) -> Launch:
    """The :class:`Launch` of the kernels that take (q, k, v, o, lse, cache_seqlens, scale, stream)
    (online, tiled, pipelined): O (and the (B, H, Sq) fp32 LSE) allocated here; ``run()`` returns O,
    or (O, lse) when ``problem.return_lse``; the scale passed is ``problem.scale · scale_factor``."""
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = None
    if problem.return_lse:
        lse = torch.empty((problem.batch, problem.heads, problem.seqlen_q), dtype=torch.float32, device=q.device)
    lengths = None if cache_seqlens is None else cache_seqlens_tensor(cache_seqlens)
    arguments = (q, k, v, out, lse, lengths, problem.scale * scale_factor)
    return Launch(plan(problem), arguments, (out, lse) if problem.return_lse else out)


def mma_sync_supports(
    name: str, problem: Problem, device: torch.device, head_dims: Collection[int], features: Collection[str] = ()
) -> tuple[bool, str]:
    """The capability check of the ``mma.sync`` rungs (tiled, pipelined): a CUDA device of sm_80+
    (``mma.sync`` bf16 and ``cp.async``), fp16/bf16, one of ``head_dims``, the problem features in
    ``features``, softmax_scale > 0."""
    ok, reason = check_common(
        name,
        problem,
        device,
        dtypes=tuple(CUTE_DTYPES),
        head_dims=head_dims,
        min_capability=MMA_SYNC_MIN_CAPABILITY,
        features=features,
    )
    if not ok:
        return ok, reason
    return positive_scale(problem)


def positive_scale(problem: Problem) -> tuple[bool, str]:
    """The ``mma.sync`` rungs take ``row_max`` (the maximum of S · softmax_scale_log2) as max(S) ·
    softmax_scale_log2, which is that maximum only for a positive scale; a zero scale would also turn
    the mask's -inf into NaN in the exp2 FMA."""
    if problem.scale <= 0:
        return False, (
            "softmax_scale must be > 0 (row_max is taken as max(S) * softmax_scale_log2, and a zero scale "
            f"turns the mask's -inf into NaN in the exp2 FMA), got {problem.scale}"
        )
    return True, ""


# ----------------------------------------------------------------------------------------------
# Launch setup of the mma.sync rungs (tiled, pipelined): operand views, copy atom, tiled MMA,
# shared storage and grid, built while tracing their ``@cute.jit __call__``.
# ----------------------------------------------------------------------------------------------
COPY_BITS = 128  # cp.async moves 16 B per thread and instruction; strides must be multiples of it
WARP_THREADS = 32
# m16n8k16: the MMA instruction shape of mma.sync for fp16/bf16 with fp32 accumulators.
MMA_SYNC_SHAPE = (16, 8, 16)
# Swizzle atom of the ldmatrix rungs' shared tiles (pipelined, decode): 8 rows of 64 elements (128 B);
# Swizzle<3,3,3> XORs the 16 B chunk index with the row index within the atom, so 8 rows read
# together by ldmatrix hit 8 distinct bank groups.
SWIZZLE_ROWS, SWIZZLE_COLS, SWIZZLE_BITS = 8, 64, 3


def static_head_dim_view(tensor: cute.Tensor, head_dim: int) -> cute.Tensor:
    """(B, H, S, D) view (or any rank whose last mode is D) whose D is the compile-time ``head_dim``
    and whose outer strides are known multiples of 16 bytes (``kernel_operand`` guarantees it, and the
    rungs' own outputs are contiguous), so copies can vectorise."""
    elems = COPY_BITS // tensor.element_type.width
    shape = (*tensor.shape[:-1], head_dim)
    stride = (*(cute.assume(s, divby=elems) for s in tensor.stride[:-1]), 1)
    return cute.make_tensor(tensor.iterator, cute.make_layout(shape, stride=stride))


def cp_async_tiled_copy(dtype: type[cutlass.Numeric], num_threads: int, row_elems: int) -> cute.TiledCopy:
    """G→S with ``cp.async.cg``: each thread moves 16 B (8 elements) per instruction, ``row_elems / 8``
    threads cover ``row_elems`` consecutive elements of a row, so one copy step covers
    ``num_threads * 8 / row_elems`` rows."""
    elems = COPY_BITS // dtype.width
    threads_per_row = row_elems // elems
    copy_atom = cute.make_copy_atom(
        cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), dtype, num_bits_per_copy=COPY_BITS
    )
    return cute.make_tiled_copy_tv(
        copy_atom,
        cute.make_layout((num_threads // threads_per_row, threads_per_row), stride=(threads_per_row, 1)),
        cute.make_layout((1, elems)),
    )


def warp_tiled_mma(dtype: type[cutlass.Numeric], num_threads: int) -> cute.TiledMma:
    """``mma.sync.m16n8k16`` with fp32 accumulators; warps tile M (each owns 16-row slices of the
    tile) and the permutation makes one tiled-MMA step 16 wide in N and K."""
    num_warps = num_threads // WARP_THREADS
    return cute.make_tiled_mma(
        warp.MmaF16BF16Op(dtype, cutlass.Float32, MMA_SYNC_SHAPE),
        (num_warps, 1, 1),
        permutation_mnk=(num_warps * MMA_SYNC_SHAPE[0], 16, 16),
    )


def swizzled_qkv_layouts(tile_m: int, tile_n: int, head_dim: int, stages: int) -> tuple[Any, Any]:
    """The swizzled shared-memory layouts of the ldmatrix rungs: the Q tile (tile_m, D) and the K (or
    V) ring (tile_n, D, stages), both tiled from the Swizzle<3,3,3> atom."""
    swizzle_atom = cute.make_composed_layout(
        cute.make_swizzle(SWIZZLE_BITS, 3, 3),
        0,
        cute.make_layout((SWIZZLE_ROWS, SWIZZLE_COLS), stride=(SWIZZLE_COLS, 1)),
    )
    sQ_layout = cute.tile_to_shape(swizzle_atom, (tile_m, head_dim), (0, 1))
    sKV_layout = cute.tile_to_shape(swizzle_atom, (tile_n, head_dim, stages), (0, 1, 2))
    return sQ_layout, sKV_layout


def qkv_shared_storage(dtype: type[cutlass.Numeric], sQ_layout: Any, sKV_layout: Any, align_bytes: int) -> Any:
    """The shared-memory struct of one CTA: a Q tile, and K and V buffers of ``sKV_layout`` each.
    (This module has no ``from __future__ import annotations``: ``cute.struct`` reads the field
    annotations as objects, and string annotations would name this function's locals.)"""

    @cute.struct
    class SharedStorage:
        sQ: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sQ_layout)], align_bytes]
        sK: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sKV_layout)], align_bytes]
        sV: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sKV_layout)], align_bytes]

    return SharedStorage


def qkv_ring_storage(dtype: type[cutlass.Numeric], sQ_layout: Any, sKV_layout: Any, align_bytes: int) -> Any:
    """The shared memory of a CTA whose K and V rings lie back to back in one range (``decode``: the
    drained ring then holds the warps' fp32 partials): a Q tile and 2 · cosize(``sKV_layout``)."""

    @cute.struct
    class SharedStorage:
        sQ: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sQ_layout)], align_bytes]
        sKV: cute.struct.Align[cute.struct.MemRange[dtype, 2 * cute.cosize(sKV_layout)], align_bytes]

    return SharedStorage


def query_tile_grid(mQ: cute.Tensor, tile_m: int) -> tuple[Any, Any, Any]:
    """One CTA per (``tile_m``-row query tile, head, batch)."""
    return (cute.ceil_div(mQ.shape[2], tile_m), mQ.shape[1], mQ.shape[0])
