"""cute/decode's ``D256_TWO_CTAS`` A/B (off, as committed, against on: D=256's 32-row tiles on three 32-key stages,
two CTAs an SM), in one process.

ncu on an H200 (``results/h200/decode-ncu-2026-11-30-sixth/``, seed 53 row 0: B=3 H=64 Hkv=8 Sq=8 Sk=96000 D=256, a
full 2.36 GB cache, 64 packed rows in two 32-row M tiles) put cute/decode's split kernel at 742 µs, 3.47 TB/s (70 %
of the read bandwidth, the cache read once), latency-bound: three 64 KiB K + V stages (192 KiB) let one CTA of 4 warps
onto an SM, 1 warp a scheduler, 0.25 eligible. On, the ring is three 32-key stages (96 KiB, 112 KiB with the Q tile),
two CTAs an SM, and the split rule and the balanced target count two CTA slots an SM
(``cute_impl/_decode_warps.py``'s ``TWO_CTA_TILES``). Rows (:data:`CASES`, in the order timed): seed 53 row 0; seed
47 row 6 (B=1 H=64 Hkv=4 Sq=4 71k D=256: 61 %); seed 47 row 4 (B=64 MQA Sq=16 D=256 paged(256) ragged, balanced);
seed 53 row 1 (B=4 H=128 Hkv=16 Sq=16 D=256 paged(64) ragged, balanced); seed 53 row 2 (B=1 Hkv=2 Sq=4 366k D=128:
the control, whose plan the knob leaves). Each setting is checked against fp64 on a poisoned output, then timed four
ways beside a ``torch.sum`` over the step's bytes (``bench/cute_balanced_ab.py``'s machinery). Writes
``balanced.csv`` and ``balanced.md`` under ``--out``.

    python -m bench.cute_decode_d256_occ_ab --out runs/cute-decode-d256-occ     # from the project root, on a GPU
"""

from __future__ import annotations

import sys

from bench import cute_balanced_ab, require_gpu

# (seed, index into random_cases(8, seed)) in the order timed: the ncu row first, the D=128 control last.
CASES = ((53, 0), (47, 6), (47, 4), (53, 1), (53, 2))
# (rung, setting name, module switches) in the order timed, per shape.
SETTINGS = (
    ("cute/decode", "off", {"D256_TWO_CTAS": False}),
    ("cute/decode", "on", {"D256_TWO_CTAS": True}),
)
MODULES = {"cute/decode": "cute_impl.decode"}
TITLE = "cute/decode D256_TWO_CTAS A/B (bench/cute_decode_d256_occ_ab.py)"


def main(argv: list[str] | None = None) -> int:
    args = cute_balanced_ab.arguments(argv, __doc__, "runs/cute-decode-d256-occ")
    require_gpu("bench.cute_decode_d256_occ_ab")
    return cute_balanced_ab.run(args, SETTINGS, MODULES, CASES, TITLE)


if __name__ == "__main__":
    sys.exit(main())
