"""Gluon (and cute/fp8) configuration sweep: candidates judged on ragged shapes, then timed in one process.

A candidate is a label, a rung (``fp8``/``hopper`` for a Gluon configuration, ``cute/fp8`` for knobs of
``cute_impl.fp8.fp8_config``, or a registry name such as ``triton/hopper`` for its prepared default), a
timed shape and its configuration (a ``GluonConfig``, a dict of cute/fp8 knobs, or None for a registry
row). FP8 candidates quantise with the rung's default, K/V scale blocks widened to whole key blocks.
Candidate sets (``--cands``):

- ``sweep-4``: the fourth stop's configurations of gluon/fp8 and gluon/hopper (issue #20;
  ``results/h200/gluon-sweep-4/``);
- ``row-tree``: gluon/fp8 with and without ``row_tree`` (``results/h200/gluon-fourth-stop/row-tree-configs-*``);
- ``gluon-ab-hopper``, ``gluon-ab-fp8``: the first Gluon A/B against triton/hopper, cute/hopper and
  gluon/hopper, and triton/fp8, cute/fp8 (``results/h200/gluon-ab/``; those logs came from an earlier
  script that timed each candidate once with ``time_cuda``'s defaults and judged bf16 by max error).
- ``fp8-d64``: issue #37's FP8 at D=64 (B=4 H=32 S=8192, non-causal and causal): the defaults and
  ``D64_CANDIDATES`` of cute/fp8 and gluon/fp8 against cute/hopper, the best bf16 rung (needs the CuTe DSL);
- ``fp8-pingpong``: gluon/fp8 at P1, causal and not, 2-4 ring stages with ping-pong and row trees (the defaults
  since 2026-12-04; ``results/h200/gluon-fp8-pingpong-stages/``).

Subcommands (from the project root):

    python -m bench.gluon_sweep smoke I N [--cands SET]      # judge candidates I::N (poisoned output,
                                                              # fp64 reference, SDPA yardstick / FP8
                                                              # emulation rule); one JSON line each
    python -m bench.gluon_sweep bench ROUNDS [FILTER] [--cands SET] [--judge]
                                                              # time the candidates whose label holds one
                                                              # of FILTER's '|'-separated parts: interleaved
                                                              # rounds in rotated order, median TFLOP/s;
                                                              # --judge: the smoke first, in this process
                                                              # (each kernel compiled once), failures untimed
    python -m bench.gluon_sweep static [--cands SET]          # sm_90a registers and spills, no GPU

``bash bench/smoke_then_bench.sh bench.gluon_sweep ROUNDS --cands SET`` runs the smoke in 8 processes
and then the timing, as one device call. Smoke shapes: B=1 H=16 Sq=1008 Sk=1232 (Triton specialises
integers on % 16, so this is the timed binary) and B=2 H=3 Sq=77 Sk=1000.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys

import torch
import triton

from bench import require_gpu
from common.contract.problem import Problem
from triton_impl.gluon import fp8 as gf
from triton_impl.gluon import hopper as gh
from triton_impl.gluon.hopper import GluonConfig as C

# (batch, heads, seqlen, head_dim, causal) of the timed problems.
SHAPES = {
    "P1": (2, 16, 8192, 128, False),
    "P1c": (2, 16, 8192, 128, True),
    "D64": (4, 32, 8192, 64, False),
    "D64c": (4, 32, 8192, 64, True),
}
SMOKE_SHAPES = ((1, 16, 1008, 1232), (2, 3, 77, 1000))
# The static census's ceilings: an H200's SMs at the clock of the H100/H200 datasheet's tensor-core
# peaks (under the 700 W cap the runs measured 1.68-1.88 GHz; docs/perf-log.md).
CENSUS_SMS = 132
CENSUS_CLOCK_GHZ = 1.83


def _configs(prefix: str, rung: str, shape: str, named: list[tuple[str, C]]) -> list[tuple]:
    return [(f"{prefix} {name}", rung, SHAPES[shape], cfg) for name, cfg in named]


def _sweep_4() -> list[tuple]:
    pp = {"pingpong": True}
    return [
        *_configs("fp8 P1", "fp8", "P1", [
            ("128,2,pp (default)", C(128, 2, **pp)), ("128,3,pp", C(128, 3, **pp)), ("128,2", C(128, 2)),
            ("128,3", C(128, 3)), ("64,3,pp", C(64, 3, **pp)), ("64,4,pp", C(64, 4, **pp)), ("64,4", C(64, 4)),
        ]),
        *_configs("fp8 P1c", "fp8", "P1c", [
            ("128,3 (default)", C(128, 3)), ("128,3,pp", C(128, 3, **pp)), ("128,2", C(128, 2)), ("64,4", C(64, 4)),
        ]),
        *_configs("hopper D64", "hopper", "D64", [
            ("128,2,3c,pp (default)", C(128, 2, 3, True)), ("128,3,3c,pp", C(128, 3, 3, True)),
            ("128,2,3c", C(128, 2, 3)), ("64,4,3c,pp", C(64, 4, 3, True)), ("64,3,3c,pp", C(64, 3, 3, True)),
            ("128,2,2c,pp", C(128, 2, 2, True)), ("128,3,2c", C(128, 3, 2)),
        ]),
        *_configs("hopper D64c", "hopper", "D64c", [
            ("128,2,3c,pp (default)", C(128, 2, 3, True)), ("128,3,3c,pp", C(128, 3, 3, True)),
            ("128,2,3c", C(128, 2, 3)),
        ]),
        *_configs("hopper P1", "hopper", "P1", [
            ("128,2 (default)", C(128, 2)), ("128,3", C(128, 3)), ("128,2,pp", C(128, 2, **pp)), ("64,4", C(64, 4)),
            ("128,3,pp", C(128, 3, **pp)),
        ]),
        *_configs("hopper P1c", "hopper", "P1c", [
            ("128,2 (default)", C(128, 2)), ("128,2,pp", C(128, 2, **pp)), ("128,3,pp", C(128, 3, **pp)),
        ]),
    ]  # fmt: skip


def _row_tree() -> list[tuple]:
    bases = [("fp8 P1 128,2,pp", "P1", C(128, 2, pingpong=True)), ("fp8 P1c 128,3", "P1c", C(128, 3)),
             ("fp8 D64 128,3", "D64", C(128, 3)), ("fp8 D64c 128,3", "D64c", C(128, 3))]  # fmt: skip
    return [
        (f"{label} tree={tree}", "fp8", SHAPES[shape], dataclasses.replace(cfg, row_tree=tree))
        for label, shape, cfg in bases
        for tree in (False, True)
    ]


def _fp8_pingpong() -> list[tuple]:
    """gluon/fp8 at D=128 around the defaults since its causal one took ping-pong (2026-12-04): ring depth."""
    pp = {"pingpong": True, "row_tree": True}
    return [
        *_configs("fp8 P1c", "fp8", "P1c", [
            ("128,3,pp (default)", C(128, 3, **pp)), ("128,2,pp", C(128, 2, **pp)), ("128,4,pp", C(128, 4, **pp)),
        ]),
        *_configs("fp8 P1", "fp8", "P1", [
            ("128,2,pp (default)", C(128, 2, **pp)), ("128,3,pp", C(128, 3, **pp)), ("128,4,pp", C(128, 4, **pp)),
        ]),
    ]  # fmt: skip


def _first_ab(rung: str, baselines: tuple[str, ...], configs: dict[int, list[C]]) -> list[tuple]:
    cands = []
    for name, shape in SHAPES.items():
        cands += [(f"{name} {impl}", impl, shape, None) for impl in baselines]
        cands += [(f"{name} gluon/{rung} {cfg}", rung, shape, cfg) for cfg in configs[shape[3]]]
    return cands


# The first Gluon A/B's configurations per head dim (results/h200/gluon-ab/).
FIRST_AB_HOPPER = {
    128: [C(128, 2, 2), C(128, 3, 2), C(128, 3, 2, True)],
    64: [C(128, 3, 2), C(128, 2, 2, True), C(128, 4, 2, True), C(128, 3, 3), C(128, 2, 3, True)],
}
FIRST_AB_FP8 = {128: [C(64, 3), C(128, 3), C(128, 2)], 64: [C(64, 3, 3, True), C(128, 3)]}


def _fp8_d64() -> list[tuple]:
    from cute_impl.fp8 import D64_CANDIDATES as CUTE_D64

    cands = []
    for name in ("D64", "D64c"):
        shape = SHAPES[name]
        causal = shape[4]
        default = gf.default_config(Problem(*shape[:3], shape[2], shape[3], causal=causal))
        cands.append((f"{name} cute/hopper (bf16)", "cute/hopper", shape, None))
        knobs = {"default": {}, **CUTE_D64[causal]}
        cands += [(f"{name} cute/fp8 {label}", "cute/fp8", shape, knob) for label, knob in knobs.items()]
        gluon = (default, *gf.D64_CANDIDATES[causal])
        cands += [(f"{name} gluon/fp8 {cfg}{' (default)' * (cfg == default)}", "fp8", shape, cfg) for cfg in gluon]
    return cands


CANDIDATE_SETS = {
    "sweep-4": _sweep_4,
    "row-tree": _row_tree,
    "gluon-ab-hopper": lambda: _first_ab("hopper", ("triton/hopper", "cute/hopper", "gluon/hopper"), FIRST_AB_HOPPER),
    "gluon-ab-fp8": lambda: _first_ab("fp8", ("triton/fp8", "gluon/fp8", "cute/fp8", "gluon/hopper"), FIRST_AB_FP8),
    "fp8-d64": _fp8_d64,
    "fp8-pingpong": _fp8_pingpong,
}


def _fp8_operands(rung: str, cfg, q, k, v, p: Problem):
    """An FP8 candidate's quantised operands and the key-block order its emulation follows: ``fp8`` (a
    ``GluonConfig``) or ``cute/fp8`` (knobs of ``fp8_config``)."""
    from common.contract.fp8 import KernelOrder
    from triton_impl.fp8_quantiser import quantise_for_kernel

    if rung == "cute/fp8":
        from cute_impl import fp8 as cf

        quantisation = cf.candidate_quantisation(cfg)
        tile_n = cf.fp8_config(p, quantisation, **cfg).tile_n
        return cf.quantised(q, k, v, quantisation), KernelOrder(block_n=tile_n, reverse=True)
    operands = quantise_for_kernel(q, k, v, gf.candidate_quantisation(cfg), gf.value_layout(cfg))
    return operands, KernelOrder(block_n=cfg.block_n, reverse=False)


def _fp8_launch(rung: str, cfg, operands, p: Problem):
    if rung == "cute/fp8":
        from cute_impl import fp8 as cf

        return cf.quantised_launcher(cf.fp8_config(p, operands.quantisation, **cfg), operands, p)
    return gf.GluonFp8Attention(operands, p, cfg)


def runner(rung: str, q, k, v, p: Problem, cfg):
    """Prepared launch of one candidate: a Gluon configuration, cute/fp8 knobs, or a registry row's default."""
    if cfg is None:
        from common.contract.registry import get

        return get(rung).prepare(q, k, v, p)
    if rung in ("fp8", "cute/fp8"):
        return _fp8_launch(rung, cfg, _fp8_operands(rung, cfg, q, k, v, p)[0], p)
    return gh.GluonAttention(q, k, v, p, cfg)


