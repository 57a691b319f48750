"""cute/fp8 with each key block's P V folded into O in one FMA a value (``cute_impl.fp8.FOLD_V_SCALE``, on by default)
against the P V added with its V scale and O rescaled apart, issue #37: at P1 (B=2 H=16 S=8192 D=128 bf16, FA3 inputs;
D=128 only, ``FOLD_V_SCALE_HEAD_DIMS``), causal first, then non-causal, in one process, ``--rounds``
interleaved rounds, the order reversed every other round (``fp8_q_in_kernel.interleaved_samples``; medians, every
timing ``common.measure.timing.time_cuda``: L2 flushed): cute/hopper (bf16, the issue's denominator), then per setting
cute/fp8 kernel only and end to end, and the quantiser alone. The fold reorders fp32 arithmetic (O in its last V
block's frame), so before any timing each setting's O must be within 2e-3 relative L2 of the unfolded kernel's (bf16
rounding's scale; tests/test_cute_fp8_fold_v_scale.py judges it by FP8_RULE); one that is not is not timed and the run
exits 1. Writes ``fp8_fold_v.csv`` and ``.md`` to ``--out``.

usage (project root, GPU):  python -m bench.fp8_fold_v [--out DIR] [--rounds 3]
"""

from __future__ import annotations

from bench.fp8_knob import Fp8KnobAB

AB = Fp8KnobAB(
    "FOLD_V_SCALE",
    {"apart": False, "folded": True},
    "each block's P V folded into O",
    "fp8_fold_v",
    config_field="fold_v_scale",
    max_rel_l2=2e-3,
)


def main() -> None:
    AB.main(__doc__)


if __name__ == "__main__":
    main()
