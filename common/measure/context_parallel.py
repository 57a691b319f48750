"""One row of the context-parallel sweep: attention over a sequence sharded across the ranks of a
``torchrun`` launch, checked against float64 and timed; by our ring (``common.distributed``) with a
registered implementation, or by PyTorch's ``context_parallel`` with an SDPA backend.

Per row (one method, tokens per GPU T, mask), every rank:

1. **inputs**: q, k, v of the whole sequence (S = N x T) exist only as seeds; each rank draws its
   zig-zag shard (``common.distributed.check.ChunkedInputs``);
2. **check**: the first call (which also plans and compiles every step shape) is judged on sampled
   rows against float64 over all S keys (``check_rows``); the row is wrong when any rank's is;
3. **ring time**: fixed repetitions, each started together (a gloo barrier, then a device sync), each
   timed by device events; per repetition the slowest rank counts; the median is ``ring_ms``;
4. **no transfers** (our ring): the same with ``communicate=False``, the kernels and merges alone
   (``compute_only_ms``), each kernel call timed by its own events (:class:`TimedKernel`);
5. **kernels**: the "sum of the local attention steps": our ring's from the no-transfer pass (per
   repetition the sum of a rank's kernel times, median), PyTorch's from each distinct step shape of
   the plan timed alone with SDPA and summed over the steps; the slowest rank's sum is
   ``kernels_ms`` and ``hidden_ratio = ring_ms / kernels_ms``;
6. **one GPU**: the same implementation without a ring at S = T (the same per-GPU share of tokens),
   timed on every rank's GPU at once (all GPUs busy, as during the ring); their median is
   ``single_gpu_ms``; ``efficiency = tflops_per_gpu / single_gpu_tflops``.

TFLOP/s count only unmasked scores (causal: S(S+1)/2 per head); the ring's per-GPU figure divides
the whole sequence's FLOPs by N. A failure on one rank that leaves the others waiting in a
collective surfaces as the process group's timeout.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.distributed as dist
import torch.nn.functional as F

from common.contract.api import attention
from common.contract.problem import Problem, dtype_name
from common.contract.registry import get
from common.distributed import zigzag
from common.distributed.check import ChunkedInputs, RowCheck, check_rows, sample_rows
from common.distributed.ring import registry_kernel, ring_attention, step_problems
from common.measure.timing import HIGH_QUANTILE, LOW_QUANTILE, tflops

# PyTorch's context_parallel: the SDPA backends its ring dispatches (no CPU path) and rotate methods
# that use only plain NCCL collectives (all-to-all, all-gather).
TORCH_CP_BACKENDS = ("cudnn", "flash", "efficient")
TORCH_CP_ROTATE = ("alltoall", "allgather")
STATUSES = ("ok", "wrong", "failed", "oom", "skipped")
BAD_STATUSES = ("wrong", "failed", "oom")


@dataclass(frozen=True)
class Ranks:
    """The launch as one row's measurement sees it."""

    rank: int
    world_size: int
    device: torch.device
    # A gloo group: barriers and gathered results travel on the CPU, never as GPU collectives.
    control: dist.ProcessGroup
    # The DeviceMesh PyTorch's context_parallel needs (None on CPUs).
    mesh: object | None = None


@dataclass(frozen=True)
class SweepPoint:
    """One shape of the sweep: T tokens per GPU of one sequence of N x T tokens."""

    tokens_per_gpu: int
    batch: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    causal: bool

    def problem(self, seqlen: int) -> Problem:
        return Problem(
            self.batch, self.heads, seqlen, seqlen, self.head_dim, dtype=self.dtype, causal=self.causal,
            kv_heads=self.kv_heads,
        )  # fmt: skip

    def full(self, world_size: int) -> Problem:
        """The whole sequence, S = N x T."""
        return self.problem(self.tokens_per_gpu * world_size)

    def single(self) -> Problem:
        """One GPU's share, S = T: the baseline's problem."""
        return self.problem(self.tokens_per_gpu)


@dataclass(frozen=True)
class Options:
    check_rows: int = 32
    target_ms: float = 2000.0
    min_reps: int = 3
    max_reps: int = 20
    seed: int = 0
    rotate: str = "alltoall"
    # Our ring: issue each step's transfer before its kernel (``ring_attention(transfer_first=True)``).
    transfer_first: bool = False