def judge(rung: str, out, q, k, v, p: Problem, cfg) -> tuple[bool, str]:
    """The rung's own rule: FP8_RULE against this configuration's emulation, or the registry row's rule."""
    from common.contract.check import judge_output, sdpa_error
    from common.contract.fp8 import emulate as emulate_quantised
    from common.contract.metrics import FP8_RULE, emulation_stats, error_stats
    from common.contract.reference import reference_attention
    from common.contract.registry import get

    ref = reference_attention(q, k, v, p)
    yard = sdpa_error(q, k, v, p, ref)
    err = error_stats(out, ref)
    if cfg is None:
        ok, reason, _ = judge_output(get(rung), out, err, (q, k, v), p, ref, yard)
        return ok, reason
    if rung in ("fp8", "cute/fp8"):
        operands, order = _fp8_operands(rung, cfg, q, k, v, p)
        em = emulate_quantised(operands.as_quantised(), p, order)
        return FP8_RULE.judge(err, yard, emulation_stats(out, em.out, em.bound, ref))
    return get("gluon/hopper").error_rule.judge(err, yard, None)


def _say(**fields) -> None:
    print(json.dumps({"triton": triton.__version__, **fields}), flush=True)


def smoke(cands: list[tuple], index: int, count: int) -> set[str]:
    """Judge candidates ``index::count`` on the smoke shapes; the labels that failed."""
    from common.contract.check import run_poisoned
    from common.contract.inputs import make_inputs

    failed = set()
    for label, rung, (_b, _h, _s, d, causal), cfg in cands[index::count]:
        for b, h, sq, sk in SMOKE_SHAPES:
            p = Problem(b, h, sq, sk, d, dtype=torch.bfloat16, causal=causal)
            q, k, v = make_inputs(p, seed=sq + sk)
            try:
                passed, reason = judge(rung, run_poisoned(runner(rung, q, k, v, p, cfg)), q, k, v, p, cfg)
            except Exception as error:  # noqa: BLE001 - a candidate that cannot run fails its smoke, the rest go on
                passed, reason = False, f"{type(error).__name__}: {str(error)[:200]}"
            _say(smoke=label, shape=p.describe(), ok=bool(passed), reason=reason)
            if not passed:
                failed.add(label)
    return failed


