"""cute/decode's ``MERGE_SLABS_FROM_SPLIT`` A/B (off, the earlier merge, against on, the default since this A/B), in one
process.

ncu on an H200 (``results/h200/decode-ncu-2026-11-30-fifth/``, seed 47 row 4: B=64 H=8 Hkv=1 Sq=16 D=256
paged(256) ragged 17..33118, 128 packed rows) put cute/decode's merge kernel at 49 µs beside a 249 µs split
kernel, compute-bound: under the balanced split each of its 4096 CTAs' threads plans the whole batch twice to
find its item's slabs. With the knob on the item's first share stores them and the merge reads two ints
(``cute_impl/_decode_plan.py`` says why). Rows: seed 47 row 4; seed 43 row 2 (B=64 H=128 Hkv=16 Sq=4 D=64 ragged
17..16666: 4096 merge CTAs too, each planning 64 sequences); seed 43 row 0 (B=2 H=256 Hkv=32 Sq=4 D=64 paged(64):
a batch of two, nothing to save: the control). Both settings keep the balanced split as committed; each is
checked against fp64 on a poisoned output, then timed four ways beside a ``torch.sum`` over the step's bytes
(``bench/cute_balanced_ab.py``'s machinery: ``bench/decode_fewpairs.py``'s timing modes). Writes ``balanced.csv``
and ``balanced.md`` under ``--out``.

    python -m bench.cute_merge_plan_ab --out runs/cute-merge-plan     # from the project root, on a GPU
"""

from __future__ import annotations

import sys

from bench import cute_balanced_ab, require_gpu

# (seed, index into random_cases(8, seed)): seed 47 row 4, seed 43 rows 2 and 0, in the order timed.
CASES = ((47, 4), (43, 2), (43, 0))
# (rung, setting name, module switches) in the order timed, per shape.
SETTINGS = (
    ("cute/decode", "off", {"MERGE_SLABS_FROM_SPLIT": False}),
    ("cute/decode", "on", {"MERGE_SLABS_FROM_SPLIT": True}),
)
MODULES = {"cute/decode": "cute_impl.decode"}
TITLE = "cute/decode MERGE_SLABS_FROM_SPLIT A/B (bench/cute_merge_plan_ab.py)"


def main(argv: list[str] | None = None) -> int:
    args = cute_balanced_ab.arguments(argv, __doc__, "runs/cute-merge-plan")
    require_gpu("bench.cute_merge_plan_ab")
    return cute_balanced_ab.run(args, SETTINGS, MODULES, CASES, TITLE)


if __name__ == "__main__":
    sys.exit(main())
