"""cute/fp8 at D=128 with its consumer warpgroups in ping-pong against without, issue #37: at P1 (B=2 H=16 S=8192
D=128 bf16, FA3 inputs), causal first, then non-causal, in one process, ``--rounds`` interleaved rounds, the order
reversed every other round (``bench.fp8_knob``; medians, L2 flushed): cute/hopper (bf16, the issue's denominator),
then per setting cute/fp8 kernel only and end to end (the K/V quantiser + the kernel), and the quantiser alone. Each
setting's O is checked equal to "off"'s bit for bit before it is timed (ping-pong orders the warpgroups' GEMMs, not
their arithmetic). Gluon's causal FP8 kernel ran 1.060x as fast with ping-pong (results/h200/gluon-fp8-pingpong-
causal/), where the 2.4 % this rung once measured without it was non-causal, before Q was quantised in the kernel.
Writes ``cute_fp8_pingpong.csv`` and ``.md`` to ``--out``.

usage (project root, GPU):  python -m bench.cute_fp8_pingpong [--out DIR] [--rounds 3]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from bench.fp8_knob import Fp8KnobAB
from common.contract.problem import Problem
from cute_impl import _hopper_host
from cute_impl._hopper_host import HopperAttentionConfig


def with_pingpong(on: bool) -> Callable[..., HopperAttentionConfig]:
    """``default_config`` with ping-pong set to ``on`` for FP8 at D=128, everything else as it chooses."""

    def config(problem: Problem, fp8: bool = False) -> HopperAttentionConfig:
        chosen = _hopper_host.default_config(problem, fp8)
        return dataclasses.replace(chosen, pingpong=on) if fp8 and problem.head_dim == 128 else chosen

    return config


AB = Fp8KnobAB(
    "default_config",
    {"off": with_pingpong(False), "on": with_pingpong(True)},
    "ping-pong off and on",
    "cute_fp8_pingpong",
)


def main() -> None:
    AB.main(__doc__)


if __name__ == "__main__":
    main()
