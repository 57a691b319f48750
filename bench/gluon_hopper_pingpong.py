"""gluon/hopper (bf16) at D=128 with its consumers' ping-pong off and on, issue #37's finding carried to
bf16: gluon/fp8's causal kernel ran 1.060x as fast with it (results/h200/gluon-fp8-pingpong-causal/), and
gluon/hopper's D=128 default runs without it (P1 non-causal measured 614.5 against 611.5 TFLOP/s with it, in spread,
docs/perf-log.md "Fourth stop"; causal never timed). ``bench.gluon_fp8_pingpong``'s A/B on the bf16 rung: P1 (B=2
H=16 S=8192 D=128, the FA3 inputs in bf16), causal then non-causal, ``--rounds`` interleaved rounds, the order
reversed every other round, O checked bit-equal to off's first. Writes ``gluon_hopper_pingpong.csv`` and ``.md``
to ``--out``.

usage (project root, GPU):  python -m bench.gluon_hopper_pingpong [--out DIR] [--rounds 4]
"""

from __future__ import annotations

from bench import gluon_fp8_pingpong


def main() -> None:
    gluon_fp8_pingpong.main("gluon/hopper", __doc__)


if __name__ == "__main__":
    main()
