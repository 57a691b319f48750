"""cute/backward/hopper's dQ finished in its dK/dV kernel (``BackwardTiles.dq_finish_in_kernel``, issue #40: no
postprocess launch, each query block's last key block converts its dQ) against the defaults it changes and FA4's
backward. Rows per shape: the head dim's default (causal D=128: ``hopper.CHAINED_CAUSAL[-1]``; D=64: ``DEFAULTS[64,
False]``), its finished candidate (``hopper.FINISHED_CAUSAL``, ``hopper.FINISHED_D64``) and FA4. Per shape: the finished
row's gradients checked against the default's first (dK and dV bit for bit, dQ within fp32 reduce-add reordering), then
``--rounds`` interleaved rounds (the order reversed every other round; each measurement ``time_cuda``'s L2-flushed
median), the table giving each row's median over rounds and its speed against FA4 and against the default (their time ÷
the row's). The cute rows run on cute/hopper's O and LSE (``bench.backward_kernels.variant_backward``), FA4 through
autograd as ``bench.backward_interleaved`` times it. Writes ``cute_bwd_finish.csv`` and ``.md`` to ``--out``.

usage (project root, GPU, the CuTe DSL and FA4 activated):
    python -m bench.cute_bwd_finish_ab [--out DIR] [--rounds 4]
"""

from __future__ import annotations

from bench import cute_bwd_candidates as candidates

# (name, batch, heads, seqlen, head_dim, causal), as bench.backward names its anchors.
SHAPES = (
    ("B8 S2048 causal", 8, 16, 2048, 128, True),
    ("B16 H16 S1024 causal", 16, 16, 1024, 128, True),
    ("P1 causal", 2, 16, 8192, 128, True),
    ("D64 B4 H32", 4, 32, 8192, 64, False),
)


def cute_rows(head_dim: int) -> dict[str, str]:
    """{row name: candidate label} at ``head_dim``: the default the switch changes, then the finished candidate."""
    from cute_impl.backward import hopper

    if head_dim == 64:
        return {"default": hopper.DEFAULTS[64, False].label, "finish": hopper.FINISHED_D64.label}
    return {"default": hopper.CHAINED_CAUSAL[-1].label, "finish": hopper.FINISHED_CAUSAL.label}


def main() -> None:
    candidates.main(
        "bench.cute_bwd_finish_ab",
        SHAPES,
        lambda shape: cute_rows(shape[4]),
        "default",
        "cute/hopper's backward, dQ finished in the dK/dV kernel against the default and FA4",
        __doc__,
    )


if __name__ == "__main__":
    main()
