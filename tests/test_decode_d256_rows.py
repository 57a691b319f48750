"""Issue #38's D=256 rows of one wgmma tile: ``WGMMA_D256`` in triton/decode (on by default), one 64-row M tile of one
warpgroup (fewer rows padded to it) for ``WGMMA_D256_FROM_ROWS`` to 64 packed rows (group · Sq) at D=256, where the
32-row tiles ran on mma.sync; and past 64 rows of a contiguous cache (``WGMMA_D256_CONTIGUOUS_ALL_ROWS``, on) 64-row
M tiles of the same kernel, where WIDE_D256's 128-row tiles ran (they keep the paged caches).

CPU: the switch on by default; off, the 32-row tiles; on, its tile, warps, key block and one CTA an SM on the shapes it
is for (17-64 rows at D=256) and nothing else (16 rows, WIDE_D256's 128, D=128); past 64 rows, the contiguous caches'
plans only; triton/decode with the switch on against fp64 under the interpreter (64 rows on a full cache forced into two
splits, merged in two 32-row chunks; 64 MQA rows of one token in pages of 16 over a ragged batch; 20 rows padded to 64
by the two-launch merge; 40 rows padded on the balanced split; 128 rows in two M tiles on a full cache, 208 rows in four
on the balanced split); a planted chunked merge that stores every chunk at the first chunk's rows, a planted tile that
maps its rows past 32 onto the first 32 and a planted mapping of every M tile onto the first tile's rows fail the check.
Static (the same binary whatever the M tiles: they are the grid's): the split kernel (with the two-launch merge kernel)
and balanced kernel for sm_90a, contiguous and in pages of 64: wgmma and no mma.sync, 64 rows, 4 warps, one CTA an SM by
shared memory and registers, spills at most the recorded bytes and none inside the key loops (SASS). GPU (``gpu``;
``bench/triton_decode_d256_rows_ab.sh``): the switch on against fp64 on a poisoned output, on the A/B rows' kinds, and
the default on 256 contiguous rows and 80 ragged ones (``bench/decode_d256_many_rows_ab.sh``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from common.toolchain.releases import triton_release
from tests._helpers import json_from_child

# The packed-row knobs' shapes, CPU-only mark, GPU check and interpreter check (seed 5, offset 0.5, poisoned output),
# and the WIDE_D256 tests' planted chunked merge.
from tests.test_decode_d256 import (
    CTA_RESERVED_SHARED_BYTES,
    SM_REGISTERS,
    SM_SHARED_BYTES,
    _merge_every_chunk_as_the_first,
    _packed_rows_of_the_first_tile,
    _plan,
)
from tests.test_decode_packed import _interpreter_check
from tests.test_decode_wide import _problem, check_on_gpu, interpreter_only
from triton_impl import decode

pytestmark = pytest.mark.slow

# (group, Sq, D): whether the switch gives the shape the 64-row tile. Seed 53's row 0 (8 × 8) and seed 47's row 6
# (16 × 4): 64 rows; 40 and 20 rows (padded to 64); seed 59's row 5 (8 × 4, 32 rows); 17 rows; 64 MQA heads of one
# token. Not: 16 rows, WIDE_D256's 128 rows, 64 rows at D=128.
D256_ROWS_SHAPES = {
    (8, 8, 256): True, (16, 4, 256): True, (5, 8, 256): True, (5, 4, 256): True, (8, 4, 256): True,
    (17, 1, 256): True, (64, 1, 256): True, (4, 4, 256): False, (16, 1, 256): False, (8, 16, 256): False,
    (8, 8, 128): False,
}  # fmt: skip


def test_wgmma_d256_changes_only_17_to_64_rows_at_d256(monkeypatch: pytest.MonkeyPatch):
    assert decode.WGMMA_D256 is True, "taken after its H200 A/B (results/h200/decode-triton-wgmma-d256/)"
    monkeypatch.setattr(decode, "WGMMA_D256_CONTIGUOUS_ALL_ROWS", False)  # past 64 rows: the test below
    for (group, seqlen_q, head_dim), taken in D256_ROWS_SHAPES.items():
        problem = _problem(2, 4, group, seqlen_q, 4096, head_dim)
        monkeypatch.setattr(decode, "WGMMA_D256", False)
        default = _plan(problem)
        monkeypatch.setattr(decode, "WGMMA_D256", True)
        expected = (64, 4, 1, 32, 1) if taken else default
        assert _plan(problem) == expected, problem.describe()
        if taken:
            assert default[0] <= 32, "the default's D=256 tiles of 17-64 rows are 32-row tiles"


# (group, Sq, page size) past 64 rows at D=256 -> the plan with WGMMA_D256_CONTIGUOUS_ALL_ROWS on (None: as off):
# contiguous 128, 80 (padded to two 64-row tiles) and 256 rows (seed 67's rows 0 and 7) on the wgmma tile; the same in
# pages of 256 (seed 47's row 4) keep WIDE_D256's tile, as do D=128's many rows.
CONTIGUOUS_PLANS = {
    (8, 16, 0): (64, 4, 2, 32, 1), (5, 16, 0): (64, 4, 2, 32, 1), (16, 16, 0): (64, 4, 4, 32, 1),
    (8, 16, 256): None, (16, 16, 256): None,
}  # fmt: skip


def test_contiguous_all_rows_changes_only_contiguous_caches_past_64_rows(monkeypatch: pytest.MonkeyPatch):
    assert decode.WGMMA_D256_CONTIGUOUS_ALL_ROWS is True, "taken (results/h200/decode-d256-many-rows/)"
    monkeypatch.setattr(decode, "WIDE_D256_SPILLS", ())
    for (group, seqlen_q, page_size), plan in CONTIGUOUS_PLANS.items():
        problem = _problem(2, 4, group, seqlen_q, 4096, 256, has_cache_seqlens=bool(page_size), page_size=page_size)
        monkeypatch.setattr(decode, "WGMMA_D256_CONTIGUOUS_ALL_ROWS", False)
        off = _plan(problem)
        assert off[:2] == (128, 8), f"{problem.describe()}: WIDE_D256's tile past 64 rows"
        monkeypatch.setattr(decode, "WGMMA_D256_CONTIGUOUS_ALL_ROWS", True)
        assert _plan(problem) == (plan or off), problem.describe()
    d128 = _problem(2, 4, 8, 16, 4096, 128)
    assert decode.tile_config(d128) == decode.WIDE_CONFIGS[128]


def test_wgmma_d256_launches_its_warps_and_paged_stages(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(decode, "WGMMA_D256", True)
    options = {"num_warps": 4, "num_stages": 4, "maxnreg": None}
    assert decode.launch_options(_problem(2, 1, 8, 8, 4096, 256)) == options
    paged = _problem(2, 1, 8, 8, 4096, 256, has_cache_seqlens=True, page_size=64)
    assert decode.launch_options(paged)["num_stages"] == 4 + decode.PAGED_EXTRA_STAGES


# ----------------------------------------------------------------------------------------------------
# triton/decode with the switch against fp64 under the interpreter
# ----------------------------------------------------------------------------------------------------
# 8 heads of a group × Sq 8 = 64 rows (seed 53's row 0's kind): a full cache of 77 keys (two 32-key blocks and a
# tail under the causal diagonal) forced into 2 splits (the fused merge, in two 32-row chunks), at B=2 Hkv=2 so that
# the chunks' partial rows start past 0; 64 MQA heads × Sq 1 in pages of 16 over a ragged batch (a sequence of 1, one
# of 3 blocks and a tail, one ending on a block), fp16; 5 × 4 = 20 rows padded to 64 (padding past the group's rows
# in both chunks) forced into 3 splits; 5 × 8 = 40 rows padded to 64 on a ragged 1k cache the rule splits: the
# balanced split's kernel on 6 forced shares.
INTERPRETER_CASES = {
    "full-split": (_problem(2, 2, 8, 8, 77, 256, dtype=torch.float32), None, 2),
    "paged-ragged-mqa": (_problem(3, 1, 64, 1, 112, 256, dtype=torch.float16, has_cache_seqlens=True, page_size=16),
                         (1, 105, 64), None),
    "padded-20rows": (_problem(1, 2, 5, 4, 200, 256, dtype=torch.float32), None, 3),
    "balanced-ragged": (_problem(3, 1, 5, 8, 1024, 256, dtype=torch.float32, has_cache_seqlens=True),
                        (1, 1000, 517), 6),
    "full-split-128rows": (_problem(2, 2, 8, 16, 77, 256, dtype=torch.float32), None, 2),
    "balanced-208rows": (_problem(2, 1, 13, 16, 1024, 256, dtype=torch.float16, has_cache_seqlens=True),
                         (40, 1000), 5),
}  # fmt: skip


def _wgmma_d256(monkeypatch: pytest.MonkeyPatch) -> None:
    """The switch on."""
    monkeypatch.setattr(decode, "WGMMA_D256", True)


@interpreter_only
@pytest.mark.parametrize("case", sorted(INTERPRETER_CASES))
def test_triton_wgmma_d256_against_fp64(case: str, monkeypatch: pytest.MonkeyPatch):
    _wgmma_d256(monkeypatch)
    problem, lengths, num_splits = INTERPRETER_CASES[case]
    rows = problem.kv_group * problem.seqlen_q
    assert _plan(problem)[0:3] == (64, 4, -(-rows // 64))
    assert decode.balanced_split(problem, torch.device("cpu")) == case.startswith("balanced")
    result = _interpreter_check(problem, lengths, num_splits)
    assert result.ok, f"{problem.describe()}: {result.summary()}"


@interpreter_only
def test_triton_wgmma_d256_two_launch_merge_against_fp64(monkeypatch: pytest.MonkeyPatch):
    """The two-launch path (``FUSED_MERGE = False``: the merge kernel, in chunks) on 20 rows padded to 64."""
    _wgmma_d256(monkeypatch)
    monkeypatch.setattr(decode, "FUSED_MERGE", False)
    result = _interpreter_check(*INTERPRETER_CASES["padded-20rows"])
    assert result.ok, result.summary()


@triton.jit
def _packed_rows_of_half_a_tile(m_block, kv_head, group, seqlen_q, BLOCK_M: tl.constexpr):
    """A planted mapping: a tile's rows past 32 read and write the first 32's (a tile sized for the 32-row default)."""
    offs_r = (m_block * BLOCK_M + tl.arange(0, BLOCK_M)) % 32
    return kv_head * group + offs_r // seqlen_q, offs_r % seqlen_q, offs_r < group * seqlen_q


# bug -> (decode's name, replacement, case that passes unplanted).
PLANTED = {
    "merge chunks stored at the first chunk's rows": ("merge_in_chunks", _merge_every_chunk_as_the_first, "full-split"),
    "tile rows past 32 mapped to the first 32": ("packed_rows", _packed_rows_of_half_a_tile, "full-split"),
    "M tiles mapped to the first tile's rows": ("packed_rows", _packed_rows_of_the_first_tile, "full-split-128rows"),
}


# One planted bug in a process of its own: a CI worker once ran the "first tile's rows" bug on its two-tile plan and saw
# the true rows (twice, at 13d8498 and c39da02), a state that earlier tests of the same worker leave and that no run
# of this file alone or beside its neighbours reproduces; a fresh interpreter starts from the module's defaults.
_PLANTED_PROBE = """
import json, sys
import pytest
from tests import test_decode_d256_rows as rows
from triton_impl import decode
with pytest.MonkeyPatch.context() as patch:
    rows._wgmma_d256(patch)
    patch.setattr(decode, "WGMMA_D256_CONTIGUOUS_ALL_ROWS", True)
    name, replacement, case = rows.PLANTED[sys.argv[1]]
    plan = list(rows._plan(rows.INTERPRETER_CASES[case][0])[:3])
    patch.setattr(decode, name, replacement)
    result = rows._interpreter_check(*rows.INTERPRETER_CASES[case])
