"""The backward pass timed at issue #40's anchor shapes: each forward rung that has a backward (through
``common.attention``'s autograd) against SDPA's cuDNN and flash backends, bf16, on one GPU.

    python -m bench.backward --out results/h200/backward

Per (shape, implementation): the forward once with inputs that require grad (compile and plan outside
the timing), then ``torch.autograd.grad`` of O with a fixed dO timed alone (device events, L2 flushed,
median; ``retain_graph`` so the same graph is replayed) and forward + backward timed together. TFLOP/s of
the backward = 2.5 × the forward's FLOPs (4·B·H·Sq·Sk·D, halved when causal) / time, as the issue counts
them. Correctness is the GPU tests' business (``tests/test_backward.py``, fp64 reference, yardstick
rule); each row here also reports the relative L2 distance of its dQ, dK, dV from cuDNN's on the same
inputs, so that a wrong row stands out. A row that fails is written with its reason. Writes results.csv
under ``--out``; without a GPU it says so in one line and exits 2.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

EXIT_MISSING = 2
# (name, B, H, S, D, causal): the anchors.
SHAPES = (
    ("P1", 2, 16, 8192, 128, False),
    ("P1 causal", 2, 16, 8192, 128, True),
    ("D64 B4 H32", 4, 32, 8192, 64, False),
    ("B8 S2048 causal", 8, 16, 2048, 128, True),
)
IMPLS = ("triton/tiled", "triton/hopper", "sdpa/cudnn", "sdpa/flash")
COLUMNS = ("shape", "impl", "status", "bwd_ms", "fwd_bwd_ms", "bwd_tflops", "dq_vs_cudnn", "dk_vs_cudnn",
           "dv_vs_cudnn", "reason")  # fmt: skip


def forward_of(impl: str, causal: bool) -> Callable:
    """q, k, v -> O by ``impl``: a ladder rung through ``common.attention`` or SDPA with one backend."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from common.contract.api import attention

    if not impl.startswith("sdpa/"):
        return lambda q, k, v: attention(q, k, v, causal=causal, impl=impl)
    backend = {"sdpa/cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa/flash": SDPBackend.FLASH_ATTENTION}[impl]

    def call(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return call


def measure_row(shape: tuple, impl: str, inputs: tuple, reference: tuple | None) -> tuple[dict, tuple]:
    """The row's numbers and its (dq, dk, dv); distances from ``reference`` (cuDNN's) when given."""
    import torch

    from common.measure.timing import time_cuda

    _name, batch, heads, seqlen, head_dim, causal = shape
    q, k, v, d_out = inputs
    forward = forward_of(impl, causal)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = forward(*leaves)
    grads = torch.autograd.grad(out, leaves, d_out, retain_graph=True)
    bwd = time_cuda(lambda: torch.autograd.grad(out, leaves, d_out, retain_graph=True))
    both = time_cuda(lambda: torch.autograd.grad(forward(*leaves), leaves, d_out))
    flops = 4 * batch * heads * seqlen * seqlen * head_dim // (2 if causal else 1)
    row = {"bwd_ms": bwd.ms, "fwd_bwd_ms": both.ms, "bwd_tflops": 2.5 * flops / bwd.ms / 1e9}
    if reference is not None:
        for label, mine, theirs in zip(("dq", "dk", "dv"), grads, reference, strict=True):
            row[f"{label}_vs_cudnn"] = ((mine.float() - theirs.float()).norm() / theirs.float().norm()).item()
    return row, grads


def run(out_dir: Path, impls: Sequence[str]) -> int:
    import torch

    out_dir.mkdir(parents=True, exist_ok=True)
    failed = 0
    with (out_dir / "results.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, COLUMNS)
        writer.writeheader()
        for shape in SHAPES:
            name, batch, heads, seqlen, head_dim, _causal = shape
            generator = torch.Generator(device="cuda").manual_seed(0)
            q, k, v, d_out = (
                torch.randn(batch, heads, seqlen, head_dim, generator=generator, device="cuda", dtype=torch.bfloat16)
                for _ in range(4)
            )
            reference = None
            for impl in ("sdpa/cudnn", *[i for i in impls if i != "sdpa/cudnn"]):
                record = {"shape": name, "impl": impl, "status": "ok", "reason": ""}
                try:
                    numbers, grads = measure_row(shape, impl, (q, k, v, d_out), reference)
                    record |= numbers
                    if impl == "sdpa/cudnn":
                        reference = grads
                except Exception as error:  # noqa: BLE001 - a failed row is recorded and the sweep goes on
                    record |= {"status": "failed", "reason": f"{type(error).__name__}: {error}"[:300]}
                    failed += 1
                writer.writerow(record)
                handle.flush()
                print(" | ".join(str(record.get(column, "")) for column in COLUMNS), flush=True)
                torch.cuda.empty_cache()
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.backward", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/backward"), help="output folder")
    parser.add_argument("--impl", action="append", help=f"implementations (repeatable; default {', '.join(IMPLS)})")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("bench.backward: needs a CUDA GPU (the anchors are H200 shapes); none found", file=sys.stderr)
        return EXIT_MISSING
    return run(args.out, args.impl or IMPLS)


if __name__ == "__main__":
    sys.exit(main())