@dataclass
class CpRow:
    """One CSV row (``CP_COLUMNS``): times in ms, TFLOP/s per GPU, errors the worst over ranks."""

    method: str
    impl: str
    gpus: int
    tokens_per_gpu: int
    seqlen: int
    batch: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str
    causal: bool
    status: str = "ok"
    reason: str = ""
    ring_ms: float = math.nan
    ring_ms_p20: float = math.nan
    ring_ms_p80: float = math.nan
    reps: int = 0
    tflops_per_gpu: float = math.nan
    single_gpu_ms: float = math.nan
    single_gpu_tflops: float = math.nan
    single_gpu_tflops_min: float = math.nan
    single_gpu_tflops_max: float = math.nan
    efficiency: float = math.nan
    kernels_ms: float = math.nan
    hidden_ratio: float = math.nan
    compute_only_ms: float = math.nan
    kv_bytes_per_step: int = 0
    rows_checked: int = 0
    max_abs_err: float = math.nan
    rel_l2_err: float = math.nan
    sdpa_rel_l2_err: float = math.nan
    lse_bound_ratio: float = math.nan
    rotate: str = ""
    device: str = ""
    extra: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")

    def record(self) -> dict:
        """The CSV record (every column but ``extra``)."""
        return {name: getattr(self, name) for name in CP_COLUMNS}


CP_COLUMNS = tuple(name for name in CpRow.__dataclass_fields__ if name != "extra")


def blank_row(method: str, impl: str, point: SweepPoint, ranks: Ranks) -> CpRow:
    element = torch.empty((), dtype=point.dtype).element_size()
    kv_bytes = 2 * point.batch * point.kv_heads * point.tokens_per_gpu * point.head_dim * element
    return CpRow(
        method, impl, ranks.world_size, point.tokens_per_gpu, point.tokens_per_gpu * ranks.world_size, point.batch,
        point.heads, point.kv_heads, point.head_dim, dtype_name(point.dtype), point.causal,
        kv_bytes_per_step=kv_bytes, device=_device_name(ranks.device),
    )  # fmt: skip


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


# ----------------------------------------------------------------------------------------------
# Timing across ranks
# ----------------------------------------------------------------------------------------------
def gather(ranks: Ranks, value: object) -> list:
    """``value`` from every rank, in rank order, on every rank (over the gloo control group)."""
    values: list = [None] * ranks.world_size
    dist.all_gather_object(values, value, group=ranks.control)
    return values


def _time_once(fn: Callable[[], object], device: torch.device) -> float:
    if device.type != "cuda":
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def _started_together(ranks: Ranks, fn: Callable[[], object], reps: int) -> list[float]:
    """Per repetition, the slowest rank's time: every repetition starts at a barrier on an idle device."""
    local = []
    for _ in range(reps):
        dist.barrier(group=ranks.control)
        if ranks.device.type == "cuda":
            torch.cuda.synchronize(ranks.device)
        local.append(_time_once(fn, ranks.device))
    return [max(times) for times in zip(*gather(ranks, local), strict=True)]


@dataclass(frozen=True)
class Timed:
    ms: float
    ms_p20: float
    ms_p80: float
    reps: int


def _quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _timed(samples: list[float]) -> Timed:
    return Timed(
        statistics.median(samples), _quantile(samples, LOW_QUANTILE), _quantile(samples, HIGH_QUANTILE), len(samples)
    )


def time_collective(ranks: Ranks, fn: Callable[[], object], options: Options, reps: int | None = None) -> Timed:
    """Median over repetitions of the slowest rank's time. Without ``reps``: one warm-up repetition,
    then as many as fill ``options.target_ms`` within [min_reps, max_reps] (every rank agrees: the
    count comes from gathered times)."""
    if reps is None:
        first = _started_together(ranks, fn, 1)[0]
        reps = min(options.max_reps, max(options.min_reps, math.ceil(options.target_ms / max(first, 1e-3))))
    return _timed(_started_together(ranks, fn, reps))


