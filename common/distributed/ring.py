"""Ring attention (context parallelism) on ``torch.distributed``, with any implementation that returns the LSE.

Each rank holds one shard of the sequence: its queries, keys and values, zig-zag sharded when
causal (``common.distributed.zigzag``). The K/V shards travel around the ring one hop per step, so
after N steps (N = world size) every rank's queries have met every key. Step s on rank r:

1. make sure the shard of step s has arrived (the compute stream waits for its "ready" event);
2. attend with the local kernel to the part the zig-zag plan says (``zigzag.step_plan``: own shard
   causal at step 0; then all queries against the first half of the keys, or the second half of
   the queries against all keys), which returns a partial (O, LSE);
3. pass the shard on: send it to rank r+1 and receive rank r-1's into the other buffer
   (``torch.distributed.batch_isend_irecv`` issued on a communication stream), for step s+1;
4. merge the partial result into the running fp32 (O, LSE) of those query rows (``merge_partial_``).

Kernels launch asynchronously, so transfer s+1 (3) runs while attention s (2) computes; issuing it
after the launch keeps that true even where waiting on a transfer blocks the host. Only a transfer
longer than a step's attention shows in the ring's time.

**Data movement.** K and V go with their own Hkv heads (GQA sends only the KV heads) in the input
dtype, point-to-point from rank r to rank r+1: NCCL between GPUs, gloo between CPU processes, the
processes started by ``torchrun`` (no launcher or transport of our own). Two receive buffers
alternate, both allocated before the first step; the caller's own K and V serve as the first shard
and are never written.

**Streams and events (CUDA).** The caller's stream computes (kernels and merges). The
communication stream issues each P2P batch only after the events that say the caller's K/V and the
receive buffers are ready (first batch) and the compute stream has finished reading the buffer
about to be overwritten, then waits for the batch to complete and records "shard ready", which the
compute stream waits for before reading that shard. Nothing is read before it has arrived, nothing
overwritten while it is read, and the host does not block. On CPUs (gloo) the same steps wait on
the requests instead. No buffer that a transfer writes is allocated once the kernels have started:
the caching allocator would hand out memory the compute stream freed but may still be using (see
``KVExchange``), which is how the ring was wrong on 4 GPUs and right on 2 (docs/perf-log.md).
``Jitter`` pauses the streams at random in the tests, so a missing wait shows.

A local kernel that keeps every SM busy until it ends (a persistent grid) leaves NCCL's transfer
kernels no SM to start on, so transfer s+1 then waits for attention s to finish: the tools' no-transfer
timing shows what that costs.

**The merge.** With natural-log LSEs L_a, L_b (log of each part's softmax denominator, scale
included): L = logaddexp(L_a, L_b) and O = exp(L_a - L) O_a + exp(L_b - L) O_b, each partial output
renormalised to the union of both key sets, in fp32. A row that has seen no key has L = -inf and
O = 0, and the merge keeps it exactly so (never NaN) when both sides are empty.

**Limits.** Forward only. q, k and v have the same local length on every rank (even when causal),
zig-zag sharded when causal; top-left causal or none; no per-sequence key lengths. Communication is
exposed when one step's attention is shorter than the transfer of one K/V shard.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from functools import partial

import torch
import torch.distributed as dist

from common.contract.api import attention
from common.contract.problem import Problem
from common.contract.registry import get
from common.contract.validation import validate_attention_inputs
from common.distributed import zigzag

# kernel(q, k, v, *, causal, softmax_scale) -> (O in q's dtype or fp32, LSE fp32 in natural-log units).
# An fp32 O is merged without its rounding to q's dtype: the output is rounded once, at the end.
LocalKernel = Callable[..., tuple[torch.Tensor, torch.Tensor]]
RING_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Which torch.distributed backend moves tensors of which device type.
BACKEND_DEVICE = {"nccl": "cuda", "gloo": "cpu"}

# Where ``Jitter`` may pause: before a local kernel, before a transfer is issued, before it is declared arrived.
JITTER_POINTS = ("kernel", "merge", "send", "receive")
# torch.cuda._sleep spins for a number of clock cycles: about 1.5-2 GHz on the GPUs here (only the
# order of magnitude matters for a random delay).
SLEEP_CYCLES_PER_MS = 1_500_000

_COMM_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


# ----------------------------------------------------------------------------------------------
# The local kernel and the merge
# ----------------------------------------------------------------------------------------------
def registry_kernel(impl: str) -> LocalKernel:
    """The registered implementation ``impl`` as a local kernel: ``common.attention`` with
    ``return_lse=True``. An unknown name raises ValueError listing the valid ones."""
    get(impl)
    return partial(_attention_with_lse, impl)


def _attention_with_lse(
    impl: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, softmax_scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return attention(q, k, v, causal=causal, softmax_scale=softmax_scale, impl=impl, return_lse=True)


def merge_partial_(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor) -> None:
    """Merge a partial result (``block_out`` (..., S, D), ``block_lse`` (..., S)) into the running fp32
    ``out`` and ``lse`` in place (views are fine): attention over the union of both key sets."""
    merged = torch.logaddexp(lse, block_lse)
    # Rows that have seen no key on either side stay -inf: subtract 0 there, so both weights are 0.
    reference = torch.where(torch.isfinite(merged), merged, torch.zeros_like(merged))
    out.mul_(torch.exp(lse - reference).unsqueeze(-1))
    out.addcmul_(block_out, torch.exp(block_lse - reference).unsqueeze(-1))
    lse.copy_(merged)


# ----------------------------------------------------------------------------------------------
# The K/V shards in flight
# ----------------------------------------------------------------------------------------------
def _comm_stream(device: torch.device) -> torch.cuda.Stream:
    if device not in _COMM_STREAMS:
        _COMM_STREAMS[device] = torch.cuda.Stream(device)
    return _COMM_STREAMS[device]


class Jitter:
    """Random delays at the ring's ordering points, so that a missing wait shows (a testing hook).

    Before each local kernel (``"kernel"``), before each merge of a partial result (``"merge"``: the partial
    output stays in use until then), before each transfer is issued (``"send"``) and before a transfer is
    declared arrived (``"receive"``), a random pause of up to ``max_ms``: on a GPU a
    ``torch.cuda._sleep`` kernel on the stream of that point (compute, or communication), so the
    streams drift apart while the host runs ahead; on CPUs a host sleep. Without a missing wait the
    result is the same with any delays; the ring tests run every case with jitter.
    """

    def __init__(self, seed: int, max_ms: float = 2.0, points: tuple[str, ...] = JITTER_POINTS):
        unknown = set(points) - set(JITTER_POINTS)
        if unknown or max_ms < 0:
            raise ValueError(f"jitter points must be among {JITTER_POINTS} and max_ms >= 0, got {points}, {max_ms}")
        self.max_ms = max_ms
        self.points = points
        self.random = random.Random(seed)

    def delay(self, point: str, stream: torch.cuda.Stream | None) -> None:
        """Pause at ``point``: on ``stream`` (a GPU stream) or, when it is None, on the host."""
        if point not in self.points:
            return
        ms = self.random.uniform(0, self.max_ms)
        if stream is None:
            time.sleep(ms / 1e3)
            return
        with torch.cuda.stream(stream):
            torch.cuda._sleep(int(ms * SLEEP_CYCLES_PER_MS))


class KVExchange:
    """Double-buffered K/V shards around the ring: the one in hand and the one arriving.

    Slot 0 is the caller's shard (read only); steps 1, 3, 5... receive into slot 1 and steps 2, 4...
    into slot 2. ``communicate=False`` keeps the caller's shard at every step (the same kernels and
    merges without any transfer: how the tools measure what the ring costs beyond its computation).
    """

    def __init__(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        group: dist.ProcessGroup | None,
        communicate: bool,
        jitter: Jitter | None = None,
    ):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.communicate = communicate and self.world_size > 1
        self.cuda = k.is_cuda
        self.jitter = jitter
        self.pending: list[dist.Work] = []
        # Both receive slots are allocated now, before any step's kernel: see ``buffers_ready``.
        receive = [(torch.empty_like(k), torch.empty_like(v)) for _ in range(2 if self.communicate else 0)]
        self.slots = [(k, v), *receive]
        if self.cuda:
            self.compute = torch.cuda.current_stream(k.device)
            self.comm = _comm_stream(k.device)
            self.ready = [torch.cuda.Event() for _ in self.slots]
            self.free: list[torch.cuda.Event | None] = [None] * len(self.slots)
            # The first transfer waits for this point of the compute stream: the caller's K and V were
            # written before it, and so was every earlier use of the receive slots' memory. The caching
            # allocator hands a stream memory that the same stream freed, trusting stream order; NCCL
            # writes a receive on another stream. A slot allocated in the middle of the ring (as before
            # this was fixed) could be the previous step's partial output, freed by the host while its
            # merge was still queued: the receive overwrote it first (wrong answers on 4 GPUs).
            self.buffers_ready = torch.cuda.Event()
            self.buffers_ready.record(self.compute)

    def peer(self, group_rank: int) -> int:
        """The global rank of ``group_rank`` (mod the world size) in this exchange's group."""
        group_rank %= self.world_size
        return group_rank if self.group is None else dist.get_global_rank(self.group, group_rank)

    @staticmethod
    def slot(step: int) -> int:
        return 0 if step == 0 else 1 + (step + 1) % 2

    def delay(self, point: str) -> None:
        """The jitter's pause at ``point`` (none without jitter): kernels wait on the compute stream,
        transfers on the communication stream, everything on the host on CPUs."""
        if self.jitter is None:
            return
        stream = None if not self.cuda else self.compute if point in ("kernel", "merge") else self.comm
        self.jitter.delay(point, stream)

    def shard(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The K/V of ``step``, once it has arrived (the compute stream waits; the host does not)."""
        if not self.communicate or step == 0:
            return self.slots[0]
        if self.cuda:
            self.compute.wait_event(self.ready[self.slot(step)])
        else:
            self.delay("receive")
            for work in self.pending:
                work.wait()
        return self.slots[self.slot(step)]

    def pass_on(self, step: int) -> None:
        """Send the shard of ``step`` to the next rank and receive the previous rank's for step + 1."""
        if not self.communicate or step == self.world_size - 1:
            return
        send = self.slots[self.slot(step)]
        target = self.slot(step + 1)
        receive = self.slots[target]
        nxt, prev = self.peer(self.rank + 1), self.peer(self.rank - 1)
        ops = [
            dist.P2POp(dist.isend, send[0], nxt, self.group),
            dist.P2POp(dist.isend, send[1], nxt, self.group),
            dist.P2POp(dist.irecv, receive[0], prev, self.group),
            dist.P2POp(dist.irecv, receive[1], prev, self.group),
        ]
        if not self.cuda:
            self.delay("send")
            self.pending = dist.batch_isend_irecv(ops)
            return
        if step == 0:
            self.comm.wait_event(self.buffers_ready)
        if self.free[target] is not None:
            self.comm.wait_event(self.free[target])
        self.delay("send")
        with torch.cuda.stream(self.comm):
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        self.delay("receive")
        self.ready[target].record(self.comm)

    def done_reading(self, step: int) -> None:
        """The compute stream has enqueued its last read of the shard of ``step``."""
        if self.cuda and self.communicate:
            event = torch.cuda.Event()
            event.record(self.compute)
            self.free[self.slot(step)] = event


# ----------------------------------------------------------------------------------------------
# Validation and the ring
# ----------------------------------------------------------------------------------------------
def _backend_for(device_type: str, group: dist.ProcessGroup | None) -> str | None:
    """The group's backend for tensors of ``device_type`` ("nccl", "gloo"), None when it has none:
    a plain backend ("nccl") or a per-device list ("cpu:gloo,cuda:nccl")."""
    text = str(dist.get_backend(group))
    if ":" in text:
        return dict(item.split(":", 1) for item in text.split(",")).get(device_type)
    return text if BACKEND_DEVICE.get(text) == device_type else None


def _check_group(q: torch.Tensor, group: dist.ProcessGroup | None) -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "ring_attention needs torch.distributed initialised: launch with torchrun and call "
            "torch.distributed.init_process_group first"
        )
    backend = _backend_for(q.device.type, group)
    if backend is None or BACKEND_DEVICE.get(backend) != q.device.type:
        raise ValueError(
            f"ring_attention moves {q.device.type} tensors with "
            f"{'NCCL' if q.is_cuda else 'gloo'}, but the process group's backend is {dist.get_backend(group)!r}"
        )
    if q.is_cuda and q.device.index != torch.cuda.current_device():
        raise ValueError(
            f"tensors must be on this rank's current CUDA device (cuda:{torch.cuda.current_device()}), got "
            f"{q.device}; call torch.cuda.set_device(local_rank) before init_process_group"
        )


