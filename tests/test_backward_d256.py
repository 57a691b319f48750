"""The Triton backward rungs at D=256, the head dim their forwards (triton/naive, tiled, pipelined, hopper)
have beside 64 and 128 (``tests/test_backward.py`` covers those and compiles every rung and candidate for
sm_90a, D=256 included).

On CPU under the interpreter, fp32, small shapes: the gradients of each Triton backward rung through
``common.attention`` by the yardstick rule against fp64, ragged lengths, GQA and MQA, causal in both
alignments (bottom-right with Sq > Sk: rows that see no key) and not (every D=256 candidate of the tiled
rung: ``tests/test_backward.py``'s ``test_every_tiled_candidate_passes_the_rule``); the returned LSE
differentiated too; the planted bugs of the block-by-block model at D=256; gradcheck of the naive rung in
fp64. The capability checks: the Triton rungs take D=256 on a (faked) sm_90 GPU, the Gluon rung refuses it
naming the head dim; the TMA variants a Triton release leaves out spill there, and only there. The bench's
D=256 shapes and its candidates run. On the GPU (``gpu``): every forward whose backward is a Triton rung,
bf16 and fp16, at D=256, and its LSE's gradient (each candidate of the tiled rung:
``tests/test_backward.py``'s ``test_gpu_every_candidate_passes_the_rule``).
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest
import torch
import triton

from common.contract.inputs import make_inputs
from common.toolchain.releases import triton_release
from tests._helpers import json_from_child
from tests.test_backward import (
    BUGS,
    FORWARD_OF,
    GRADCHECK_ATOL,
    GRADCHECK_RTOL,
    IMPLEMENTATIONS,
    ReferenceWithNaiveBackward,
    assert_lse_gradients_pass,
    check_gpu_gradients,
    check_gpu_lse_gradients,
    check_gradients,
    failed_checks_of_planted_bug,
    inputs,
    interpreter_runs_fp64_dots,
    problem,
)
from triton_impl.backward import naive as naive_backward
from triton_impl.backward import tiled as tiled_backward
from triton_impl.gluon import backward as gluon_backward

HEAD_DIM = 256
TRITON_BACKWARDS = [name for name in FORWARD_OF if name.startswith("triton/backward/")]
# Ragged (no length a multiple of a tile), GQA and MQA, causal in both alignments and not; the keys of the
# long-keys case span two of the tiled rung's 64-key blocks (and five of the naive rung's 16-key tiles).
CASES = {
    "gqa_full": problem(13, 21, heads=4, kv_heads=2, head_dim=HEAD_DIM),
    "gqa_causal_top_left_long_keys": problem(13, 77, heads=2, kv_heads=1, head_dim=HEAD_DIM, causal=True),
    # Bottom-right with Sq > Sk: the first 8 rows see no key (LSE -inf, zero dQ rows).
    "mqa_causal_bottom_right_sq_gt_sk": problem(21, 13, heads=2, kv_heads=1, head_dim=HEAD_DIM, causal=True,
                                                alignment="bottom_right"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("backward_name", TRITON_BACKWARDS)
def test_d256_gradients_pass_the_rule(backward_name: str, case: str) -> None:
    check_gradients(backward_name, CASES[case])


@pytest.mark.parametrize("backward_name", TRITON_BACKWARDS)
def test_d256_returned_lse_is_differentiable_too(backward_name: str) -> None:
    """loss = ⟨O, dO⟩ + ⟨LSE, dLSE⟩ at D=256 (``tests/test_backward.py``'s rule for it; every row sees a key)."""
    prob = CASES["gqa_causal_top_left_long_keys"]
    q, k, v, d_out = inputs(prob, seed=2)
    d_lse = torch.randn(q.shape[:3], generator=torch.Generator().manual_seed(5))
    assert_lse_gradients_pass(FORWARD_OF[backward_name], prob, q, k, v, d_out, d_lse)


@pytest.mark.parametrize("bug", [None, *BUGS])
def test_the_rule_fails_planted_bugs_at_d256(bug: str | None) -> None:
    """The planted bugs of ``tests/test_backward.py``'s model, at D=256: GQA, causal bottom-right, keys
    over three model blocks."""
    prob = problem(13, 77, head_dim=HEAD_DIM, causal=True, alignment="bottom_right")
    failed, summary = failed_checks_of_planted_bug(prob, bug)
    assert (not failed) if bug is None else set(BUGS[bug]) <= failed, summary


def test_naive_backward_passes_gradcheck_in_fp64_at_d256() -> None:
    """As ``tests/test_backward.py``'s gradcheck (fast mode, tightened tolerances), at D=256: the naive
    rung's 16 × 16 tiles there, over two tiles of keys."""
    if not interpreter_runs_fp64_dots():
        pytest.skip(f"Triton {triton.__version__}'s interpreter refuses fp64 dots (an fp32 accumulator only)")
    prob = problem(5, 19, heads=2, kv_heads=1, head_dim=HEAD_DIM, causal=True, alignment="bottom_right",
                   dtype=torch.float64)  # fmt: skip
    q, k, v = (t.requires_grad_() for t in make_inputs(prob, seed=6, device="cpu", offset=0.5))
    assert torch.autograd.gradcheck(
        lambda *t: ReferenceWithNaiveBackward.apply(*t, naive_backward.BACKWARD, prob),
        (q, k, v),
        fast_mode=True,
        atol=GRADCHECK_ATOL,
        rtol=GRADCHECK_RTOL,
    )


def test_triton_backwards_take_d256_and_gluon_refuses_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a (faked) sm_90 GPU with room for the naive rung's buffers: both Triton rungs take D=256 (fp16:
    the interpreter refuses bf16), causal bottom-right, GQA; the Gluon rung (its forward has no D=256)
    refuses it, and so does each Triton rung at a head dim no forward has."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1 << 40, 1 << 40))
    cuda = torch.device("cuda")
    prob = problem(300, 1000, heads=8, kv_heads=2, head_dim=HEAD_DIM, causal=True, alignment="bottom_right",
                   dtype=torch.float16)  # fmt: skip
    for backward in (naive_backward, tiled_backward):
        assert backward.supports(prob, cuda) == (True, ""), backward.BACKWARD_NAME
        ok, reason = backward.supports(prob.with_(head_dim=512), cuda)
        assert not ok and "head_dim 512" in reason, reason
    ok, reason = gluon_backward.supports(prob, cuda)
    assert not ok and "head_dim" in reason and "256" in reason, reason
    assert tiled_backward.CANDIDATES[HEAD_DIM], "every release keeps a D=256 candidate"