def time_alone(fn: Callable[[], object], device: torch.device, reps: int, warm_up: bool = True) -> float:
    """Median of ``reps`` timed calls (after one warm-up call unless ``warm_up`` is False), on this
    rank alone (no collective inside)."""
    if warm_up:
        fn()
    return statistics.median(_time_once(fn, device) for _ in range(reps))


class TimedKernel:
    """A local kernel that times each of its calls (device events on a GPU, the host clock on a CPU),
    so the ring's own steps give the sum of its local attention steps without extra runs."""

    def __init__(self, kernel: Callable, device: torch.device):
        self.kernel = kernel
        self.device = device
        self.calls: list = []

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **options) -> tuple:
        if self.device.type != "cuda":
            start = time.perf_counter()
            result = self.kernel(q, k, v, **options)
            self.calls.append((time.perf_counter() - start) * 1e3)
            return result
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        result = self.kernel(q, k, v, **options)
        end.record()
        self.calls.append((start, end))
        return result

    def median_sum_ms(self, calls_per_run: int) -> float:
        """Median over runs of the summed kernel time of one run (``calls_per_run`` calls each);
        call after the runs have completed."""
        times = [call if isinstance(call, float) else call[0].elapsed_time(call[1]) for call in self.calls]
        runs = [sum(times[i : i + calls_per_run]) for i in range(0, len(times), calls_per_run)]
        return statistics.median(runs)


# ----------------------------------------------------------------------------------------------
# Shared phases: the check and the verdict over ranks
# ----------------------------------------------------------------------------------------------
def _fill_check(row: CpRow, verdicts: list[RowCheck]) -> None:
    row.rows_checked = sum(verdict.rows for verdict in verdicts)
    row.max_abs_err = max(verdict.error.max_abs_err for verdict in verdicts)
    row.rel_l2_err = max(verdict.error.rel_l2_err for verdict in verdicts)
    row.sdpa_rel_l2_err = max(verdict.sdpa_error.rel_l2_err for verdict in verdicts)
    ratios = [verdict.lse.max_bound_ratio for verdict in verdicts if verdict.lse is not None]
    row.lse_bound_ratio = max(ratios) if ratios else math.nan
    wrong = [f"rank {rank}: {verdict.reason}" for rank, verdict in enumerate(verdicts) if not verdict.ok]
    if wrong:
        row.status, row.reason = "wrong", "; ".join(wrong)


def _check(
    ranks: Ranks,
    out: torch.Tensor,
    lse: torch.Tensor | None,
    q: torch.Tensor,
    ids: tuple[int, int],
    inputs: ChunkedInputs,
    options: Options,
) -> list[RowCheck]:
    positions = zigzag.positions(ids, inputs.chunk_len, q.device)
    rows = sample_rows(q.shape[2], options.check_rows, seed=options.seed + ranks.rank)
    return gather(ranks, check_rows(out, lse, q, positions, inputs, rows))


def _finish(row: CpRow, ranks: Ranks, point: SweepPoint, ring: Timed, kernels_ms: float, single_ms: list[float]):
    full_flops = point.full(ranks.world_size).flops
    single_flops = point.single().flops
    row.ring_ms, row.ring_ms_p20, row.ring_ms_p80, row.reps = ring.ms, ring.ms_p20, ring.ms_p80, ring.reps
    row.tflops_per_gpu = tflops(full_flops, ring.ms) / ranks.world_size
    row.kernels_ms = kernels_ms
    row.hidden_ratio = ring.ms / kernels_ms
    row.single_gpu_ms = statistics.median(single_ms)
    row.single_gpu_tflops = tflops(single_flops, row.single_gpu_ms)
    row.single_gpu_tflops_min = tflops(single_flops, max(single_ms))
    row.single_gpu_tflops_max = tflops(single_flops, min(single_ms))
    row.efficiency = row.tflops_per_gpu / row.single_gpu_tflops


def _step_counts(ranks: Ranks, causal: bool) -> Counter:
    """This rank's distinct step plans and how many steps each."""
    return Counter(zigzag.step_plan(ranks.rank, step, ranks.world_size, causal) for step in range(ranks.world_size))


