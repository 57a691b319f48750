"""Issue #38's D=256 packed rows in cute/decode: ``_decode_warps.ROW_SPLIT_MAX_TILE_M`` {256: 32} (``tile32``, the
default since this A/B) against 16-row D=256 tiles, in one process.

Seed 43's B=16 H=80 Hkv=16 Sq=4 Sk=2048 D=256 row (group 5 x Sq 4 = 20 packed rows, 537 MB) ran at 72 % of the read
bandwidth in cute/decode (169.9 µs; triton and gluon 87 %): D=256's 16-row tile cuts the 20 rows into two M tiles,
so two CTAs stream every (batch, KV head)'s K/V (1074 MB from L2), 512 CTAs at one an SM. ``tile32`` takes them in
one 32-row tile of 2 x 2 warps (the row split), 256 CTAs, every byte once. Settings (``applied``):

* ``default``: D=256's 16-row tiles (``ROW_SPLIT_MAX_TILE_M = {}``, the default this A/B measured against);
* ``tile32``: ``ROW_SPLIT_MAX_TILE_M = {256: 32}`` (with the row split, on by default).

Shapes (:func:`d256_cases`, in the order timed): seed 43's row; seed 43's ragged 20-row D=256 row (the balanced
split); 64 packed rows at D=256 (four 16-row tiles or two 32-row ones); 32 rows paged at full length (balanced);
20 rows on one long sequence (the split rule's splits double as the M tiles halve); and a control whose plan the
knob does not change (seed 43's 16-row MQA paged ragged row: the A/B's noise). Every setting is timed on every
shape, checked against fp64 on a poisoned output first (median, L2 flushed), the settings interleaved for
``--rounds`` rounds. Writes ``cute_decode_d256.csv`` and ``cute_decode_d256.md`` under ``--out``.

    python -m bench.cute_decode_d256 --out runs/cute-decode-d256       # from the project root, on a GPU
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

SETTINGS = ("default", "tile32")
TILE32 = {256: 32}


def d256_cases() -> list[tuple[str, object]]:
    """(label, DecodeCase) in the order timed (module docstring), seed 43's row first."""
    from common.measure.decode_sweep import DecodeCase, decode_problem, random_cases

    def full(batch: int, seqlen_k: int, kv_heads: int, group: int, seqlen_q: int, page_size: int = 0) -> DecodeCase:
        problem = decode_problem(batch, seqlen_k, kv_heads, heads=kv_heads * group, head_dim=256, seqlen_q=seqlen_q,
                                 page_size=page_size)  # fmt: skip
        return DecodeCase(problem, (seqlen_k,) * batch if page_size else None)

    seed43 = random_cases(8, 43)
    return [
        ("seed43-6", seed43[6]),
        ("seed43-4-ragged", seed43[4]),
        ("64rows-4k", full(16, 4096, 8, 16, 4)),
        ("32rows-paged-8k", full(8, 8192, 8, 8, 4, page_size=64)),
        ("20rows-long-128k", full(1, 131072, 4, 5, 4)),
        ("control-seed43-1", seed43[1]),
    ]


@contextlib.contextmanager
def applied(setting: str) -> Iterator[None]:
    """cute/decode's switches for ``setting`` (module docstring), restored after."""
    from cute_impl import _decode_warps

    saved = _decode_warps.ROW_SPLIT_MAX_TILE_M
    _decode_warps.ROW_SPLIT_MAX_TILE_M = dict(TILE32) if setting == "tile32" else {}
    try:
        yield
    finally:
        _decode_warps.ROW_SPLIT_MAX_TILE_M = saved


def main(argv: list[str] | None = None) -> int:
    from bench.cute_decode_rows import ab_arguments, time_settings

    args = ab_arguments("cute_decode_d256", argv, __doc__)
    return time_settings("cute_decode_d256", args, d256_cases(), lambda problem, device: list(SETTINGS), applied,
                         markdown)  # fmt: skip


def markdown(rows: list[dict], read_gbps: float) -> str:
    """This A/B's table (``bench.cute_decode_rows.settings_markdown``)."""
    from bench.cute_decode_rows import settings_markdown

    title = (
        f"cute/decode ROW_SPLIT_MAX_TILE_M {{256: 32}} A/B (bench/cute_decode_d256.py): µs per step, % of the read "
        f"bandwidth ({read_gbps:.0f} GB/s); plan: rows a tile x M tiles, warps along M x keys, stages, splits"
    )
    return settings_markdown(title, SETTINGS, rows)


if __name__ == "__main__":
    sys.exit(main())