def bench(cands: list[tuple], rounds: int, wanted: str, judged: bool = False) -> None:
    """Time the wanted candidates in interleaved rounds; ``judged``: the smoke first, failures untimed."""
    from common.contract.inputs import make_inputs
    from common.measure.timing import tflops, time_cuda

    parts = wanted.split("|")
    chosen = [cand for cand in cands if any(part in cand[0] for part in parts)]
    failed = smoke(chosen, 0, 1) if judged else set()
    groups: dict[tuple, list] = {}
    for label, rung, shape, cfg in chosen:
        if label not in failed:
            groups.setdefault(shape, []).append((label, rung, cfg))
    for (b, h, s, d, causal), variants in groups.items():
        p = Problem(b, h, s, s, d, dtype=torch.bfloat16, causal=causal)
        q, k, v = make_inputs(p, seed=0)
        runs = []
        for label, rung, cfg in variants:
            try:
                runs.append((label, runner(rung, q, k, v, p, cfg)))
                runs[-1][1]()
            except Exception as error:  # noqa: BLE001 - reported, the other candidates are still timed
                _say(label=label, error=f"{type(error).__name__}: {str(error)[:200]}")
                runs = [run for run in runs if run[0] != label]
        samples = {label: [] for label, _ in runs}
        for r in range(rounds):
            order = runs[r % len(runs) :] + runs[: r % len(runs)]
            for label, run in order:
                samples[label].append(tflops(p.flops, time_cuda(run, warmup_ms=25, rep_ms=200).ms))
        for label, _ in runs:
            xs = samples[label]
            _say(label=label, median=round(statistics.median(xs), 1), rounds=[round(x, 1) for x in xs])
        del runs, q, k, v
        torch.cuda.empty_cache()