def _kernels_ms(ranks: Ranks, kernel: Callable, q, k, v, causal: bool, reps: int) -> float:
    """The slowest rank's sum over its steps of each step's kernel timed alone (already warm: the
    ring ran these shapes)."""
    local_len = q.shape[2]
    total = 0.0
    for plan, count in _step_counts(ranks, causal).items():
        rows, keys = plan.query_slice(local_len), plan.key_slice(local_len)
        call = partial(kernel, q[:, :, rows], k[:, :, keys], v[:, :, keys], causal=plan.causal)
        total += count * time_alone(call, ranks.device, reps, warm_up=False)
    return max(gather(ranks, total))


def _guarded(row: CpRow, body: Callable[[], None]) -> CpRow:
    """Run a row's phases; an exception becomes the row's status (failed, or oom) and reason."""
    try:
        body()
    except torch.cuda.OutOfMemoryError as error:
        row.status, row.reason = "oom", str(error).splitlines()[0]
    except Exception as error:  # noqa: BLE001 - a row that fails is recorded and the sweep goes on
        last = traceback.extract_tb(error.__traceback__)[-1]
        where = f"{last.filename.rsplit('/', 1)[-1]}:{last.lineno}"
        row.status, row.reason = "failed", f"{type(error).__name__} at {where}: {error}"
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return row


# ----------------------------------------------------------------------------------------------
# Our ring with a registered implementation
# ----------------------------------------------------------------------------------------------
def ring_capability(impl: str, point: SweepPoint, device: torch.device) -> str:
    """'' when ``impl`` can run every step of the ring and the one-GPU baseline, else the reason."""
    if point.causal and point.tokens_per_gpu % 2:
        return f"zig-zag shards need an even number of tokens per GPU, got {point.tokens_per_gpu}"
    try:
        implementation = get(impl)
    except ValueError as error:
        return str(error)
    local = point.problem(point.tokens_per_gpu).with_(return_lse=True)
    for problem in [*step_problems(local), point.single()]:
        ok, reason = implementation.check(problem, device)
        if not ok:
            return reason
    return ""


def measure_ring(ranks: Ranks, impl: str, point: SweepPoint, options: Options) -> CpRow:
    """Our ring with ``impl`` as the local kernel: checked, timed with and without transfers, its
    steps' kernels alone, and ``impl`` on one GPU at the same tokens per GPU."""
    row = blank_row("ring", impl, point, ranks)
    reason = ring_capability(impl, point, ranks.device)
    if reason:
        row.status, row.reason = "skipped", reason
        return row

    def body() -> None:
        inputs = ChunkedInputs(point.full(ranks.world_size), 2 * ranks.world_size, ranks.device, options.seed)
        ids = zigzag.chunk_ids(ranks.rank, ranks.world_size)
        q, k, v = (inputs.local(name, ids) for name in ("q", "k", "v"))
        ring = partial(ring_attention, q, k, v, causal=point.causal, impl=impl, transfer_first=options.transfer_first)
        out, lse = ring()
        _fill_check(row, _check(ranks, out, lse, q, ids, inputs, options))
        del out, lse
        timed = time_collective(ranks, ring, options)
        steps = TimedKernel(registry_kernel(impl), ranks.device)
        no_transfer = partial(
            ring_attention, q, k, v, causal=point.causal, impl=steps, communicate=False,
            transfer_first=options.transfer_first,
        )  # fmt: skip
        row.compute_only_ms = time_collective(ranks, no_transfer, options, timed.reps).ms
        kernels = max(gather(ranks, steps.median_sum_ms(ranks.world_size)))
        del q, k, v
        single = ChunkedInputs(point.single(), 1, ranks.device, options.seed)
        q1, k1, v1 = (single.full(name) for name in ("q", "k", "v"))
        alone = time_alone(partial(attention, q1, k1, v1, causal=point.causal, impl=impl), ranks.device, timed.reps)
        _finish(row, ranks, point, timed, kernels, gather(ranks, alone))

    return _guarded(row, body)


