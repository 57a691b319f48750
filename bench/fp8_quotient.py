"""cute/fp8 with one Markstein correction of each Q value's quotient by its block scale
(``cute_impl.fp8.Q_QUOTIENT_CORRECTIONS`` = 1, the default since this A/B) against 2 (the fused quantiser's), issue
#37: at P1 (B=2 H=16 S=8192 D=128 bf16, FA3 inputs), causal first, then non-causal, in one process, ``--rounds``
interleaved rounds, the order reversed every other round (``fp8_q_in_kernel.interleaved_samples``) (medians; every
timing ``common.measure.timing.time_cuda``: L2 flushed, median): cute/hopper (bf16, the issue's denominator), then
per setting cute/fp8 kernel only and end to end (the K/V quantiser + the kernel per call), and the quantiser alone
once per round. Before any timing, each setting's kernel-only and end-to-end O is checked equal to 2's kernel only
bit for bit (``common/tools/fp8_quotient.py`` proves the quotient the same); one that differs is not timed and the
run exits 1. Writes ``fp8_quotient.csv`` and ``.md`` to ``--out``.

usage (project root, GPU):  python -m bench.fp8_quotient [--out DIR] [--rounds 3]
"""

from __future__ import annotations

from bench.fp8_knob import Fp8KnobAB

AB = Fp8KnobAB(
    "Q_QUOTIENT_CORRECTIONS",
    {"2 corrections": 2, "1 correction": 1},
    "Q quotient corrections",
    "fp8_quotient",
    config_field="q_quotient_corrections",
)


def main() -> None:
    AB.main(__doc__)


if __name__ == "__main__":
    main()
