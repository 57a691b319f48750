"""Host time of ``common.attention()`` per decode call on the CPU, with every kernel launch stubbed (issue #39).

python -m bench.host_path [--calls 200] [--rounds 5] [--impls triton/decode,cute/decode,auto] [--profile NAME]
                          [--transformers]

What a user's eager decode step costs on the host before any kernel runs: the plan key, the plan
cache, validation and dispatch where the call plans, and the rung's ``bind`` (operands, output, split
workspace, launch arguments). No GPU is needed: the tensors are CPU tensors, the Triton split kernel
(triton/decode, gluon/decode) and the CuTe compiled function (cute/decode) are replaced by no-ops, and
the device checks of the Gluon and CuTe rungs let a CPU device through (the Triton interpreter's does
already). What is left out is the launch itself (Triton's launcher, the CuTe DSL's TVM-FFI call):
``common.measure.api_overhead`` times those on a GPU.

The shape is ``results/h200/cute-tvm-ffi/api-overhead/``'s decode step (B=1 H=32 Hkv=8 Sq=1 Sk=8192
D=128), fp16 (the interpreter refuses bf16), causal bottom-right, in two paths:
  * ``same``: the same tensors again (a plan hit: key, cache, bind);
  * ``growing``: K and V one key longer at every call, as transformers' DynamicCache hands them (a plan
    miss on Sk: the checks that read Sk, then bind only; the decode rungs' capability checks ignore Sk,
    so they and a stack name's dispatch run once per growing family).
Each round times ``--calls`` calls of each (implementation, path) in turn, in CPU time of the calling
thread (on a shared machine, wall-clock rounds differed by 2x); the table gives the median of the rounds'
µs per call. ``--profile IMPL:PATH`` prints cProfile's own and cumulative times of one path instead.

``--transformers`` times what a model's layer calls instead: each implementation through the adapter's attention
function (``common.integrations.transformers.make_attention_forward``, as ``ladder:<impl>``), beside transformers' own
``"sdpa"`` attention function with torch's SDPA kernel stubbed alike (its output allocated, nothing computed): the
host time an eager ``generate()`` step pays per layer, where a DynamicCache's K and V are new, one key longer, at
every step (``growing`` for its first layer; the other layers hit the plan it made, ``same``).
"""

from __future__ import annotations

import os

# Before Triton is imported: the interpreter's device check takes CPU tensors.
os.environ.setdefault("TRITON_INTERPRET", "1")

import argparse
import cProfile
import functools
import pstats
import statistics
import time
from collections.abc import Callable

import torch

import common.contract.api as api
from common.contract.problem import Problem
from common.contract.registry import Implementation

DECODE = Problem(
    batch=1, heads=32, seqlen_q=1, seqlen_k=8192, head_dim=128, dtype=torch.float16, kv_heads=8, causal=True,
    causal_alignment="bottom_right",
)  # fmt: skip
IMPLS = ("triton/decode", "gluon/decode", "cute/decode", "triton", "cute", "auto")
PATHS = ("same", "growing")


class NoLaunch:
    """A Triton JIT function whose ``kernel[grid](...)`` launches nothing."""

    def __getitem__(self, grid: object) -> Callable[..., None]:
        return lambda *args, **kwargs: None


def _on_cpu(implementation: Implementation, supports: Callable) -> None:
    # The registry's entries are frozen: the stub changes them for this process only.
    object.__setattr__(implementation, "runs_on_cpu", True)
    object.__setattr__(implementation, "supports", supports)