def _compile_sm90(rung: str, p: Problem, cfg):
    if cfg is None:
        from common.contract.registry import get

        return get(rung).compile_sm90(p)[0]
    if rung == "cute/fp8":
        from cute_impl import fp8 as cf

        return cf.compile_sm90(p, cf.candidate_quantisation(cfg), **cfg)[0]
    if rung == "fp8":
        return gf.compile_sm90(p, cfg, gf.candidate_quantisation(cfg))[0]
    return gh.compile_sm90(p, cfg)[0]


def static(cands: list[tuple]) -> None:
    """Registers and spilled bytes of each candidate's sm_90a build, and its key-block loop's demand on
    the pipes (``LoopCensus``: issue, exp2-unit and tensor-core cycles per warpgroup and block, the
    limiter, the TFLOP/s ceiling at ``CENSUS_CLOCK_GHZ``)."""
    from common.reporting.static import cubin_loop_census, cubin_resources

    for label, rung, (b, h, s, d, causal), cfg in cands:
        p = Problem(b, h, s, s, d, dtype=torch.bfloat16, causal=causal)
        try:
            binary = _compile_sm90(rung, p, cfg)
            res = cubin_resources(binary.cubin)
            spill = max(u["stack_bytes"] + u["local_bytes"] for u in res.values())
            loop = cubin_loop_census(binary.cubin)
            census = {} if loop is None else {
                "issue": loop.instructions, "exp2": loop.exp2, "xu_cycles": loop.xu_cycles,
                "tensor_cycles": loop.tensor_cycles, "limiter": loop.limiter,
                "ceiling": round(loop.ceiling_tflops(CENSUS_SMS, CENSUS_CLOCK_GHZ)),
            }  # fmt: skip
            _say(label=label, spill=spill, regs=max(u["registers"] for u in res.values()), **census)
        except Exception as error:  # noqa: BLE001 - a configuration that does not compile is reported
            _say(label=label, error=str(error)[:200])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--cands", choices=sorted(CANDIDATE_SETS), default="sweep-4", help="candidate set")
    sub = parser.add_subparsers(dest="command", required=True)
    smoke_args = sub.add_parser("smoke", parents=[common], help="judge candidates I::N on ragged shapes")
    smoke_args.add_argument("index", type=int)
    smoke_args.add_argument("count", type=int)
    bench_args = sub.add_parser("bench", parents=[common], help="time the candidates in interleaved rounds")
    bench_args.add_argument("rounds", type=int)
    bench_args.add_argument("filter", nargs="?", default="", help="'|'-separated label substrings (default: all)")
    bench_args.add_argument("--judge", action="store_true", help="the smoke first, in this process; failures untimed")
    sub.add_parser("static", parents=[common], help="sm_90a registers and spills (no GPU)")
    args = parser.parse_args()
    cands = CANDIDATE_SETS[args.cands]()
    if args.command == "static":
        static(cands)
        return
    require_gpu("bench.gluon_sweep " + args.command)
    if args.command == "smoke":
        sys.exit(1 if smoke(cands, args.index, args.count) else 0)
    bench(cands, args.rounds, args.filter, args.judge)


if __name__ == "__main__":
    main()
