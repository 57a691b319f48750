"""triton/fp8 with Q quantised in its kernel (``triton_impl.fp8.QUANTISE_Q_IN_KERNEL``) against the fused quantiser's Q,
issue #37 ("every FP8 rung end to end >= 0.9x its kernel, causal included"): at P1 (B=2 H=16 S=8192 D=128 bf16, FA3
inputs), causal first, then non-causal, in one process, ``--rounds`` interleaved rounds (medians; every timing
``common.measure.timing.time_cuda``: L2 flushed, median): triton/hopper (bf16, the stack's denominator), then per
setting (off, on, on with the sign matrix copied by TMA: ``ROTATION_BY_TMA``) triton/fp8 kernel only, end to end (the
quantiser + the kernel per call) and its quantiser alone (Q, K and V; K and V only with the knob). Before any timing,
each setting's kernel-only and end-to-end O is checked equal to the knob-off kernel's bit for bit (the kernel's Q is
the quantiser's: ``quantise_query_block``); one that differs is not timed and the run exits 1. Writes
``triton_fp8_q_in_kernel.csv`` and ``.md`` to ``--out``.

usage (project root, GPU):  python -m bench.triton_fp8_q_in_kernel [--out DIR] [--rounds 3]
"""

from __future__ import annotations

from bench.fp8_knob import Fp8KnobAB

AB = Fp8KnobAB(
    "QUANTISE_Q_IN_KERNEL",
    {"off": False, "on": True, "on+tma": {"QUANTISE_Q_IN_KERNEL": True, "ROTATION_BY_TMA": True}},
    "Q quantised in the kernel", "triton_fp8_q_in_kernel",
    rung="triton/fp8", quantiser_each=True,
)  # fmt: skip


def main() -> None:
    AB.main(__doc__)


if __name__ == "__main__":
    main()
