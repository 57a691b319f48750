"""Processes of the ring-attention tests: each runs a list of cases over gloo (CPU) or NCCL (GPU) and
writes every case's verdict to ``<out>/rank<r>.json``. Imported by name in spawned children.

A case names its local kernel (``torch``: :func:`torch_kernel`, fast; or a registered implementation),
the problem, and optionally a planted bug, which the case installs in this process only:

* ``merge_twice``: the partial result of step 1 is merged twice;
* ``skip_shard``: the partial result of the last step is never merged (that shard is skipped);
* ``contiguous_layout``: the inputs are sharded contiguously (rank r holds chunks 2r, 2r+1) while the
  ring assumes zig-zag;
* ``swapped_chunks``: each rank stores its two zig-zag chunks in the wrong order;
* ``reversed_ring``: the step plan believes shards travel the other way round the ring;
* ``no_arrival_wait``: a received shard is read without waiting for it to arrive (on CPUs the
  transfer is waited for after the read);
* ``late_receive_buffer``: each receive slot is allocated at its first use, in the middle of the ring
  (the code before the 4-GPU fix: memory the compute stream freed but still uses can be handed to a
  receive that NCCL writes on another stream; no effect on CPUs, whose kernels are synchronous).

``jitter_ms`` runs the case with ``ring.Jitter`` (random pauses at every ordering point, seeded per
rank), so that a missing wait shows.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from common.contract.problem import DTYPE_NAMES, Problem
from common.distributed import ring, zigzag
from common.distributed.check import ChunkedInputs, check_rows, sample_rows
from common.distributed.teardown import leaving_process_group

TORCH_CP_LAYOUT = "torch_cp_layout"
BUGS = (
    "merge_twice",
    "skip_shard",
    "contiguous_layout",
    "swapped_chunks",
    "reversed_ring",
    "no_arrival_wait",
    "late_receive_buffer",
)


@dataclass(frozen=True)
class Case:
    name: str
    kernel: str = "torch"
    batch: int = 1
    heads: int = 2
    kv_heads: int = 2
    local_len: int = 16
    head_dim: int = 16
    dtype: str = "fp32"
    causal: bool = True
    bug: str | None = None
    # Sampled rows per rank (0: every row).
    rows: int = 0
    communicate: bool = True
    # Up to this many ms of random pause at each ordering point of the ring (0: none).
    jitter_ms: float = 0.0
    # Issue each step's transfer before its kernel (ring_attention's transfer_first).
    transfer_first: bool = False
    # Where the jitter pauses (ring.JITTER_POINTS: all of them by default).
    jitter_points: tuple[str, ...] = ring.JITTER_POINTS


def torch_kernel(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, softmax_scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention with its natural-log LSE in torch ops (fp32 math): a fast local kernel for CPU tests.
    O stays fp32, as the ring allows: each partial rounded to bf16 before the merge would add one
    rounding per step to the final one (twice SDPA's max error on 16-key rows, seen at 4 ranks)."""
    group = q.shape[1] // k.shape[1]
    k32 = k.float().repeat_interleave(group, dim=1)
    v32 = v.float().repeat_interleave(group, dim=1)
    scores = (q.float() @ k32.transpose(-1, -2)) * softmax_scale
    if causal:
        rows, cols = scores.shape[-2:]
        scores.masked_fill_(torch.ones(rows, cols, dtype=torch.bool, device=q.device).triu(1), -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.softmax(scores, dim=-1) @ v32
    return out, lse


def _install(bug: str | None, monkey: list) -> None:
    """Plant ``bug`` in this process; ``monkey`` collects (object, name, original) to undo it."""
    if bug is None:
        return
    if bug not in BUGS:
        raise ValueError(f"unknown bug {bug!r}; known: {BUGS}")
    if bug in ("merge_twice", "skip_shard"):
        original = ring.merge_partial_
        calls = {"n": 0}

        def planted(out, lse, block_out, block_lse) -> None:
            calls["n"] += 1
            step = calls["n"] - 1
            if bug == "skip_shard" and step == dist.get_world_size() - 1:
                return
            original(out, lse, block_out, block_lse)
            if bug == "merge_twice" and step == 1:
                original(out, lse, block_out, block_lse)

        monkey.append((ring, "merge_partial_", original))
        ring.merge_partial_ = planted
    elif bug == "reversed_ring":
        original = zigzag.source_rank
        monkey.append((zigzag, "source_rank", original))
        zigzag.source_rank = lambda rank, step, world_size: (rank + step) % world_size
    elif bug == "no_arrival_wait":
        # The shard is read at once; the transfer is waited for only after the read (on CPUs a
        # transfer never waited for would leave gloo's queue unmatched and hang the group). The receive
        # slots start as NaN: memory the allocator hands back can hold the very shard that is on its way
        # (an earlier case with the same inputs), which would hide the early read.
        original_done = ring.KVExchange.done_reading
        original_init = ring.KVExchange.__init__

        def poisoned(self, *args, **kwargs) -> None:
            original_init(self, *args, **kwargs)
            for slot in self.slots[1:]:
                for tensor in slot:
                    tensor.fill_(math.nan)

        def read_at_once(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
            return self.slots[self.slot(step) if self.communicate else 0]

        def wait_late(self, step: int) -> None:
            for work in self.pending:
                work.wait()
            original_done(self, step)

        monkey += [
            (ring.KVExchange, "shard", ring.KVExchange.shard),
            (ring.KVExchange, "done_reading", original_done),
            (ring.KVExchange, "__init__", original_init),
        ]
        ring.KVExchange.shard = read_at_once
        ring.KVExchange.done_reading = wait_late
        ring.KVExchange.__init__ = poisoned
    elif bug == "late_receive_buffer":
        original = ring.KVExchange.pass_on

        def late(self, step: int) -> None:
            target = self.slot(step + 1)
            if self.communicate and step < min(2, self.world_size - 1):
                k, v = self.slots[target]
                self.slots[target] = (torch.empty_like(k), torch.empty_like(v))
            original(self, step)

        monkey.append((ring.KVExchange, "pass_on", original))
        ring.KVExchange.pass_on = late


def _layout(case: Case, rank: int, world_size: int) -> tuple[int, int]:
    if case.bug == "contiguous_layout":
        return zigzag.contiguous_chunk_ids(rank, world_size)
    first, second = zigzag.chunk_ids(rank, world_size)
    return (second, first) if case.bug == "swapped_chunks" else (first, second)


def _jitter(case: Case, rank: int) -> ring.Jitter | None:
    """The case's jitter, seeded per rank (None without one)."""
    if not case.jitter_ms:
        return None
    return ring.Jitter(seed=1000 * rank + len(case.name), max_ms=case.jitter_ms, points=tuple(case.jitter_points))


def run_case(case: Case, rank: int, world_size: int, device: torch.device) -> dict:
    """Ring attention on this rank's shard, judged on its rows against float64; never raises."""
    problem = Problem(
        case.batch,
        case.heads,
        case.local_len * world_size,
        case.local_len * world_size,
        case.head_dim,
        dtype=DTYPE_NAMES[case.dtype],
        causal=case.causal,
        kv_heads=case.kv_heads,
    )
    inputs = ChunkedInputs(problem, 2 * world_size, device, seed=7)
    ids = _layout(case, rank, world_size)
    q, k, v = (inputs.local(name, ids) for name in ("q", "k", "v"))
    kernel = torch_kernel if case.kernel == "torch" else case.kernel
    monkey: list = []
    try:
        _install(case.bug, monkey)
        jitter = _jitter(case, rank)
        out, lse = ring.ring_attention(
            q, k, v, causal=case.causal, impl=kernel, communicate=case.communicate,
            transfer_first=case.transfer_first, jitter=jitter,
        )  # fmt: skip
    except Exception as error:  # noqa: BLE001 - the verdict says what failed
        return {"ok": False, "error": f"{type(error).__name__}: {error}"}
    finally:
        for owner, name, original in monkey:
            setattr(owner, name, original)
    if not case.communicate:
        return _local_only_verdict(case, q, k, v, out, lse, world_size)
    positions = zigzag.positions(ids, inputs.chunk_len, device)
    rows = sample_rows(q.shape[2], case.rows or q.shape[2], seed=rank)
    verdict = check_rows(out, lse, q, positions, inputs, rows)
    return {"ok": verdict.ok, "summary": verdict.summary()}


def _local_only_verdict(case: Case, q, k, v, out, lse, world_size: int) -> dict:
    """Without transfers every step attends to the local shard, so (non-causal) the result is the
    local attention and its LSE plus ln(world size): the same block merged world-size times."""
    local_out, local_lse = torch_kernel(q, k, v, causal=False, softmax_scale=1 / math.sqrt(case.head_dim))
    ok = torch.allclose(out.float(), local_out.float(), atol=1e-5) and torch.allclose(
        lse, local_lse + math.log(world_size), atol=1e-5
    )
    return {"ok": bool(ok), "summary": f"local-only ring equals local attention: {bool(ok)}"}


def torch_cp_layout(world_size: int, device: torch.device) -> dict[str, list[int]]:
    """The chunk ids PyTorch's context_parallel gives this rank (the tools' ``torch_cp_shards``),
    causal and not, for a sequence of 2N chunks of 3 tokens."""
    from torch.distributed.device_mesh import init_device_mesh

    from common.measure.context_parallel import torch_cp_shards

    layout: dict = {}
    try:
        mesh = init_device_mesh(device.type, (world_size,))
        for causal in (True, False):
            with torch_cp_shards(mesh, causal, "alltoall", 6 * world_size, 3, device) as ids:
                layout["causal" if causal else "full"] = list(ids)
    except Exception as error:  # noqa: BLE001 - the layout test reports it; the ring cases stand
        layout["error"] = f"{type(error).__name__}: {error}"
    return layout


def worker(rank: int, world_size: int, backend: str, store_path: str, cases: list[dict], out_dir: str) -> None:
    """One process: join the group, run every case, write ``rank<r>.json``."""
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size)
    with leaving_process_group():
        results = {case["name"]: run_case(Case(**case), rank, world_size, device) for case in cases}
        results[TORCH_CP_LAYOUT] = torch_cp_layout(world_size, device)
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))


def spawn_cases(cases: list[Case], world_size: int, backend: str, tmp: Path) -> dict[str, list[dict]]:
    """Run ``cases`` in ``world_size`` spawned processes; per case, the verdict of every rank (and
    under ``TORCH_CP_LAYOUT`` each rank's chunks from PyTorch's context_parallel)."""
    import torch.multiprocessing as mp

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    tmp.mkdir(parents=True, exist_ok=True)
    payload = [asdict(case) for case in cases]
    mp.spawn(worker, args=(world_size, backend, str(tmp / "store"), payload, str(tmp)), nprocs=world_size, join=True)
    per_rank = [json.loads((tmp / f"rank{rank}.json").read_text()) for rank in range(world_size)]
    names = [case.name for case in cases] + [TORCH_CP_LAYOUT]
    return {name: [results[name] for results in per_rank] for name in names}