def _check_inputs(q: object, k: object, v: object, causal: object, softmax_scale: object) -> Problem:
    """The local problem's checks (types, shapes, GQA, dtype, scale) plus the ring's own."""
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if isinstance(tensor, torch.Tensor) and tensor.requires_grad and torch.is_grad_enabled():
            raise NotImplementedError(
                f"ring_attention is forward-only, but {name} requires grad; call it under torch.no_grad()"
            )
    problem = validate_attention_inputs(
        q,
        k,
        v,
        causal=causal,
        softmax_scale=softmax_scale,
        return_lse=True,
        allow_gqa=True,
        dtypes=RING_DTYPES,
        device_types=tuple(BACKEND_DEVICE.values()),
    )
    if problem.seqlen_q != problem.seqlen_k:
        raise ValueError(
            f"ring attention needs q, k and v of the same local length, got q {problem.seqlen_q} and "
            f"k {problem.seqlen_k} tokens"
        )
    if causal and problem.seqlen_q % 2:
        raise ValueError(
            f"causal ring attention takes zig-zag shards (two chunks of equal length), so the local length "
            f"must be even, got {problem.seqlen_q}"
        )
    return problem


def step_problems(local: Problem) -> list[Problem]:
    """The distinct local problems of a ring's steps: the local shard (causal or not), and with a
    causal mask also all queries against half the keys and half the queries against all keys."""
    if not local.causal:
        return [local]
    half = local.seqlen_q // 2
    return [local, local.with_(causal=False, seqlen_k=half), local.with_(causal=False, seqlen_q=half)]