# ----------------------------------------------------------------------------------------------
# The TMA variants a release leaves out spill there, and only there (a child process without the interpreter)
# ----------------------------------------------------------------------------------------------
SPILL_SCRIPT = """
import json, torch
from common.contract.problem import Problem
from common.reporting.static import cubin_resources
from triton_impl.backward import tiled
rows = []
for config in tiled.ALL_CANDIDATES[256]:
    problem = Problem(2, 16, 8192, 8192, 256, torch.bfloat16, causal=True, kv_heads=4)
    for binary in tiled.compile_sm90(problem, config):
        usage = next(iter(cubin_resources(binary.cubin).values()))
        rows.append([config.label, config.tma, binary.name, usage["stack_bytes"] + usage["local_bytes"]])
print(json.dumps(rows))
"""


@pytest.mark.static
def test_d256_tma_variants_spill_only_where_the_release_leaves_them_out() -> None:
    """``TMA_SPILLS``: under a release that lists D=256 (3.9) every TMA variant's dK/dV kernel spills, so
    CANDIDATES keeps the pointer variant alone; elsewhere none spills (a stale entry would hide the fast
    variants, a missing one would make a spilling kernel the default). The candidates a release keeps
    are compiled, causal and not, by ``tests/test_backward.py``'s static test."""
    listed = HEAD_DIM in tiled_backward.TMA_SPILLS.get(triton_release(), ())
    rows = json_from_child(["-c", SPILL_SCRIPT], timeout=600)
    dkdv = {label: spill for label, tma, name, spill in rows if tma and name.startswith("_dkdv")}
    assert len(dkdv) == sum(config.tma for config in tiled_backward.ALL_CANDIDATES[HEAD_DIM])
    assert all(bool(spill) == listed for spill in dkdv.values()), (triton_release(), dkdv)
    assert not [row for row in rows if row[3] and not (row[1] and row[2].startswith("_dkdv"))], rows