def _no_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **options: object) -> torch.Tensor:
    """torch's SDPA stubbed: its output allocated, nothing computed (the ladder's launches are no-ops alike)."""
    return torch.empty((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)


def stub_launches() -> None:
    """Replace every launch by a no-op (torch's SDPA too, for ``--transformers``' sdpa row) and let the GPU-only decode
    rungs accept CPU tensors."""
    import triton_impl.decode as triton_decode
    import triton_impl.gluon.decode as gluon_decode

    torch.nn.functional.scaled_dot_product_attention = _no_sdpa

    triton_decode._split_kernel = NoLaunch()
    triton_decode._merge_kernel = NoLaunch()
    triton_decode._balanced_split_kernel = NoLaunch()
    gluon_decode._split_kernel = NoLaunch()
    gluon_decode.gluon_device_supported = lambda rung, device, why: (True, "")
    gluon_decode.validate_for_problem = functools.partial(gluon_decode.validate_for_problem, device_types=("cpu",))
    _on_cpu(gluon_decode.IMPLEMENTATION, gluon_decode.supports)
    try:
        import cute_impl._host as cute_host
        import cute_impl.decode as cute_decode
    except ImportError:
        return
    cute_host.check_common = functools.partial(cute_host.check_common, device_types=("cpu",))
    cute_host.validate_for_problem = functools.partial(cute_host.validate_for_problem, device_types=("cpu",))
    kernels = cute_decode.HOST.kernels

    def no_compile(config: object) -> Callable[..., None]:
        # The compile cache's lookup stays (it is part of a bind); the compile does not.
        if config not in kernels.compiled:
            kernels.compiled[config] = lambda *args: None
        return kernels.compiled[config]

    kernels.kernel = no_compile
    _on_cpu(cute_decode.IMPLEMENTATION, cute_decode.supports)


def _tensors(seqlen_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # Never written or read (no kernel runs): empty CPU memory is only reserved, not touched.
    q = torch.empty((DECODE.batch, DECODE.heads, DECODE.seqlen_q, DECODE.head_dim), dtype=DECODE.dtype)
    kv_shape = (DECODE.batch, DECODE.kv_heads, seqlen_k, DECODE.head_dim)
    return q, torch.empty(kv_shape, dtype=DECODE.dtype), torch.empty(kv_shape, dtype=DECODE.dtype)


def calls(impl: str, path: str, count: int, start: int) -> list[tuple[torch.Tensor, ...]]:
    """The arguments of ``count`` calls: one set of tensors again, or a cache one key longer each call
    (from ``start`` keys past the problem's, so no length repeats across rounds)."""
    if path == "same":
        return [_tensors(DECODE.seqlen_k)] * count
    return [_tensors(DECODE.seqlen_k + start + step) for step in range(count)]


Call = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], object]


def api_call(impl: str) -> Call:
    """One decode call of ``impl`` through ``common.attention``."""
    return lambda q, k, v: api.attention(q, k, v, causal=True, causal_alignment="bottom_right", impl=impl)


def transformers_call(impl: str) -> Call:
    """One decode call as a transformers layer makes it: ``"sdpa"`` through transformers' own attention function
    (torch's SDPA stubbed by ``stub_launches``), any other name through the ladder's adapter as ``ladder:<impl>``."""
    from types import SimpleNamespace

    module = SimpleNamespace(is_causal=True, training=False, num_key_value_groups=DECODE.heads // DECODE.kv_heads)
    if impl == "sdpa":
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        forward = sdpa_attention_forward
    else:
        from common.integrations.transformers import make_attention_forward

        forward = make_attention_forward(impl)
    scaling = DECODE.head_dim**-0.5
    return lambda q, k, v: forward(module, q, k, v, None, scaling=scaling, dropout=0.0)


def time_calls(call: Call, arguments: list[tuple[torch.Tensor, ...]]) -> float:
    """µs of this thread's CPU time per call over ``arguments`` (CPU time: on a shared machine, the time other
    processes hold the cores would otherwise count)."""
    begin = time.thread_time()
    for q, k, v in arguments:
        call(q, k, v)
    return (time.thread_time() - begin) / len(arguments) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--impls", default=",".join(IMPLS))
    parser.add_argument("--profile", metavar="NAME", help="cProfile NAME's calls (e.g. cute/decode:growing)")
    parser.add_argument(
        "--transformers", action="store_true", help="through the adapter, beside transformers' sdpa (docstring)"
    )
    args = parser.parse_args()
    stub_launches()
    impls = args.impls.split(",") + (["sdpa"] if args.transformers else [])
    make_call = transformers_call if args.transformers else api_call
    call_of = {impl: make_call(impl) for impl in impls}
    # First calls plan (and for "same" keep the plan): untimed.
    for impl in impls:
        for q, k, v in (_tensors(DECODE.seqlen_k), _tensors(DECODE.seqlen_k - 1)):
            call_of[impl](q, k, v)
    if args.profile:
        impl, path = args.profile.rsplit(":", 1)
        arguments = calls(impl, path, args.calls, 1)
        profiler = cProfile.Profile()
        profiler.runcall(time_calls, call_of[impl], arguments)
        for order in ("tottime", "cumulative"):
            pstats.Stats(profiler).sort_stats(order).print_stats(25)
        return
    times: dict[tuple[str, str], list[float]] = {(impl, path): [] for impl in impls for path in PATHS}
    start = 1
    for _ in range(args.rounds):
        for impl in impls:
            for path in PATHS:
                arguments = calls(impl, path, args.calls, start)
                start += args.calls
                times[impl, path].append(time_calls(call_of[impl], arguments))
                del arguments
    print("| impl | same (plan hit) µs | growing cache µs |")
    print("|---|---:|---:|")
    for impl in impls:
        same, growing = (statistics.median(times[impl, path]) for path in PATHS)
        print(f"| {impl} | {same:.1f} | {growing:.1f} |")


if __name__ == "__main__":
    main()
