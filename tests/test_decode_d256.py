"""Issue #38's D=256 packed rows: ``WIDE_D256`` in triton/decode (on by default), 128-row tiles on 8 warps for more
than 64 packed rows (group · Sq) at D=256, where the knob off takes 32-row tiles on 4 warps; the fused merge of a
128-row tile runs in 32-row chunks (``merge_in_chunks``). By default only a paged cache takes the tile now (a contiguous
one takes the 64-row wgmma tiles: ``WGMMA_D256_CONTIGUOUS_ALL_ROWS``, tests/test_decode_d256_rows.py); the tests here
turn that switch off, so the knob's kernels are checked on contiguous caches too.

CPU: off, 32-row tiles; on, the tile, warps and M tiles of the shapes it is for (and none of the others, 64 rows or
fewer included; none in a release of ``WIDE_D256_SPILLS``); triton/decode with it on against fp64 under the
interpreter (128 rows on a full cache forced into two splits, and paged ragged; 256 rows in two tiles, also by the
two-launch merge; 80 rows padded to one tile on the balanced split); a planted grid that drops the second M tile, a
planted packed-row → head mapping and a planted chunked merge that stores every chunk at the first chunk's rows fail
the check. Static: the knob's split kernel (with the two-launch merge kernel) and balanced kernel compile for sm_90a
without spills at 128 rows, contiguous and paged, causal and not, with the LSE, one CTA an SM; under a release of
``WIDE_D256_SPILLS`` the test holds the spill that keeps the knob off there. GPU (``gpu``;
``bench/decode_d256_wide_ab.sh``): the knob against fp64 on a poisoned output, on seed 47's paged row's kind (the
default's tile), 80 rows padded to one tile and 256 rows in two tiles.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from common.contract.problem import Problem
from common.toolchain.releases import triton_release
from tests._helpers import json_from_child

# The same shapes' builder, CPU-only mark, GPU check and interpreter check (seed 5, offset 0.5, poisoned output)
# as the other packed-row knobs' tests.
from tests.test_decode_packed import _interpreter_check
from tests.test_decode_wide import _problem, check_on_gpu, interpreter_only
from triton_impl import decode


def _plan(problem: Problem) -> tuple[int, int, int, int, int]:
    """(rows a CTA takes, warps, M tiles, key block, CTA slots the split rule counts)."""
    config = decode.tile_config(problem)
    return (
        decode.block_m_for(problem), config.num_warps, decode.m_blocks_for(problem), config.block_n,
        decode.split_policy(problem).ctas_per_sm,
    )  # fmt: skip


# (group, Sq, D) -> the plan with the knob on (None: as with it off): seed 47's paged row's kind (128 rows), 80 rows
# padded to one 128-row tile, 256 rows in two; 64 rows or fewer at D=256 (seed 47's B=1 row's 64, 40, 32) and D=128's
# many rows keep theirs.
D256_PLANS = {
    (8, 16, 256): (128, 8, 1, 16, 1), (5, 16, 256): (128, 8, 1, 16, 1), (16, 16, 256): (128, 8, 2, 16, 1),
    (16, 4, 256): None, (5, 8, 256): None, (4, 8, 256): None, (16, 1, 256): None, (8, 16, 128): None,
}  # fmt: skip


def test_wide_d256_changes_only_the_shapes_of_more_than_64_rows_at_d256(monkeypatch: pytest.MonkeyPatch):
    assert decode.WIDE_D256 is True and decode.WIDE_D256_ABOVE_ROWS == 64, "the measured default"
    monkeypatch.setattr(decode, "WIDE_D256_SPILLS", ())
    monkeypatch.setattr(decode, "WGMMA_D256", False)  # 17-64 rows' own tile (tests/test_decode_d256_rows.py)
    for (group, seqlen_q, head_dim), wide in D256_PLANS.items():
        problem = _problem(2, 4, group, seqlen_q, 4096, head_dim)
        monkeypatch.setattr(decode, "WIDE_D256", False)
        narrow = _plan(problem)
        assert narrow[0] <= (32 if head_dim == 256 else 128), problem.describe()
        monkeypatch.setattr(decode, "WIDE_D256", True)
        assert _plan(problem) == (wide or narrow), problem.describe()


def test_wide_d256_stands_down_in_a_release_whose_kernels_spill(monkeypatch: pytest.MonkeyPatch):
    problem = _problem(2, 4, 8, 16, 4096, 256)
    monkeypatch.setattr(decode, "WIDE_D256", False)
    narrow = _plan(problem)
    monkeypatch.setattr(decode, "WIDE_D256", True)
    monkeypatch.setattr(decode, "WIDE_D256_SPILLS", (triton_release(),))
    assert _plan(problem) == narrow


def test_wide_d256_launches_its_warps_and_paged_stages(monkeypatch: pytest.MonkeyPatch):
    _wide_d256(monkeypatch)
    assert decode.launch_options(_problem(2, 1, 8, 16, 4096, 256)) == {"num_warps": 8, "num_stages": 3, "maxnreg": None}
    paged = _problem(2, 1, 8, 16, 4096, 256, has_cache_seqlens=True, page_size=256)
    assert decode.launch_options(paged)["num_stages"] == 3 + decode.PAGED_EXTRA_STAGES


# ----------------------------------------------------------------------------------------------------
# triton/decode with the knob against fp64 under the interpreter
# ----------------------------------------------------------------------------------------------------
# 8 heads of a group × Sq 16 = 128 packed rows at D=256 (seed 47's paged row's kind, one tile merged in 32-row
# chunks): a full cache of 77 keys (four 16-key blocks and a tail under the causal diagonal) forced into 2 splits (the
# fused merge), at B=2 Hkv=2 so that the chunks' partial rows start past 0; pages of 16 keys over a ragged batch (a
# sequence of 1, one of 6 blocks and a tail, one ending on a block); 16 × 16 = 256 rows in two tiles; 5 × 16 = 80 rows
# (padded to one 128-row tile) on a ragged 1k cache the rule splits: the balanced split's kernel, on 6 forced shares
# (the host's plan on the interpreter's 132 SMs would take long at D=256).
INTERPRETER_CASES = {
    "full-split": (_problem(2, 2, 8, 16, 77, 256, dtype=torch.float32), None, 2),
    "paged-ragged": (_problem(3, 1, 8, 16, 112, 256, dtype=torch.float32, has_cache_seqlens=True, page_size=16),
                     (1, 105, 64), None),
    "two-tiles": (_problem(1, 1, 16, 16, 40, 256, dtype=torch.float32), None, 2),
    "balanced-ragged": (_problem(3, 1, 5, 16, 1024, 256, dtype=torch.float32, has_cache_seqlens=True),
                        (1, 1000, 517), 6),
}  # fmt: skip


def _wide_d256(monkeypatch: pytest.MonkeyPatch) -> None:
    """The knob on, in whatever release runs the interpreter, contiguous caches included (by default those take the
    wgmma tile past 64 rows: ``WGMMA_D256_CONTIGUOUS_ALL_ROWS``, tests/test_decode_d256_rows.py)."""
    monkeypatch.setattr(decode, "WIDE_D256", True)
    monkeypatch.setattr(decode, "WIDE_D256_SPILLS", ())
    monkeypatch.setattr(decode, "WGMMA_D256_CONTIGUOUS_ALL_ROWS", False)


@interpreter_only
@pytest.mark.parametrize("case", sorted(INTERPRETER_CASES))
def test_triton_wide_d256_against_fp64(case: str, monkeypatch: pytest.MonkeyPatch):
    _wide_d256(monkeypatch)
    problem, lengths, num_splits = INTERPRETER_CASES[case]
    rows = problem.kv_group * problem.seqlen_q
    assert _plan(problem)[:3] == (128, 8, -(-rows // 128))
    assert decode.balanced_split(problem, torch.device("cpu")) == (case == "balanced-ragged")
    result = _interpreter_check(problem, lengths, num_splits)
    assert result.ok, f"{problem.describe()}: {result.summary()}"


@interpreter_only
def test_triton_wide_d256_two_launch_merge_against_fp64(monkeypatch: pytest.MonkeyPatch):
    """The two-launch path (``FUSED_MERGE = False``: the merge kernel, in chunks too) on 256 rows in two tiles."""
    _wide_d256(monkeypatch)
    monkeypatch.setattr(decode, "FUSED_MERGE", False)
    result = _interpreter_check(*INTERPRETER_CASES["two-tiles"])
    assert result.ok, result.summary()


@triton.jit
def _packed_rows_of_the_first_tile(m_block, kv_head, group, seqlen_q, BLOCK_M: tl.constexpr):
    """A planted mapping: every M tile's packed rows as the first tile's (its offset m_block · BLOCK_M forgotten)."""
    offs_r = tl.arange(0, BLOCK_M)
    return kv_head * group + offs_r // seqlen_q, offs_r % seqlen_q, offs_r < group * seqlen_q


@triton.jit
def _merge_every_chunk_as_the_first(
    partials, partial_offset, outputs, batch, kv_head, m_block, group, heads, seqlen_q, rows, num_splits,
    RETURN_LSE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, SPLITS_PER_STEP: tl.constexpr,
):  # fmt: skip
    """A planted chunked merge: every chunk merges and stores the tile's first chunk's rows (its index forgotten)."""
    OutPartial, LsePartial = partials
    Out, Lse, stride_ob, stride_oh, stride_om = outputs
    chunk_rows: tl.constexpr = decode.MERGE_CHUNK_ROWS
    for _ in tl.static_range(BLOCK_M // chunk_rows):
        chunk_block = m_block * (BLOCK_M // chunk_rows)
        head, offs_m, row_ok = decode.packed_rows(chunk_block, kv_head, group, seqlen_q, chunk_rows)
        packed_row = chunk_block * chunk_rows + tl.arange(0, chunk_rows)
        out, lse = decode.merge_splits(
            OutPartial, LsePartial, partial_offset + packed_row, row_ok, rows, num_splits,
            HEAD_DIM=HEAD_DIM, BLOCK_M=chunk_rows, SPLITS_PER_STEP=SPLITS_PER_STEP,
        )  # fmt: skip
        out_rows = (Out, batch * stride_ob + head * stride_oh + offs_m * stride_om)
        row = (batch * heads + head) * seqlen_q + offs_m
        decode.store_output(out_rows, Lse, out, lse, row, row_ok, HEAD_DIM=HEAD_DIM, RETURN_LSE=RETURN_LSE)


# bug -> (decode's name, replacement, case that passes unplanted).
PLANTED = {
    "second M tile dropped from the grid": ("m_blocks_for", lambda problem: 1, "two-tiles"),
    "M tiles mapped to the first tile's rows": ("packed_rows", _packed_rows_of_the_first_tile, "two-tiles"),
    "merge chunks stored at the first chunk's rows": ("merge_in_chunks", _merge_every_chunk_as_the_first, "full-split"),
}


@interpreter_only
@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_wide_d256_bug_fails_the_check(bug: str, monkeypatch: pytest.MonkeyPatch):
    """Each planted bug fails the fp64 check (poisoned output) of a case that passes unplanted."""
    _wide_d256(monkeypatch)
    name, replacement, case = PLANTED[bug]
    monkeypatch.setattr(decode, name, replacement)
    result = _interpreter_check(*INTERPRETER_CASES[case])
    assert not result.ok, f"{bug}: the check passed a wrong kernel ({result.summary()})"


# ----------------------------------------------------------------------------------------------------
# sm_90a: the knob's split and balanced kernels without spills, one CTA an SM
# ----------------------------------------------------------------------------------------------------
_COMPILE_SCRIPT = r"""
import json, sys
import torch
from common.contract.problem import Problem
from tests._helpers import triton_decode_sm90_facts
from triton_impl import decode