def _check_capability(impl: str, local: Problem, device: torch.device) -> None:
    """Refuse before any transfer when the implementation cannot run one of the ring's step shapes."""
    implementation = get(impl)
    for problem in step_problems(local):
        ok, reason = implementation.check(problem, device)
        if not ok:
            raise ValueError(f"{impl} cannot run the ring step {problem.describe()}: {reason}")


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    impl: str | LocalKernel,
    softmax_scale: float | None = None,
    group: dist.ProcessGroup | None = None,
    communicate: bool = True,
    transfer_first: bool = False,
    jitter: Jitter | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of this rank's queries over the whole sequence held by the ranks of ``group``.

    q (B, H, L, D), k and v (B, Hkv, L, D): this rank's shard of L tokens, zig-zag sharded when
    ``causal`` (``zigzag.shard``), the same L on every rank. ``impl`` is a registered implementation
    name (any that returns the LSE) or a callable ``(q, k, v, *, causal, softmax_scale) -> (O, lse)``.
    Returns (O (B, H, L, D) in q's dtype, lse (B, H, L) fp32, natural-log units) for the local rows.
    ``communicate=False`` runs the same kernels and merges on the local shard at every step without
    any transfer; its output is not the attention over the sequence (it measures the ring's cost).
    ``transfer_first`` issues each step's transfer before its kernel rather than after: the transfer's
    NCCL kernel is then queued before a persistent grid takes every SM (the tools measure both orders).
    ``jitter`` (tests) pauses at random at every ordering point: the result must not change.

    Raises RuntimeError when torch.distributed is not initialised, TypeError/ValueError for bad
    inputs (naming what was expected and given), ValueError when ``impl`` cannot run a step, and
    NotImplementedError for inputs that require grad.
    """
    if not (isinstance(impl, str) or callable(impl)):
        raise TypeError(f"impl must be an implementation name or a callable kernel, got {type(impl).__name__}")
    local = _check_inputs(q, k, v, causal, softmax_scale)
    _check_group(q, group)
    if isinstance(impl, str):
        _check_capability(impl, local, q.device)
        kernel = registry_kernel(impl)
    else:
        kernel = impl
    # P2P sends need contiguous tensors; contiguous() is free when they already are.
    exchange = KVExchange(k.contiguous(), v.contiguous(), group, communicate, jitter)
    with torch.no_grad():
        return _ring(q, causal, kernel, local.scale, exchange, transfer_first)


def _ring(
    q: torch.Tensor, causal: bool, kernel: LocalKernel, scale: float, exchange: KVExchange, transfer_first: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    local_len = q.shape[2]
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.full(q.shape[:3], -math.inf, dtype=torch.float32, device=q.device)
    for step in range(exchange.world_size):
        k_step, v_step = exchange.shard(step)
        if transfer_first:
            exchange.pass_on(step)
        plan = zigzag.step_plan(exchange.rank, step, exchange.world_size, causal)
        rows, keys = plan.query_slice(local_len), plan.key_slice(local_len)
        exchange.delay("kernel")
        block_out, block_lse = kernel(
            q[:, :, rows], k_step[:, :, keys], v_step[:, :, keys], causal=plan.causal, softmax_scale=scale
        )
        exchange.done_reading(step)
        if not transfer_first:
            exchange.pass_on(step)
        _check_block(block_out, block_lse, out[:, :, rows], q.dtype)
        exchange.delay("merge")
        merge_partial_(out[:, :, rows], lse[:, :, rows], block_out, block_lse)
    return out.to(q.dtype), lse


def _check_block(block_out: torch.Tensor, block_lse: torch.Tensor, target: torch.Tensor, dtype: torch.dtype) -> None:
    if tuple(block_out.shape) != tuple(target.shape) or tuple(block_lse.shape) != tuple(target.shape[:3]):
        raise ValueError(
            f"the local kernel must return O {tuple(target.shape)} and lse {tuple(target.shape[:3])}, got "
            f"{tuple(block_out.shape)} and {tuple(block_lse.shape)}"
        )
    if block_out.dtype not in (dtype, torch.float32):
        raise TypeError(f"the local kernel's O must be {dtype} (the inputs') or torch.float32, got {block_out.dtype}")
    if block_lse.dtype != torch.float32:
        raise TypeError(f"the local kernel's lse must be fp32 (natural-log units), got {block_lse.dtype}")