# ----------------------------------------------------------------------------------------------
# bench/backward.py at D=256: shapes only named (bench/triton_bwd_d256_ab.sh names them), candidates on CPU
# ----------------------------------------------------------------------------------------------
def test_bench_d256_shapes_run_only_when_named_and_the_ab_script_names_them() -> None:
    import bench.backward as bench

    assert bench.chosen_shapes(None) == bench.SHAPES
    assert all(shape[4] == HEAD_DIM for shape in bench.NAMED_SHAPES)
    script = (Path(__file__).parents[1] / "bench" / "triton_bwd_d256_ab.sh").read_text()
    assert bench.chosen_shapes(re.findall(r'--shape "([^"]+)"', script)) == bench.NAMED_SHAPES


def test_bench_d256_candidates_check_and_time_every_variant(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the interpreter (fp32, SDPA math as the reference): every D=256 candidate of this release is
    checked and timed; the Gluon rung, which has none, leaves the shape out."""
    import bench.backward as bench

    for name, value in (("DEVICE", "cpu"), ("DTYPE_NAME", "float32"), ("REFERENCE", "sdpa/math"),
                        ("BASELINES", ("sdpa/math",)), ("CANDIDATE_FORWARD", "triton/tiled"),
                        ("NAMED_SHAPES", (("tiny d256", 1, 2, 70, HEAD_DIM, True),))):  # fmt: skip
        monkeypatch.setattr(bench, name, value)
    assert bench.run_candidates(tmp_path, budget_s=600, shapes=["tiny d256"]) == 0
    with (tmp_path / "candidates.csv").open() as handle:
        rows = [row for row in csv.DictReader(handle) if row["impl"] == "triton/backward/tiled"]
    assert [row["variant"] for row in rows] == [config.label for config in tiled_backward.CANDIDATES[HEAD_DIM]]
    assert all(row["status"] == "ok" for row in rows), rows
    (tmp_path / "gluon").mkdir()
    assert bench.run_candidates(tmp_path / "gluon", budget_s=600, shapes=["tiny d256"], rung="gluon") == 0
    assert len((tmp_path / "gluon" / "candidates.csv").read_text().splitlines()) == 1  # the header alone


# ----------------------------------------------------------------------------------------------
# GPU: every forward whose backward is a Triton rung, bf16 and fp16, at D=256
# ----------------------------------------------------------------------------------------------
GPU_CASES = {
    "gqa_causal_bottom_right": problem(300, 1000, heads=8, kv_heads=2, head_dim=HEAD_DIM, causal=True,
                                       alignment="bottom_right"),
    "mqa_full_ragged": problem(777, 333, heads=4, kv_heads=1, head_dim=HEAD_DIM),
    # Sq > Sk bottom-right: the first 700 rows see no key (LSE -inf, zero gradients).
    "gqa_causal_bottom_right_sq_gt_sk": problem(1000, 300, heads=6, kv_heads=2, head_dim=HEAD_DIM, causal=True,
                                                alignment="bottom_right"),
}  # fmt: skip
GPU_IMPLS = [impl.name for impl in IMPLEMENTATIONS if impl.backward and impl.backward.name in TRITON_BACKWARDS]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", list(GPU_CASES))
@pytest.mark.parametrize("impl", GPU_IMPLS)
def test_gpu_d256_gradients_pass_the_rule(impl: str, case: str, dtype: torch.dtype) -> None:
    check_gpu_gradients(impl, GPU_CASES[case].with_(dtype=dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("impl", GPU_IMPLS)
def test_gpu_d256_returned_lse_is_differentiable_too(impl: str) -> None:
    """The LSE's gradient at D=256 on the GPU in bf16, GQA, causal bottom-right, ragged over several blocks."""
    check_gpu_lse_gradients(impl, GPU_CASES["gqa_causal_bottom_right"].with_(dtype=torch.bfloat16))
