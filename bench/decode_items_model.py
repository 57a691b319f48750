"""Whether an item's M tiles share its K and V in L2: gluon/decode's items kernel on rows of the random sweep, modelled
both ways, beside the times measured on a GPU.

No GPU. ``bench/decode_model.py``'s fluid model (a CTA's fixed cost, then its K/V bytes streamed at the lesser of its
ring's Little's-law cap and an even share of the read bandwidth) replays the items kernel's tiles: every M tile of
every (batch, KV head), each as long as its sequence, on ``--slots`` CTAs that take the next tile as one ends, in the
kernel's order (an item's M tiles side by side) or longest first. Two readings of the bytes: **shared** (an item's
first M tile reads its K and V from HBM, the others hit L2) and **apart** (every M tile reads them from HBM). The
percentage is of the read bandwidth, over the bytes a step must read once (``DecodeCase.kv_bytes_read``), as
``compare.py --decode`` counts them. Where the measured share sits near "apart" and far under "shared", the M tiles'
second reads are a candidate limiter, which Nsight Compute's DRAM bytes of the launch settle (``bench/ncu.sh``).

    python -m bench.decode_items_model --rows 6007/4 151/1 --read-gbps 3108 --slots 264
"""

from __future__ import annotations

import argparse
import sys

from bench import decode_model
from common.measure.decode_sweep import DecodeCase, random_cases

BLOCK_M = 64  # gluon/decode's M tile
BLOCK_N = 64  # its items ring's key block at D=64 and at D=128's short caches


def tile_megabytes(case: DecodeCase, l2_shared: bool, longest_first: bool) -> list[float]:
    """MB each tile of ``case`` reads from HBM, in the order CTAs take them."""
    problem = case.problem
    lengths = case.lengths or (problem.seqlen_k,) * problem.batch
    m_tiles = -(-problem.kv_group * problem.seqlen_q // BLOCK_M)
    bytes_a_key = 2 * problem.head_dim * problem.dtype.itemsize
    tiles = []
    for length in lengths:
        for _ in range(problem.kv_heads):
            tiles += [(length, length * bytes_a_key / 1e6 if m == 0 or not l2_shared else 0.0) for m in range(m_tiles)]
    if longest_first:
        tiles.sort(key=lambda tile: -tile[0])
    return [megabytes for _, megabytes in tiles]


def modelled_pct(case: DecodeCase, args: argparse.Namespace, l2_shared: bool, longest_first: bool) -> float:
    """The modelled share of the read bandwidth, %."""
    ctas = ((args.fixed_us, megabytes, None) for megabytes in tile_megabytes(case, l2_shared, longest_first))
    cap = decode_model.stream_cap(args.in_flight, BLOCK_N, case.problem.head_dim)
    elapsed = decode_model.fluid_run(ctas, args.slots, cap, lambda tag, now: None, 0.1, args.read_gbps)
    return case.kv_bytes_read / (args.read_gbps * 1e3) / elapsed * 100


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", nargs="+", required=True, help="SEED/INDEX rows of the random sweep")
    parser.add_argument("--read-gbps", type=float, default=decode_model.READ_GBPS, help="the measured read bandwidth")
    parser.add_argument("--slots", type=int, default=264, help="the items kernel's CTAs (two an SM of 132)")
    parser.add_argument("--fixed-us", type=float, default=2.0, help="a tile's fixed cost the ring does not hide")
    parser.add_argument("--in-flight", type=int, default=5, help="key blocks a CTA keeps in flight")
    args = parser.parse_args(argv)
    print("| row | shape | shared | apart | shared, longest first | apart, longest first |")
    print("|---|---|---|---|---|---|")
    for row in args.rows:
        seed, index = (int(part) for part in row.split("/"))
        case = random_cases(index + 1, seed)[index]
        cells = [
            f"{modelled_pct(case, args, shared, longest):.0f} %"
            for longest in (False, True)
            for shared in (True, False)
        ]
        print(f"| {row} | {case.problem.describe()} | {' | '.join(cells)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
