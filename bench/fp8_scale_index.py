"""cute/fp8 with its K and V block scales read through 32-bit strides (``cute_impl.fp8.SCALE_INDEX_32BIT``, on by
default for the causal mask) against 64-bit ones in both modes (``SCALE_INDEX_32BIT_CAUSAL_ONLY`` lifted), issue #37: at
P1 (B=2 H=16 S=8192 D=128 bf16, FA3 inputs; ``--head-dim 64 --batch 4``: the issue's D=64 shape), causal first, then
non-causal, in one process, ``--rounds`` interleaved rounds, the order reversed every other round
(``fp8_q_in_kernel.interleaved_samples``; medians, every timing ``common.measure.timing.time_cuda``: L2 flushed):
cute/hopper (bf16, the issue's denominator), then per setting cute/fp8 kernel only and end to end, and the quantiser
alone. Only addresses change, so before any timing each setting's O is checked equal to the 64-bit kernel's bit for bit;
one that differs is not timed and the run exits 1. Writes ``fp8_scale_index.csv`` and ``.md`` to ``--out``.

usage (project root, GPU):  python -m bench.fp8_scale_index [--head-dim 64 --batch 4] [--out DIR] [--rounds 3]
"""

from __future__ import annotations

from bench.fp8_knob import Fp8KnobAB

AB = Fp8KnobAB(
    "SCALE_INDEX_32BIT",
    {"64-bit strides": False, "32-bit strides": True},
    "block scales through 32-bit strides",
    "fp8_scale_index",
    config_field="scale_index_32",
)


def main() -> None:
    from cute_impl import fp8

    fp8.SCALE_INDEX_32BIT_CAUSAL_ONLY = False  # the non-causal rows time the strides too: why they stay 64-bit there
    AB.main(__doc__)


if __name__ == "__main__":
    main()