print(json.dumps({"plan": plan, "ok": result.ok, "summary": result.summary()}))
"""


@interpreter_only
@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_wgmma_d256_bug_fails_the_check(bug: str):
    """Each planted bug fails the fp64 check (poisoned output) of a case that passes unplanted. The case's M tiles are
    the premise of the planted mappings (one 128-row tile would hide the first tile's rows bug): the switch that gives
    them is pinned and the plan asserted."""
    done = subprocess.run(
        [sys.executable, "-c", _PLANTED_PROBE, bug], cwd=Path(__file__).parents[1], env=os.environ.copy(),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    child = json.loads(done.stdout.strip().splitlines()[-1])
    problem = INTERPRETER_CASES[PLANTED[bug][2]][0]
    assert child["plan"] == [64, 4, -(-problem.kv_group * problem.seqlen_q // 64)], child
    assert not child["ok"], f"{bug}: the check passed a wrong kernel ({child['summary']})"


# ----------------------------------------------------------------------------------------------------
# sm_90a: the split and balanced kernels on wgmma, one CTA an SM
# ----------------------------------------------------------------------------------------------------
_COMPILE_SCRIPT = r"""
import json, sys
import torch
from common.contract.problem import Problem
from common.reporting.static import cubin_sass, sass_loops
from tests._helpers import triton_decode_sm90_facts
from triton_impl import decode

def local_accesses_in_wgmma_loops(cubin):
    # LDL/STL inside any loop that issues a warpgroup GEMM.
    loops = [body for _, body in sass_loops(cubin_sass(cubin)) if any(op.startswith("HGMMA") for op in body)]
    return sum(op.startswith(("LDL", "STL")) for body in loops for op in body)

results = []
decode.WGMMA_D256 = True
for kernel, page_size, group, seqlen_q in json.loads(sys.argv[1]):
    problem = Problem(3, 8 * group, seqlen_q, 96000, 256, dtype=torch.bfloat16, causal=True, kv_heads=8,
                      causal_alignment="bottom_right", has_cache_seqlens=kernel == "balanced" or bool(page_size),
                      return_lse=True, page_size=page_size)
    binary, facts = triton_decode_sm90_facts(problem, kernel)
    results.append({**facts, "wgmma": binary.ptx.count("wgmma.mma_async"), "mma_sync": binary.ptx.count("mma.sync"),
                    "loop_local": local_accesses_in_wgmma_loops(binary.cubin)})
print(json.dumps(results))
"""
# (kernel, page size, group, Sq): the split kernel (a full cache, with the fused merge) and the balanced one,
# contiguous and in pages of 64, causal bottom-right with the LSE: seed 53's row 0's kind (B=3 Hkv=8, 8 × 8 rows), and
# 5 × 4 = 20 rows padded to 64 on the split kernel.
COMPILES = [(kernel, page, 8, 8) for kernel in ("split", "balanced") for page in (0, 64)] + [("split", 0, 5, 4)]
# The most spill bytes (local and stack, the split kernel's with the merge kernel's) the kernels show (sm_90a, bf16;
# fp16's split kernel 272 under 3.8), per Triton release: 64-192 under 3.6 and 3.8, the
# split kernel 256 under 3.9. They are the prologue's merge addresses and the partials' store, never inside a loop
# of wgmmas (the key loops; the test checks the SASS). The test holds them so that a release that spills more shows.
SPILL_BYTES_AT_MOST = {"3.9": 256}.get(triton_release(), 192)
MAX_REGISTERS = 255


@pytest.mark.static
def test_wgmma_d256_kernels_compile_for_sm90_on_wgmma():
    compiled = json_from_child(["-c", _COMPILE_SCRIPT, json.dumps(COMPILES)], timeout=1200)
    for key, result in zip(COMPILES, compiled, strict=True):
        where = f"Triton {triton.__version__} WGMMA_D256 {key}: {result}"
        assert result["threads"] == 32 * decode.WGMMA_D256_CONFIG.num_warps and result["block_m"] == 64, where
        assert result["wgmma"] > 0 and result["mma_sync"] == 0, where
        assert result["registers"] <= MAX_REGISTERS and result["registers"] * result["threads"] <= SM_REGISTERS, where
        assert result["shared_bytes"] + CTA_RESERVED_SHARED_BYTES <= SM_SHARED_BYTES, where
        assert result["spill_bytes"] <= SPILL_BYTES_AT_MOST and result["loop_local"] == 0, where


# ----------------------------------------------------------------------------------------------------
# GPU: triton/decode with the switch on against fp64
# ----------------------------------------------------------------------------------------------------
# The A/B rows' kinds, smaller: 16 × 4 = 64 rows on a full 8k cache the rule splits (seed 47's row 6); 8 × 8 = 64 rows
# in pages of 64 over a ragged batch, with the LSE (seed 53's row 0 paged: the balanced split); 8 × 4 = 32 rows padded
# to 64 on a full 6000-key cache (seed 59's row 5). The full ones without the LSE, as the sweep's rows: the A/B then
# finds their kernels in Triton's cache. Past 64 rows, contiguous (WGMMA_D256_CONTIGUOUS_ALL_ROWS): 16 × 16 = 256 rows
# in four M tiles on a full 3000-key cache (seed 67's row 7's kind), 5 × 16 = 80 rows in two on a ragged batch (the
# balanced split; seed 67's row 0's kind).
GPU_CASES = {
    "full-64rows": (_problem(1, 4, 16, 4, 8192, 256).with_(return_lse=False), None),
    "paged-64rows": (_problem(3, 2, 8, 8, 4160, 256, has_cache_seqlens=True, page_size=64), (17, 4160, 1000)),
    "full-32rows": (_problem(4, 1, 8, 4, 6000, 256).with_(return_lse=False), None),
    "full-256rows": (_problem(2, 2, 16, 16, 3000, 256), None),
    "ragged-80rows": (_problem(3, 2, 5, 16, 5000, 256, has_cache_seqlens=True), (16, 5000, 1234)),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_gpu_wgmma_d256_against_fp64(case: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(decode, "WGMMA_D256", True)
    problem, lengths = GPU_CASES[case]
    assert decode.tile_config(problem) == decode.WGMMA_D256_CONFIG
    result = check_on_gpu("triton/decode", problem, lengths, seed=len(case))
    assert result.ok, f"triton/decode WGMMA_D256 {problem.describe()}: {result.summary()}"


def test_d256_rows_ab_script_runs_the_gpu_tests_then_the_knob_on_the_issue_rows():
    script = (Path(__file__).parents[1] / "bench" / "triton_decode_d256_rows_ab.sh").read_text()
    assert "tests/test_decode_d256_rows.py" in script and "-m gpu" in script
    assert re.search(r"python3 -m bench\.decode_knob_ab --knob triton_impl\.decode:WGMMA_D256\b", script)
    assert all(row in script for row in ("53/0", "47/6", "59/5"))


def test_many_rows_ab_script_times_both_stacks_knobs_on_seed_67s_rows():
    """bench/decode_d256_many_rows_ab.sh: triton's switch and cute's D=256 64-row tile, each on seed 67's 256-row rows
    and the 128-row paged ones, the CuTe DSL and TVM-FFI (FA4's wheels) carried."""
    script = (Path(__file__).parents[1] / "bench" / "decode_d256_many_rows_ab.sh").read_text()
    assert "triton_impl.decode:WGMMA_D256_CONTIGUOUS_ALL_ROWS False,True triton/decode 67/0 67/7 47/4 53/1" in script
    assert 'cute_impl._decode_warps:WIDE_M_TILES "{128: 64},{128: 64, 256: 64}" cute/decode' in script
    assert '".gpu/cutlass-dsl.tar.xz", ".gpu/activate.sh", ".gpu/fa4"' in script


def test_knob_ab_reads_values_with_commas_as_one_literal_each():
    """bench.decode_knob_ab --values: a dict's commas do not cut it (cute's WIDE_M_TILES A/B)."""
    from bench.decode_knob_ab import arguments

    args = arguments(["--knob", "m:N", "--values", "{128: 64},{128: 64, 256: 64}", "--rows", "67/0"])
    assert args.values == [{128: 64}, {128: 64, 256: 64}]
    assert arguments(["--knob", "m:N", "--values", "64,4096", "--rows", "67/0"]).values == [64, 4096]
    with pytest.raises(SystemExit):
        arguments(["--knob", "m:N", "--values", "64", "--rows", "67/0"])