decode.WIDE_D256, decode.WIDE_D256_SPILLS, decode.WGMMA_D256_CONTIGUOUS_ALL_ROWS = True, (), False
results = []
for kernel, causal, page_size, group, seqlen_q in json.loads(sys.argv[1]):
    problem = Problem(64, group, seqlen_q, 40448, 256, dtype=torch.bfloat16, causal=causal, kv_heads=1,
                      causal_alignment="bottom_right", has_cache_seqlens=True, return_lse=True, page_size=page_size)
    results.append(triton_decode_sm90_facts(problem, kernel)[1])
print(json.dumps(results))
"""
# (kernel, causal, page size, group, Sq): the split kernel (full caches, with the fused merge) and the balanced one
# (ragged), contiguous and in pages of 256, causal (bottom-right) and not, with the LSE, at B=64 MQA: seed 47's paged
# row's kind (group 8 × Sq 16, the 128-row tile).
COMPILES = [
    (kernel, causal, page, 8, 16) for kernel in ("split", "balanced") for causal in (True, False) for page in (0, 256)
]
SM_REGISTERS, SM_SHARED_BYTES, CTA_RESERVED_SHARED_BYTES = 65536, 233472, 1024


@pytest.mark.static
def test_wide_d256_kernels_compile_for_sm90_without_spills():
    compiled = json_from_child(["-c", _COMPILE_SCRIPT, json.dumps(COMPILES)], timeout=1200)
    spilling = triton_release() in decode.WIDE_D256_SPILLS
    for key, result in zip(COMPILES, compiled, strict=True):
        where = f"Triton {triton.__version__} WIDE_D256 {key}: {result}"
        assert result["threads"] == 256 and result["block_m"] == key[3] * key[4], where
        assert result["spill_bytes"] == 0 or spilling, where
        assert result["registers"] * result["threads"] <= SM_REGISTERS, where
        assert result["shared_bytes"] + CTA_RESERVED_SHARED_BYTES <= SM_SHARED_BYTES, where
    # A release in WIDE_D256_SPILLS must still spill somewhere, so that a release that stops shows.
    assert spilling == any(result["spill_bytes"] for result in compiled), compiled


# ----------------------------------------------------------------------------------------------------
# GPU: triton/decode with the knob against fp64
# ----------------------------------------------------------------------------------------------------
# Seed 47's paged row's kind, smaller: MQA group 8 × Sq 16 (one 128-row tile) in pages of 256 over a ragged batch (a
# sequence of 17 keys, a full one, a tail); group 5 × Sq 16 = 80 rows (padded to one tile) on a full 8k cache the rule
# splits; 16 × 16 = 256 rows (two 128-row tiles, each merged in chunks) on a full 3000-key cache.
GPU_CASES = {
    "paged-128rows": (_problem(4, 1, 8, 16, 4352, 256, has_cache_seqlens=True, page_size=256), (17, 4352, 1000, 77)),
    "full-80rows": (_problem(1, 4, 5, 16, 8192, 256), None),
    "full-256rows": (_problem(2, 2, 16, 16, 3000, 256), None),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_gpu_wide_d256_against_fp64(case: str, monkeypatch: pytest.MonkeyPatch):
    """The knob's kernels, contiguous ones included (the default's tile for paged caches only)."""
    monkeypatch.setattr(decode, "WGMMA_D256_CONTIGUOUS_ALL_ROWS", False)
    problem, lengths = GPU_CASES[case]
    if decode.tile_config(problem) != decode.WIDE_D256_CONFIG:
        pytest.skip(f"WIDE_D256 stands down under Triton {triton.__version__} (WIDE_D256_SPILLS)")
    result = check_on_gpu("triton/decode", problem, lengths, seed=len(case))
    assert result.ok, f"triton/decode WIDE_D256 {problem.describe()}: {result.summary()}"


# ----------------------------------------------------------------------------------------------------
# bench/decode_d256_wide_ab.sh and bench/decode_d256_wide.py without a GPU
# ----------------------------------------------------------------------------------------------------
def test_d256_bench_times_seed_47s_rows_first_and_each_setting_where_it_changes_the_plan():
    from bench.decode_d256_wide import d256_cases, settings_to_time

    cases = dict(d256_cases())
    described = [case.describe() for case in cases.values()]
    assert described[0].startswith("B=64 H=8 Hkv=1 Sq=16 Sk=40448 D=256") and "paged(256)" in described[0]
    assert described[1].startswith("B=1 H=64 Hkv=4 Sq=4 Sk=71168 D=256")
    assert all(case.problem.head_dim == 256 for case in cases.values())
    # 128 packed rows of a paged cache take every setting; 64 rows are the default's 32-row tiles in each (the
    # controls), and so are the contiguous 128-row rows since WGMMA_D256_CONTIGUOUS_ALL_ROWS gave them the wgmma tile.
    every, controls = ["default", "narrow", "wide-d256-deep"], ["default"]
    expected = {"seed47-4": every, "seed47-6": controls, "long-mqa-128k": controls, "128rows-4k": controls,
                "64rows-paged": controls}  # fmt: skip
    if triton_release() in decode.WIDE_D256_SPILLS:
        expected = {label: ["default"] for label in expected}
    assert {label: settings_to_time(case.problem) for label, case in cases.items()} == expected


def test_d256_bench_table_compares_each_setting_with_the_default():
    from bench.decode_d256_wide import markdown

    row = {"label": "seed47-6", "shape": "S", "status": "ok", "reason": "", "pct_roofline": 50.0}
    rows = [
        {**row, "setting": "default", "plan": "128x1 n16x3 w8", "us": 100.0, "pct_read_bw": 40.0},
        {**row, "setting": "narrow", "plan": "32x4 n32x3 w4", "us": 80.0, "pct_read_bw": 50.0},
        {**row, "setting": "wide-d256-deep", "status": "wrong", "plan": "128x1 n16x5", "us": 1.0, "pct_read_bw": 1.0},
    ]  # fmt: skip
    line = "| seed47-6: S | 100.0 µs (40 %; 50 % roofline; 128x1 n16x3 w8) | 80.0 µs (50 %; 32x4 n32x3 w4) | wrong |"
    assert f"{line} 0.80 | — |" in markdown(rows, 4421.0, 672.0)


def test_d256_ab_script_names_the_real_test_file_and_module():
    script = (Path(__file__).parents[1] / "bench" / "decode_d256_wide_ab.sh").read_text()
    assert "tests/test_decode_d256.py" in script and "-m gpu" in script
    assert re.search(r"python3 -m bench\.decode_d256_wide\b", script)