# ----------------------------------------------------------------------------------------------
# PyTorch's context_parallel with an SDPA backend
# ----------------------------------------------------------------------------------------------
def _sdpa_call(point: SweepPoint, backend: str) -> Callable:
    """F.scaled_dot_product_attention restricted to one backend (looked up at call time, so inside
    ``context_parallel`` it is PyTorch's patched, ring-dispatching version)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}  # fmt: skip
    gqa = {"enable_gqa": True} if point.kv_heads != point.heads else {}

    def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool) -> torch.Tensor:
        with sdpa_kernel(backends[backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=point.single().scale, **gqa)

    return call


def chunks_of(local_positions: torch.Tensor, chunk_len: int) -> tuple[int, int]:
    """The two chunk ids a rank's token positions are made of; refuses any other layout."""
    first, second = (int(local_positions[i * chunk_len]) // chunk_len for i in range(2))
    expected = zigzag.positions((first, second), chunk_len, local_positions.device)
    if local_positions.numel() != 2 * chunk_len or not torch.equal(local_positions, expected):
        raise ValueError(f"the local tokens are not two whole chunks of {chunk_len}: {local_positions[:8].tolist()}...")
    return first, second


@contextlib.contextmanager
def torch_cp_shards(mesh, causal: bool, rotate: str, seqlen: int, chunk_len: int, device: torch.device):
    """Enter PyTorch's ``context_parallel`` for one sequence of ``seqlen`` tokens; yields the ids of the
    two chunks (of ``chunk_len``) this rank holds, which is how its q, k, v are then drawn.

    PyTorch shards the buffers it is given: here the token positions, so they tell where each rank's
    tokens lie (head-tail, i.e. zig-zag, load balancing when causal; contiguous otherwise: it refuses
    load balancing without a mask). Inside, ``F.scaled_dot_product_attention`` is PyTorch's ring.
    """
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import _cp_options, set_rotate_method

    _cp_options.enable_load_balance = causal
    set_rotate_method(rotate)
    positions = torch.arange(seqlen, device=device).view(1, 1, -1).clone()
    plain_sdpa = F.scaled_dot_product_attention
    try:
        with context_parallel(mesh, buffers=[positions], buffer_seq_dims=[2]):
            yield chunks_of(positions.view(-1).clone(), chunk_len)
    finally:
        # Some releases (before 2.14) leave SDPA patched when the body raises: every later SDPA call,
        # the checks' yardstick included, would then go to the ring.
        F.scaled_dot_product_attention = plain_sdpa


def measure_torch_cp(ranks: Ranks, backend: str, point: SweepPoint, options: Options) -> CpRow:
    """PyTorch's ``context_parallel`` (SDPA with ``backend``; head-tail load balancing when causal,
    none otherwise; K/V rotated by ``options.rotate``): checked, timed, its steps' SDPA calls alone,
    and SDPA with ``backend`` on one GPU at the same tokens per GPU."""
    row = blank_row("torch-cp", f"sdpa/{backend}", point, ranks)
    row.rotate = options.rotate
    if ranks.device.type != "cuda" or ranks.mesh is None:
        row.status = "skipped"
        row.reason = "PyTorch's context_parallel runs SDPA's CUDA kernels (flash, efficient, cuDNN): no CPU path"
        return row

    def body() -> None:
        full = point.full(ranks.world_size)
        inputs = ChunkedInputs(full, 2 * ranks.world_size, ranks.device, options.seed)
        call = _sdpa_call(point, backend)
        layout = (ranks.mesh, point.causal, options.rotate, full.seqlen_q, inputs.chunk_len, ranks.device)
        with torch_cp_shards(*layout) as ids:
            q, k, v = (inputs.local(name, ids) for name in ("q", "k", "v"))
            cp = partial(call, q, k, v, causal=point.causal)
            out = cp()
            timed = time_collective(ranks, cp, options)
        _fill_check(row, _check(ranks, out, None, q, ids, inputs, options))
        del out
        kernels = _kernels_ms(ranks, call, q, k, v, point.causal, timed.reps)
        del q, k, v
        single = ChunkedInputs(point.single(), 1, ranks.device, options.seed)
        q1, k1, v1 = (single.full(name) for name in ("q", "k", "v"))
        alone = time_alone(partial(call, q1, k1, v1, causal=point.causal), ranks.device, timed.reps)
        _finish(row, ranks, point, timed, kernels, gather(ranks, alone))

    return _guarded(row, body)
