"""ncu target: one registry implementation's prepared runner at one shape, only its profiled launch
between ``cudaProfilerStart``/``Stop`` (inputs, quantisation and compile happen before).

    python -m bench.ncu_target IMPL B H S D CAUSAL           a dense prefill shape, bf16
    python -m bench.ncu_target IMPL decode SEED INDEX         the INDEX-th of ``random_cases(.., SEED)``: the decode
                                                              shapes of ``compare.py --decode-random N --decode-seed
                                                              SEED`` (their lengths, paging and cache included)
    python -m bench.ncu_target IMPL backward NAME             the backward through autograd (every kernel of one
                                                              backward) at ``bench.backward``'s shape NAME, e.g.
                                                              B8 S2048 causal

``--set MODULE:NAME=LITERAL`` (repeatable, after the target) holds a module constant for the prepare and the profiled
launch, as ``bench.decode_knob_ab`` does, e.g. a build its default leaves out. ``bench/ncu.sh`` runs it under ncu.
"""

import argparse
from collections.abc import Callable

import torch

from bench import require_gpu
from common.contract.inputs import make_inputs
from common.contract.problem import Problem
from common.contract.registry import get


def prefill_runner(
    impl: str, batch: int, heads: int, seqlen: int, head_dim: int, causal: int
) -> tuple[Callable[[], object], Problem]:
    """The prepared runner of ``impl`` at B H S D CAUSAL (Sq = Sk = S, bf16)."""
    problem = Problem(batch, heads, seqlen, seqlen, head_dim, dtype=torch.bfloat16, causal=bool(causal))
    q, k, v = make_inputs(problem, seed=0)
    return get(impl).prepare(q, k, v, problem), problem


def decode_runner(impl: str, seed: int, index: int) -> tuple[Callable[[], object], Problem]:
    """The prepared runner of ``impl`` on seed ``seed``'s ``index``-th random decode case, drawn as the sweep
    draws it (``DecodeCase.gpu_workload``: the cache lengths and the block table are per-call inputs)."""
    from common.measure.decode_sweep import random_cases

    case = random_cases(index + 1, seed)[index]
    workload, extra = case.gpu_workload(torch.device("cuda"))
    return get(impl).prepare(workload.q, workload.k, workload.v, case.problem, **extra), case.problem


def backward_runner(impl: str, name: str) -> tuple[Callable[[], object], Problem]:
    """``impl``'s backward through autograd at ``bench.backward``'s shape ``name`` (the forward runs once, before)."""
    from bench.backward import chosen_shapes, problem_of
    from bench.backward_kernels import autograd_backward

    (shape,) = chosen_shapes([name])
    return autograd_backward(shape, impl), problem_of(shape)


def parsed_target(words: list[str], parser: argparse.ArgumentParser) -> tuple[str, list]:
    """("backward", [NAME]), ("decode", [SEED, INDEX]) or ("prefill", [B, H, S, D, CAUSAL]) from the command line's
    words; a wrong count or a non-integer is the parser's error (before any GPU is asked for)."""
    if words[0] == "backward":
        if len(words) == 1:
            parser.error("expected backward NAME, got no NAME")
        return "backward", [" ".join(words[1:])]  # bench/ncu.sh passes a name's words apart
    kind = "decode" if words[0] == "decode" else "prefill"
    numbers = words[kind == "decode" :]
    if len(numbers) != (2 if kind == "decode" else 5) or not all(word.isdigit() for word in numbers):
        parser.error(f"expected B H S D CAUSAL, decode SEED INDEX or backward NAME, got {' '.join(words)}")
    return kind, [int(word) for word in numbers]


RUNNERS = {
    "backward": backward_runner,
    "decode": decode_runner,
    "prefill": prefill_runner,
}


def profile(runner: Callable[[], object]) -> None:
    """Three warm-up launches, then one between the profiler's start and stop."""
    for _ in range(3):
        runner()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    runner()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def main(argv: list[str] | None = None) -> None:
    from bench.decode_knob_ab import held_constants
    from bench.decode_ragged_ab import switched

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("impl", help="registry name, e.g. gluon/fp8")
    parser.add_argument("shape", nargs="+", help="B H S D CAUSAL, or: decode SEED INDEX, or: backward NAME")
    parser.add_argument("--set", action="append", default=[], help="MODULE:NAME=LITERAL held (repeatable)")
    args = parser.parse_args(argv)
    kind, values = parsed_target(args.shape, parser)
    held = held_constants(parser, args.set)
    require_gpu("bench.ncu_target")
    with switched(held):
        runner, problem = RUNNERS[kind](args.impl, *values)
        profile(runner)
    print(args.impl, problem.describe(), "profiled", *args.set, flush=True)


if __name__ == "__main__":
    main()
