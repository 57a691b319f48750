"""gluon/decode's balanced split A/B (``BALANCED_SPLIT``, issue #38): "never" (committed) against "always".

On seed 31's B=16 MQA Sq=8 D=256 paged(32) ragged row (23..138969 keys, 453 MB: the split rule gives
gluon/decode 2048 CTAs, 1143 of them without a key) and its B=32 H=512 Hkv=32 Sq=8 D=64 paged(64) ragged
row (22..4186), and on two full caches passed with cache_seqlens (B=8 Hkv=8 8k, B=1 Hkv=8 128k: what
"ragged" would cost where the rule's splits are already even), in one process, it times gluon/decode with
the switch "never" and "always" (shares per SM at most the CTA slots its ring leaves: ``BALANCED_SHARES_BY_SLOTS``),
"always-2/SM" (triton/decode's two shares an SM), and triton/decode as committed (its balanced split on every
call with cache_seqlens), each first checked against fp64 on a poisoned output, beside a ``torch.sum`` over
exactly the step's bytes; ``bench/cute_balanced_ab.py``'s machinery (``bench/decode_fewpairs.py``'s four
timing modes, % of the read bandwidth measured in the same process). Writes ``balanced.csv`` and
``balanced.md`` under ``--out``.

    python -m bench.gluon_balanced_ab --out runs/gluon-balanced     # from the project root, on a GPU
"""

from __future__ import annotations

import sys

from bench import cute_balanced_ab, require_gpu

# Seed 31's ragged rows (indices into random_cases(8, seed=31)), then the full caches (batch, Sk, Hkv).
CASES = ((31, 0), (31, 6), (8, 8192, 8), (1, 131072, 8))
# (rung, setting name, module switches) in the order timed, per shape.
SETTINGS = (
    ("gluon/decode", "never", {"BALANCED_SPLIT": "never"}),
    ("gluon/decode", "always", {"BALANCED_SPLIT": "always"}),
    ("gluon/decode", "always-2/SM", {"BALANCED_SPLIT": "always", "BALANCED_SHARES_BY_SLOTS": False}),
    ("triton/decode", "committed", {}),
)
MODULES = {"gluon/decode": "triton_impl.gluon.decode", "triton/decode": "triton_impl.decode"}
TITLE = "gluon/decode balanced split A/B (bench/gluon_balanced_ab.py)"


def main(argv: list[str] | None = None) -> int:
    args = cute_balanced_ab.arguments(argv, __doc__, "runs/gluon-balanced")
    require_gpu("bench.gluon_balanced_ab")
    return cute_balanced_ab.run(args, SETTINGS, MODULES, CASES, TITLE)


if __name__ == "__main__":
    sys.exit(main())
