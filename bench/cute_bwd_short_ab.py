"""cute/backward/hopper's unchained causal D=128 step (``hopper.UNCHAINED_CAUSAL``) against its chained candidates
(``hopper.CHAINED_CAUSAL``: the three launches chained by programmatic dependent launch, then without the dQaccum fill,
then with the postprocess's items last first) and FA4's backward, on short causal rows (issue #40: B8 S2048 causal at
0.973x FA4 on 2026-12-04). Per shape: each cute row's gradients checked against the unchained step's first (dK and dV
bit for bit, dQ within fp32 reduce-add reordering), then ``--rounds`` interleaved rounds (the order reversed every other
round; each measurement ``time_cuda``'s L2-flushed median), the table giving each row's median over rounds and its speed
against FA4 and against the unchained step (their time ÷ the row's). The cute rows run on cute/hopper's O and LSE
(``bench.backward_kernels.variant_backward``), FA4 through autograd as ``bench.backward_interleaved`` times it
(``bench.cute_bwd_candidates``: the checks, the rounds and the table). Writes ``cute_bwd_short.csv`` and ``.md`` to
``--out``.

usage (project root, GPU, the CuTe DSL and FA4 activated):
    python -m bench.cute_bwd_short_ab [--out DIR] [--rounds 4]
"""

from __future__ import annotations

from bench import cute_bwd_candidates as candidates

# (name, batch, heads, seqlen, head_dim, causal), as bench.backward names its anchors.
SHAPES = (
    ("B8 S2048 causal", 8, 16, 2048, 128, True),
    ("B16 H16 S1024 causal", 16, 16, 1024, 128, True),
    ("P1 causal", 2, 16, 8192, 128, True),
)


# The switches a row name lists, in the order the candidates add them.
SWITCHES = {"dependent_launch": "pdl", "zero_in_preprocess": "zeropre", "postprocess_reversed": "postrev"}


def cute_rows() -> dict[str, str]:
    """{row name: candidate label}: the unchained causal D=128 step, then each chained candidate named by its switches
    (the last, every switch, the causal D=128 default since 2026-12-04)."""
    from cute_impl.backward import hopper

    rows = {"unchained": hopper.UNCHAINED_CAUSAL.label}
    for tiles in hopper.CHAINED_CAUSAL:
        rows["+".join(short for switch, short in SWITCHES.items() if getattr(tiles, switch))] = tiles.label
    return rows


def main() -> None:
    candidates.main(
        "bench.cute_bwd_short_ab",
        SHAPES,
        lambda shape: cute_rows(),
        "unchained",
        "cute/hopper's causal backward, chained candidates against FA4",
        __doc__,
    )


if __name__ == "__main__":
    main()
