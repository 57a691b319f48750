"""cute/fp8 with its Q quantised lean (``cute_impl.fp8.LEAN_Q_QUANTISATION``: the amax before the rotation's x c, the
e4m3 Q box written by stmatrix; the default since this A/B) against the full one, issue #37: at P1 (B=2 H=16 S=8192
D=128 bf16, FA3 inputs), causal first, then non-causal, in one process, ``--rounds`` interleaved rounds (medians;
every timing ``common.measure.timing.time_cuda``: L2 flushed, median): cute/hopper (bf16, the issue's denominator),
then per setting cute/fp8 kernel only and end to end (the K/V quantiser + the kernel per call), and the quantiser
alone once per round. Before any timing, each setting's kernel-only and end-to-end O is checked equal to the full
Q's kernel only bit for bit (the knob changes how Q's e4m3 box is computed and written, not its bytes); one that
differs is not timed and the run exits 1. Writes ``fp8_tile_work.csv`` and ``.md`` to ``--out``.

usage (project root, GPU):  python -m bench.fp8_tile_work [--out DIR] [--rounds 3]
"""

from __future__ import annotations

from bench.fp8_knob import Fp8KnobAB

AB = Fp8KnobAB("LEAN_Q_QUANTISATION", {"full Q": False, "lean Q": True}, "lean Q quantisation", "fp8_tile_work")


def main() -> None:
    AB.main(__doc__)


if __name__ == "__main__":
    main()
