"""Issue #38: triton/decode's balanced-split switch, "ragged" (committed) against "ragged-split".

"ragged" gives every call with ``cache_seqlens`` the balanced split; "ragged-split" (gluon's and cute's
default since the seventh stop of 2026-11-29) only the calls over more than one sequence whose split rule
splits them: where one sequence is all the work (B=1, as in a generate() of one prompt) or the items alone
fill the GPU, the balanced grid only adds CTAs (gluon at B=1 128k: 136.8 µs padded against 144.0 balanced,
``results/h200/decode-balanced-gluon-cute/``). Seed 31's B=32 Hkv=32 row (gluon's rule: one split, 124.3
padded against 160.8; triton/decode's balanced 165.8) gets two splits from triton's rule, so both switches
balance it: its ``never`` row (the padded split) says what the balanced kernel costs there.

In one process, shape by shape, this times triton/decode with both switches and "never", and gluon/decode
as committed, beside a ``torch.sum`` over exactly the step's bytes, with ``bench/cute_balanced_ab.py``'s
machinery (each setting checked against fp64 on a poisoned output, then timed four ways), on seed 31's two
ragged rows (the B=32 Hkv=32 one included), seed 37's two, and the two full caches given as lengths.
Writes ``balanced.csv`` and ``balanced.md`` under ``--out``.

    python -m bench.triton_balanced_ab --out runs/triton-balanced     # from the project root, on a GPU
"""

from __future__ import annotations

import sys

from bench import cute_balanced_ab, require_gpu

# Seed 31's row 6 is the B=32 H=512 Hkv=32 Sq=8 D=64 paged(64) ragged row (22..4186 keys).
CASES = ((31, 0), (31, 6), (37, 3), (37, 6), (8, 8192, 8), (1, 131072, 8))
SETTINGS = (
    ("triton/decode", "ragged", {"BALANCED_SPLIT": "ragged"}),
    ("triton/decode", "ragged-split", {"BALANCED_SPLIT": "ragged-split"}),
    ("triton/decode", "never", {"BALANCED_SPLIT": "never"}),
    ("gluon/decode", "committed", {}),
)
MODULES = {"triton/decode": "triton_impl.decode", "gluon/decode": "triton_impl.gluon.decode"}


def main(argv: list[str] | None = None) -> int:
    args = cute_balanced_ab.arguments(argv, __doc__, "runs/triton-balanced")
    require_gpu("bench.triton_balanced_ab")
    return cute_balanced_ab.run(args, SETTINGS, MODULES, CASES)


if __name__ == "__main__":
    sys.exit(main())
