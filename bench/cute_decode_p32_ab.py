"""cute/decode's ``WIDE_M_TILE`` A/B (off, as committed, against on: D=128's 64-row tiles of 4 warps × 16 rows, so
that 33 to 64 packed rows take one M tile, not two 32-row tiles), in one process.

An H200 ``compare.py --decode --decode-random 8 --decode-seed 59`` (Triton 3.6, CuTe DSL 4.8.1) timed seed 59 row 2
(B=64 H=32 Hkv=8 Sq=16 Sk=26368 D=128 paged(32) ragged 18..17006: group 4 × Sq 16 = 64 packed rows, 512 items) at
cute/decode 447.9 µs (48 % of the read bandwidth), gluon/decode 274.5 (78 %) and triton/decode 313.9 (68 %) on the same
balanced plan. Off, cute launches two 32-row M tiles per share (264 shares a tile, 1552 CTAs): each reads the share's
K/V from L2 and runs the key loop, 544 instructions a warp a 64-key block (sm_90a), 1088 for the 64 rows; on, one
64-row tile (528 shares, 1040 CTAs), 682 for the 64 rows, every K/V byte to one CTA (``_decode_warps.WIDE_M_TILES``).

Rows (:func:`cases`, in the order timed): seed 59 row 2; its lengths on a contiguous cache, in pages of 128 and of 64
keys (the knob changes all four); Sq=1 (4 packed rows) and D=64 (a 64-row tile already): the controls, whose plan the
knob leaves. Each setting is checked against fp64 on a poisoned output, then timed four ways beside a ``torch.sum``
over the step's bytes (``bench/cute_balanced_ab.py``'s machinery). Writes ``balanced.csv`` and ``balanced.md`` under
``--out``.

    python -m bench.cute_decode_p32_ab --out runs/cute-decode-p32     # from the project root, on a GPU
"""

from __future__ import annotations

import sys

from bench import cute_balanced_ab, require_gpu

# (setting name, module switches) in the order timed, per shape; one rung.
SETTINGS = (
    ("cute/decode", "off", {"WIDE_M_TILE": False}),
    ("cute/decode", "on", {"WIDE_M_TILE": True}),
)
MODULES = {"cute/decode": "cute_impl.decode"}
TITLE = "cute/decode WIDE_M_TILE A/B (bench/cute_decode_p32_ab.py)"
# Seed 59 row 2: random_cases(8, SEED)[INDEX].
SEED, INDEX = 59, 2


def cases() -> tuple:
    """Seed 59 row 2 and its neighbours (module docstring), each on the row's lengths."""
    from common.measure.decode_sweep import DecodeCase, random_cases

    row = random_cases(8, SEED)[INDEX]
    changes = ({}, {"page_size": 0}, {"page_size": 128}, {"page_size": 64}, {"seqlen_q": 1}, {"head_dim": 64})
    return tuple(DecodeCase(row.problem.with_(**change), row.lengths) for change in changes)


def main(argv: list[str] | None = None) -> int:
    args = cute_balanced_ab.arguments(argv, __doc__, "runs/cute-decode-p32")
    require_gpu("bench.cute_decode_p32_ab")
    return cute_balanced_ab.run(args, SETTINGS, MODULES, cases(), TITLE)


if __name__ == "__main__":
    sys.exit(main())
