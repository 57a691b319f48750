"""The backward rungs through ``common.attention``'s autograd, on CPU under the Triton interpreter, fp32.

Gradients of every backward rung the registry names are judged per gradient (dQ, dK, dV) against
float64 autograd on the fp64 reference by the forward's rule, 2 × SDPA's own gradient error in the same
dtype (``common.contract.gradients``), on ragged shapes (Sq=37, Sk=53 and the reverse), causal in both
alignments and not, GQA and MQA, D=64 and one case at D=128 (D=256: ``tests/test_backward_d256.py``), and
every candidate of the tiled rung at each head dim. The rule must fail planted bugs, fed to it
from a block-by-block torch model of the tiled backward: D without the row sum, dQ without the softmax
scale, dQ of the last key block only, dK and dV of only the first query head of each group. The naive
rung passes ``torch.autograd.gradcheck`` in fp64 (the interpreter runs fp64 dots). An implementation
without a backward refuses with a message naming those that have one. Every backward rung compiles for
sm_90a without spills (in a child process, as the interpreter is chosen when Triton is imported).
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from common import attention, plan_cache_info
from common.contract.gradients import (
    Gradients,
    backward_inputs,
    judge_gradients,
    reference_gradients,
    sdpa_gradients,
)
from common.contract.inputs import make_cache_seqlens, make_inputs
from common.contract.problem import Problem
from common.contract.reference import reference_attention, visible_keys_mask
from common.contract.registry import Backward, discover, with_backward
from tests._helpers import json_from_child
from triton_impl.backward import tiled as tiled_backward
from triton_impl.gluon import backward as gluon_backward

IMPLEMENTATIONS, _ = discover(include_baselines=False)
# Each backward rung, with the first forward rung (ladder order) that names it: the pair tested end to end.
FORWARD_OF: dict[str, str] = {}
for _impl in IMPLEMENTATIONS:
    if _impl.backward is not None and _impl.runs_on_cpu:
        FORWARD_OF.setdefault(_impl.backward.name, _impl.name)
BACKWARD_NAMES = list(FORWARD_OF)


def problem(
    seqlen_q: int = 37,
    seqlen_k: int = 53,
    *,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 64,
    causal: bool = False,
    alignment: str = "top_left",
    dtype: torch.dtype = torch.float32,
) -> Problem:
    return Problem(
        batch=1, heads=heads, seqlen_q=seqlen_q, seqlen_k=seqlen_k, head_dim=head_dim, dtype=dtype,
        causal=causal, kv_heads=kv_heads, causal_alignment=alignment,
    )  # fmt: skip


# Ragged (neither length a multiple of a tile), Sq < Sk and Sq > Sk (bottom-right: the first 16 rows
# see no key), GQA, MQA and no grouping, one case at D=128 whose keys span three key blocks of the tiled rung.
CASES = {
    "gqa": problem(),
    "gqa_causal_top_left": problem(causal=True),
    "gqa_causal_bottom_right": problem(causal=True, alignment="bottom_right"),
    "mqa_causal_bottom_right_sq_gt_sk": problem(53, 37, kv_heads=1, causal=True, alignment="bottom_right"),
    "mha_d128_causal_top_left_long_keys": problem(37, 150, heads=2, kv_heads=2, head_dim=128, causal=True),
}


def inputs(prob: Problem, seed: int = 0, offset: float = 0.5) -> tuple[torch.Tensor, ...]:
    """q, k, v (v offset so that O is not near zero) and a standard-normal dO, on the CPU."""
    return backward_inputs(prob, seed=seed, device="cpu", offset=offset)


def ladder_gradients(impl: str, prob: Problem, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, d_out) -> Gradients:
    """(dq, dk, dv) by ``common.attention`` with ``impl`` and torch.autograd."""
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = attention(*leaves, causal=prob.causal, causal_alignment=prob.causal_alignment, impl=impl)
    out.backward(d_out)
    return tuple(t.grad for t in leaves)


def assert_all_pass(grads: Gradients, q, k, v, d_out, prob: Problem) -> None:
    checks = judge_gradients(grads, reference_gradients(q, k, v, d_out, prob), sdpa_gradients(q, k, v, d_out, prob))
    failed = [check.summary() for check in checks if not check.ok]
    assert not failed, "\n".join(failed)


# ----------------------------------------------------------------------------------------------
# Gradients of each backward rung through attention(), judged by the yardstick rule
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("backward_name", BACKWARD_NAMES)
def test_gradients_pass_the_rule(backward_name: str, case: str) -> None:
    grads = check_gradients(backward_name, CASES[case])
    assert all(g.dtype == torch.float32 for g in grads)


def check_gradients(backward_name: str, prob: Problem) -> tuple[torch.Tensor, ...]:
    """The gradients of ``backward_name``'s forward rung through ``attention()``, shaped as q, k and v and
    judged by the rule; returned for further checks."""
    q, k, v, d_out = inputs(prob)
    grads = ladder_gradients(FORWARD_OF[backward_name], prob, q, k, v, d_out)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    assert_all_pass(grads, q, k, v, d_out, prob)
    return grads


def test_zero_mean_inputs_pass_the_rule() -> None:
    prob = CASES["gqa_causal_bottom_right"]
    q, k, v, d_out = inputs(prob, seed=3, offset=0.0)
    assert_all_pass(ladder_gradients(FORWARD_OF["triton/backward/tiled"], prob, q, k, v, d_out), q, k, v, d_out, prob)


def test_autocast_attends_in_its_dtype_and_differentiates_the_fp32_inputs() -> None:
    """Under autocast, fp32 q, k, v (a model's rotary output) attend in autocast's dtype, as with SDPA;
    the gradients reach the fp32 tensors. Without the cast the output would stay fp32 (bench/train.py's
    GPU run refused fp32 before)."""
    prob = CASES["gqa_causal_bottom_right"]
    q, k, v, d_out = inputs(prob)
    impl = FORWARD_OF["triton/backward/tiled"]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with torch.autocast("cpu", dtype=torch.float16):
        out = attention(*leaves, causal=True, causal_alignment="bottom_right", impl=impl)
    half = attention(q.half(), k.half(), v.half(), causal=True, causal_alignment="bottom_right", impl=impl)
    assert out.dtype == torch.float16
    assert torch.equal(out, half)
    out.backward(d_out.half())
    assert all(t.grad is not None and t.grad.dtype == torch.float32 for t in leaves)
    assert all(torch.isfinite(t.grad).all() for t in leaves)


# Each candidate of the tiled rung (TMA and pointer loads, dQ by atomics or a separate pass), those a Triton
# release leaves out for spilling included (a spill slows a kernel, it must not make it wrong), on a shape
# that spans several 128-key and 128-row blocks, with the key tail and the causal diagonal inside them.
CANDIDATE_CASE = {"seqlen_q": 150, "seqlen_k": 290, "causal": True, "alignment": "bottom_right"}


@pytest.mark.parametrize(
    ("head_dim", "config"),
    [(head_dim, config) for head_dim, configs in tiled_backward.ALL_CANDIDATES.items() for config in configs],
    ids=lambda value: f"d{value}" if isinstance(value, int) else value.label.replace(" ", "_"),
)
def test_every_tiled_candidate_passes_the_rule(head_dim: int, config: tiled_backward.BackwardConfig) -> None:
    prob = problem(**CANDIDATE_CASE, heads=2, kv_heads=1, head_dim=head_dim)
    q, k, v, d_out = inputs(prob, seed=8)
    out, lse = reference_attention(q, k, v, prob, with_lse=True)
    grads = tiled_backward.tiled_gradients(q, k, v, out.float(), lse.float(), d_out, prob, config=config)
    assert_all_pass(grads, q, k, v, d_out, prob)


@pytest.mark.parametrize("impl", [impl.name for impl in IMPLEMENTATIONS if impl.backward and impl.runs_on_cpu])
def test_every_forward_with_a_backward_pairs_with_it(impl: str) -> None:
    """The later forward rungs (pipelined, hopper) save an O and LSE their backward rung can use."""
    prob = CASES["gqa_causal_bottom_right"]
    q, k, v, d_out = inputs(prob, seed=1)
    assert_all_pass(ladder_gradients(impl, prob, q, k, v, d_out), q, k, v, d_out, prob)


def test_the_returned_lse_is_differentiable_too() -> None:
    """loss = ⟨O, dO⟩ + ⟨LSE, dLSE⟩: the LSE's gradient enters through D, against fp64 autograd."""
    prob = CASES["gqa_causal_bottom_right"]
    q, k, v, d_out = inputs(prob, seed=2)
    d_lse = torch.randn(q.shape[:3], generator=torch.Generator().manual_seed(5))
    for impl in FORWARD_OF.values():
        assert_lse_gradients_pass(impl, prob, q, k, v, d_out, d_lse)


def assert_lse_gradients_pass(impl: str, prob: Problem, q, k, v, d_out, d_lse) -> None:
    """``impl``'s gradients of ⟨O, dO⟩ + ⟨LSE, dLSE⟩ against fp64 autograd, by the rule with torch autograd
    on the dense computation in the inputs' dtype as the yardstick (SDPA returns no LSE)."""
    ref_leaves = [t.double().requires_grad_() for t in (q, k, v)]
    ref_out, ref_lse = reference_attention(*ref_leaves, prob, with_lse=True)
    reference = torch.autograd.grad((ref_out * d_out).sum() + (ref_lse * d_lse).sum(), ref_leaves)
    torch_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    torch_out, torch_lse = dense_attention(*torch_leaves, prob)
    yardstick = torch.autograd.grad((torch_out * d_out).sum() + (torch_lse * d_lse).sum(), torch_leaves)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = attention(*leaves, causal=prob.causal, causal_alignment=prob.causal_alignment, impl=impl,
                         return_lse=True)  # fmt: skip
    grads = torch.autograd.grad((out * d_out).sum() + (lse * d_lse).sum(), leaves)
    failed = [check.summary() for check in judge_gradients(grads, reference, yardstick) if not check.ok]
    assert not failed, f"{impl}: " + "\n".join(failed)


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prob: Problem) -> tuple[torch.Tensor, ...]:
    """O and LSE in q's dtype by plain torch (no row without a visible key)."""
    k, v = (t.repeat_interleave(prob.kv_group, dim=1) for t in (k, v))
    rows = torch.arange(prob.seqlen_q, device=q.device)
    visible = visible_keys_mask(prob, prob.seqlen_k, rows, prob.seqlen_k, q.device)
    scores = (q @ k.transpose(-1, -2) * prob.scale).masked_fill(~visible, -math.inf)
    return torch.softmax(scores, dim=-1) @ v, torch.logsumexp(scores, dim=-1)


# ----------------------------------------------------------------------------------------------
# The rule fails planted bugs (a torch model of the tiled backward, block by block)
# ----------------------------------------------------------------------------------------------
MODEL_BLOCK_N = 32
BUGS = {
    # bug: the gradients it must break
    "no_row_sum": ("dq", "dk"),
    "dq_without_scale": ("dq",),
    "dq_last_block_only": ("dq",),
    # dQ added from every key block but one (a lost reduce-add: cute/backward/hopper's dq="reduce").
    "dq_one_block_lost": ("dq",),
    "gqa_first_head_only": ("dk", "dv"),
}


def model_backward(q, k, v, out, lse, d_out, prob: Problem, bug: str | None = None) -> Gradients:
    """What the tiled backward computes, in fp32 torch: per (batch, KV head, key block), per query head
    of the group, P from the LSE, dV += Pᵀ dO, dS = P ∘ (dP − D), dK += scale · dSᵀ Q, dQ += scale · dS K.
    ``bug`` plants one mistake."""
    q, k, v, out, d_out = (t.float() for t in (q, k, v, out, d_out))
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    delta = (d_out * out).sum(-1)
    if bug == "no_row_sum":
        delta = torch.zeros_like(delta)
    visible = visible_keys_mask(prob, prob.seqlen_k, torch.arange(prob.seqlen_q), prob.seqlen_k, q.device)
    shift = torch.where(lse == -math.inf, math.inf, lse.float())
    dq_scale = 1.0 if bug == "dq_without_scale" else prob.scale
    group = 1 if bug == "gqa_first_head_only" else prob.kv_group
    for b in range(prob.batch):
        for kv_head in range(prob.kv_heads):
            for start in range(0, prob.seqlen_k, MODEL_BLOCK_N):
                keys = slice(start, start + MODEL_BLOCK_N)
                k_block, v_block = k[b, kv_head, keys], v[b, kv_head, keys]
                for head in range(kv_head * prob.kv_group, kv_head * prob.kv_group + group):
                    scores = (q[b, head] @ k_block.T * prob.scale).masked_fill(~visible[:, keys], -math.inf)
                    probs = torch.exp(scores - shift[b, head, :, None])
                    dv[b, kv_head, keys] += probs.T @ d_out[b, head]
                    d_s = probs * (d_out[b, head] @ v_block.T - delta[b, head, :, None])
                    dk[b, kv_head, keys] += prob.scale * d_s.T @ q[b, head]
                    share = dq_scale * d_s @ k_block
                    if bug == "dq_one_block_lost" and start == MODEL_BLOCK_N:
                        share = torch.zeros_like(share)
                    dq[b, head] = share if bug == "dq_last_block_only" else dq[b, head] + share
    return dq, dk, dv


def failed_checks_of_planted_bug(prob: Problem, bug: str | None) -> tuple[set[str], str]:
    """The names of the rule's checks that ``model_backward`` with ``bug`` planted (None: none) fails on ``prob``
    (inputs of seed 4), and every check's summary."""
    q, k, v, d_out = inputs(prob, seed=4)
    out, lse = reference_attention(q, k, v, prob, with_lse=True)
    grads = model_backward(q, k, v, out, lse, d_out, prob, bug)
    checks = judge_gradients(grads, reference_gradients(q, k, v, d_out, prob), sdpa_gradients(q, k, v, d_out, prob))
    return {check.name for check in checks if not check.ok}, "\n".join(check.summary() for check in checks)


@pytest.mark.parametrize("bug", [None, *BUGS])
def test_the_rule_fails_planted_bugs(bug: str | None) -> None:
    # GQA, causal bottom-right, keys over five model blocks, so every planted bug has something to break.
    failed, summary = failed_checks_of_planted_bug(problem(37, 150, causal=True, alignment="bottom_right"), bug)
    if bug is None:
        assert not failed, summary
    else:
        assert set(BUGS[bug]) <= failed, summary


# ----------------------------------------------------------------------------------------------
# gradcheck of the naive rung in fp64
# ----------------------------------------------------------------------------------------------
# gradcheck's tolerances (defaults 1e-5 and 1e-3), for a check that runs in fp64 from end to end.
GRADCHECK_ATOL, GRADCHECK_RTOL = 1e-8, 1e-6


class ReferenceWithNaiveBackward(torch.autograd.Function):
    """Forward: the fp64 reference (O and LSE); backward: the naive backward rung in fp64."""

    @staticmethod
    def forward(ctx, q, k, v, backward: Backward, prob: Problem):
        out, lse = reference_attention(q, k, v, prob, with_lse=True)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.backward_rung, ctx.prob = backward, prob
        return out, lse

    @staticmethod
    def backward(ctx, d_out, d_lse):
        q, k, v, out, lse = ctx.saved_tensors
        return (*ctx.backward_rung.gradients(q, k, v, out, lse, d_out, ctx.prob, d_lse=d_lse), None, None)


@triton.jit
def _fp64_dot_kernel(a_ptr, out_ptr):
    offs = tl.arange(0, 16)
    a = tl.load(a_ptr + offs[:, None] * 16 + offs[None, :])
    acc = tl.zeros((16, 16), dtype=a.dtype)
    tl.store(out_ptr + offs[:, None] * 16 + offs[None, :], tl.dot(a, a, acc))


def interpreter_runs_fp64_dots() -> bool:
    """Whether this Triton's interpreter computes an fp64 ``tl.dot`` into an fp64 accumulator, as the
    naive rung does for fp64 inputs (3.8 does; 3.6 asserts that the accumulator is fp32)."""
    a = torch.eye(16, dtype=torch.float64)
    out = torch.empty_like(a)
    try:
        _fp64_dot_kernel[(1,)](a, out)
    except Exception:  # noqa: BLE001 - any failure means it cannot
        return False
    return torch.equal(out, a)


def test_naive_backward_passes_gradcheck_in_fp64() -> None:
    """The interpreter runs fp64 dots, and the naive rung works in fp64 for fp64 inputs, so finite
    differences of the fp64 reference check its gradients (of O and of the LSE). Fast mode (one random
    projection; the full Jacobian would take a backward per output element) at the default tolerances
    passes dQ off by 1 %; everything here is fp64, so they are tightened to catch 0.1 %."""
    if not interpreter_runs_fp64_dots():
        pytest.skip(f"Triton {triton.__version__}'s interpreter refuses fp64 dots (an fp32 accumulator only)")
    naive = next(impl.backward for impl in IMPLEMENTATIONS if impl.backward and impl.backward.name.endswith("naive"))
    prob = problem(5, 9, heads=2, kv_heads=1, causal=True, alignment="bottom_right", dtype=torch.float64)
    q, k, v = (t.requires_grad_() for t in make_inputs(prob, seed=6, device="cpu", offset=0.5))
    assert torch.autograd.gradcheck(
        lambda *t: ReferenceWithNaiveBackward.apply(*t, naive, prob),
        (q, k, v),
        fast_mode=True,
        atol=GRADCHECK_ATOL,
        rtol=GRADCHECK_RTOL,
    )


# ----------------------------------------------------------------------------------------------
# Refusals: no backward, a feature the backward lacks
# ----------------------------------------------------------------------------------------------
def test_an_implementation_without_backward_refuses_naming_those_with_one() -> None:
    prob = CASES["gqa"]
    q, k, v, _ = inputs(prob)
    size = plan_cache_info().size
    names = ", ".join(with_backward())
    assert names.startswith("triton/naive, triton/tiled")
    with pytest.raises(NotImplementedError, match=f"triton/online is forward-only.*with a backward: {names}"):
        attention(q.requires_grad_(), k, v, impl="triton/online")
    assert plan_cache_info().size == size


def test_a_backward_refuses_cache_seqlens_with_its_reason() -> None:
    prob = CASES["gqa"]
    q, k, v, _ = inputs(prob)
    lengths = make_cache_seqlens(prob, device="cpu")
    with pytest.raises(ValueError, match=r"triton/backward/tiled cannot differentiate.*cache_seqlens"):
        attention(q.requires_grad_(), k, v, impl="triton/tiled", cache_seqlens=lengths)


# ----------------------------------------------------------------------------------------------
# Every backward rung compiles for sm_90a without spills (a child process without the interpreter)
# ----------------------------------------------------------------------------------------------
# ``python -c COMPILE_SCRIPT STACKS``: the defaults of the backward rungs of STACKS (comma-separated; the Triton
# rungs' at D=256 too), and with "triton" and "gluon" their tile candidates (this release's CANDIDATES; Gluon's
# non-causal builds from its NON_CAUSAL_CANDIDATES).
COMPILE_SCRIPT = """
import json, sys, torch
from common.contract.problem import Problem
from common.contract.registry import discover
from common.reporting.static import cubin_resources, ptx_features
from triton_impl.backward import tiled
from triton_impl.gluon import backward as gluon_backward
stacks = sys.argv[1].split(",")
# "defaults": every rung's default launches; "candidates": every tile candidate of the tiled and Gluon rungs.
defaults = sys.argv[2] == "defaults"
impls = discover(include_baselines=False)[0]
backwards = {impl.backward.name: impl.backward for impl in impls if impl.backward and impl.stack in stacks}
rows = []
for name, backward in backwards.items() if defaults else ():
    for head_dim in (64, 128, 256) if name.startswith("triton/") else (64, 128):
        problem = Problem(2, 16, 8192, 8192, head_dim, torch.bfloat16, causal=True, kv_heads=4)
        for binary in backward.compile_sm90(problem):
            usage = next(iter(cubin_resources(binary.cubin).values()))
            rows.append([name, head_dim, binary.name, usage["stack_bytes"] + usage["local_bytes"]])
for head_dim, configs in (tiled.CANDIDATES if "triton" in stacks and not defaults else {}).items():
    for config in configs:
        for causal in (False, True):
            problem = Problem(2, 16, 8192, 8192, head_dim, torch.bfloat16, causal=causal, kv_heads=4)
            for binary in tiled.compile_sm90(problem, config):
                usage = next(iter(cubin_resources(binary.cubin).values()))
                assert binary.shared_bytes <= 232_448, (config.label, binary.name, binary.shared_bytes)
                rows.append([config.label, head_dim, binary.name, usage["stack_bytes"] + usage["local_bytes"]])
# The Gluon rung's tile variants, ragged, non-causal and causal bottom-right (the default's causal top-left
# build is the defaults' run's); the preprocess is the tiled rung's, compiled there too.
listings = ((gluon_backward.NON_CAUSAL_CANDIDATES, {}),
            (gluon_backward.CANDIDATES, {"causal": True, "causal_alignment": "bottom_right"}))
for listed, features in listings if "gluon" in stacks and not defaults else ():
    for head_dim, variants in listed.items():
        for tiles in variants:
            problem = Problem(2, 16, 1000, 777, head_dim, torch.bfloat16, kv_heads=4, **features)
            # An in-kernel dQ's last launch is a conversion kernel (tests/test_gluon_backward_dq.py).
            for binary in gluon_backward.compile_sm90(problem, tiles)[1 : 3 if tiles.dq == "pass" else 2]:
                usage = next(iter(cubin_resources(binary.cubin).values()))
                assert binary.shared_bytes <= 232_448, (tiles.label, binary.name, binary.shared_bytes)
                # What the rung claims: TMA, mbarriers, wgmma and setmaxnreg; no mma.sync, no cp.async.
                found = ptx_features(binary.ptx)
                wanted = ("wgmma.mma_async", "cp.async.bulk.tensor", "mbarrier", "setmaxnreg")
                assert all(found[name] for name in wanted), (tiles.label, binary.name, found)
                assert not found["mma.sync"] and not found["cp.async"], (tiles.label, binary.name, found)
                spill = usage["stack_bytes"] + usage["local_bytes"]
                rows.append(["gluon " + tiles.label, head_dim, binary.name, spill])
print(json.dumps(rows))
"""


def _compiled_backwards(stacks: tuple[str, ...], what: str = "defaults") -> None:
    """COMPILE_SCRIPT on ``stacks``: ``what`` ("defaults": every backward rung of theirs; "candidates": every tile
    candidate) built, none spilling."""
    rows = json_from_child(["-c", COMPILE_SCRIPT, ",".join(stacks), what], timeout=600)
    if what == "defaults":
        names = {impl.backward.name for impl in IMPLEMENTATIONS if impl.backward is not None and impl.stack in stacks}
        assert names and {row[0] for row in rows} >= names
    else:
        assert rows
    spilled = [row for row in rows if row[3]]
    assert not spilled, f"(backward, head_dim, kernel, spill bytes per thread): {spilled}"


HEAVIEST_FIRST_SCRIPT = """
import json, torch
from common.contract.problem import Problem
from triton_impl.gluon import backward as gluon_backward
tiles = next(t for t in gluon_backward.CANDIDATES[64] if t.heaviest_first)
rows = []
for causal in (True, False):
    problem = Problem(2, 8, 300, 1000, 64, torch.bfloat16, kv_heads=2, causal=causal, causal_alignment="bottom_right")
    for plain, ordered in zip(gluon_backward.compile_sm90(problem), gluon_backward.compile_sm90(problem, tiles)):
        rows.append([causal, ordered.name, "nctaid" in plain.ptx, "nctaid" in ordered.ptx])
print(json.dumps(rows))
"""


@pytest.mark.static
def test_gluon_heaviest_first_remaps_only_the_causal_launches() -> None:
    """``heaviest_first`` (``_device.heaviest_first``: a group's blocks first, the grid's size read by
    ``%nctaid``) enters both causal kernels and neither non-causal one; the dQ pass reads the grid's size
    causal anyway (its last query block first). Whether the order is a bijection the GPU tests show (every
    candidate against fp64: a CTA left out leaves its dK, dV or dQ rows unwritten)."""
    rows = json_from_child(["-c", HEAVIEST_FIRST_SCRIPT], timeout=600)
    reads = {(causal, name.rsplit("_kernel", 1)[0].lstrip("_")): pair for causal, name, *pair in rows}
    assert reads[True, "dkdv"] == [False, True] and reads[True, "dq"] == [True, True]
    assert reads[False, "dkdv"] == [False, False] and reads[False, "dq"] == [False, False]


@pytest.mark.static
@pytest.mark.release
@pytest.mark.parametrize("stack", ["triton", "gluon"])
def test_every_triton_and_gluon_backward_compiles_for_sm90a_without_spills(stack: str) -> None:
    """Every Triton and Gluon rung's default launches (the Triton rungs' at D=256 too): what every Triton
    release compiles. One stack a test, so two workers share them."""
    _compiled_backwards((stack,))


@pytest.mark.static
@pytest.mark.parametrize("stack", ["triton", "gluon"])
def test_every_backward_tile_candidate_compiles_for_sm90a_without_spills(stack: str) -> None:
    """Every tile candidate of the tiled rung and of the Gluon rung (the A/B's knobs), causal and not, all
    within the H200's shared memory per block; the Gluon kernels also with the PTX they claim (TMA, mbarriers,
    wgmma, setmaxnreg; no mma.sync or cp.async). Under the README's release only (the release legs compile the
    defaults above: with the candidates, 261 s under Triton 3.7 on two cores, cold, 2026-12-07)."""
    _compiled_backwards((stack,), "candidates")


@pytest.mark.cute_compile
@pytest.mark.static
def test_every_cute_backward_compiles_for_sm90a_without_spills() -> None:
    """The CuTe rungs' default launches (the same bytes under every torch and Triton: once, in CI's
    readme leg, as every cute_compile test)."""
    _compiled_backwards(("cute",))


# ----------------------------------------------------------------------------------------------
# GPU: every forward rung with a backward, bf16 and fp16, against fp64 by the same rule
# ----------------------------------------------------------------------------------------------
GPU_CASES = {
    "gqa_causal_bottom_right_d128": problem(300, 1000, heads=8, kv_heads=2, head_dim=128, causal=True,
                                           alignment="bottom_right"),
    "mqa_full_d64_ragged": problem(777, 333, heads=4, kv_heads=1, head_dim=64),
    "mha_causal_top_left_d128": problem(1024, 1024, heads=4, kv_heads=4, head_dim=128, causal=True),
    # Sq > Sk bottom-right: the first 700 rows see no key (LSE -inf, zero gradients).
    "gqa_causal_bottom_right_sq_gt_sk_d64": problem(1000, 300, heads=6, kv_heads=2, head_dim=64, causal=True,
                                                   alignment="bottom_right"),
}  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", list(GPU_CASES))
@pytest.mark.parametrize("impl", [impl.name for impl in IMPLEMENTATIONS if impl.backward])
def test_gpu_gradients_pass_the_rule(impl: str, case: str, dtype: torch.dtype) -> None:
    check_gpu_gradients(impl, GPU_CASES[case].with_(dtype=dtype))


def check_gpu_gradients(impl: str, prob: Problem) -> None:
    """``impl``'s gradients on the GPU (offset inputs) against fp64 by the rule; skipped without a GPU."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    q, k, v = make_inputs(prob, seed=11, device="cuda", offset=0.5)
    d_out = torch.randn(q.shape, generator=torch.Generator(device="cuda").manual_seed(3), device="cuda")
    d_out = d_out.to(prob.dtype)
    assert_all_pass(ladder_gradients(impl, prob, q, k, v, d_out), q, k, v, d_out, prob)


@pytest.mark.gpu
@pytest.mark.parametrize("impl", [impl.name for impl in IMPLEMENTATIONS if impl.backward])
def test_gpu_the_returned_lse_is_differentiable_too(impl: str) -> None:
    """The LSE's gradient on the GPU in bf16, GQA, causal bottom-right, ragged over several blocks."""
    check_gpu_lse_gradients(impl, GPU_CASES["gqa_causal_bottom_right_d128"].with_(dtype=torch.bfloat16))


def check_gpu_lse_gradients(impl: str, prob: Problem) -> None:
    """``impl``'s gradients through O and the returned LSE on the GPU against fp64; skipped without a GPU."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    q, k, v = make_inputs(prob, seed=15, device="cuda", offset=0.5)
    generator = torch.Generator(device="cuda").manual_seed(6)
    d_out = torch.randn(q.shape, generator=generator, device="cuda").bfloat16()
    d_lse = torch.randn(q.shape[:3], generator=generator, device="cuda")
    assert_lse_gradients_pass(impl, prob, q, k, v, d_out, d_lse)


def test_gluon_backward_refuses_what_it_cannot_differentiate(monkeypatch: pytest.MonkeyPatch) -> None:
    """On an sm_90 device (faked: the check reads only the capability) it takes fp16/bf16, D 64 and 128,
    GQA, both alignments and the LSE; it refuses cache_seqlens, paged caches, D=256, fp32, other GPUs, CPU."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    cuda = torch.device("cuda")
    supported = problem(77, 1000, heads=8, kv_heads=2, head_dim=128, causal=True, alignment="bottom_right",
                        dtype=torch.bfloat16).with_(return_lse=True)  # fmt: skip
    assert gluon_backward.supports(supported, cuda) == (True, "")
    assert gluon_backward.supports(supported.with_(head_dim=64, dtype=torch.float16), cuda)[0]
    refusals = {
        "cache_seqlens": supported.with_(has_cache_seqlens=True),
        "paged": supported.with_(seqlen_k=1024, has_cache_seqlens=True, page_size=16),
        "head_dim": supported.with_(head_dim=256),
        "fp16 and bf16": supported.with_(dtype=torch.float32),
    }
    for words, refused in refusals.items():
        ok, reason = gluon_backward.supports(refused, cuda)
        assert not ok and "gluon/backward/hopper" in reason and words in reason, reason
    ok, reason = gluon_backward.supports(supported, torch.device("cpu"))
    assert not ok and "CUDA" in reason, reason
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    ok, reason = gluon_backward.supports(supported, cuda)
    assert not ok and "sm_90" in reason, reason


def test_gluon_overlapped_tiles_refuse_a_single_ring_slot() -> None:
    """Overlapped steps free a slot one step late: one slot would deadlock the load warp, so the variant
    is refused when made; two slots are taken, as is one slot without the overlap."""
    for stages in ((1, 2), (2, 1)):
        with pytest.raises(ValueError, match="two ring slots"):
            gluon_backward.BackwardTiles(32, stages[0], 64, stages[1], overlap=True)
    assert gluon_backward.BackwardTiles(32, 2, 64, 2, overlap=True).label.endswith(" overlap")
    assert gluon_backward.BackwardTiles(32, 1, 64, 1).label == "dkdv 128x32 s1, dq 128x64 s1"
    # Only an overlapped kernel needs two slots; the label names the overlapped kernels.
    mixed = gluon_backward.BackwardTiles(32, 3, 128, 1, overlap=True, dq_overlap=False)
    assert mixed.label == "dkdv 128x32 s3, dq 128x128 s1 overlap dkdv" and not mixed.overlaps_dq
    with pytest.raises(ValueError, match="two ring slots"):
        gluon_backward.BackwardTiles(32, 1, 128, 2, overlap=True, dq_overlap=False)
    # The atomic dQ is built on the non-overlapped step only; its label names no dQ pass.
    with pytest.raises(ValueError, match="in-kernel dQ"):
        gluon_backward.BackwardTiles(32, 3, 64, 3, overlap=True, dq="atomic")
    assert gluon_backward.BackwardTiles(32, 3, 64, 3, dq="atomic").label == "dkdv 128x32 s3, dq atomic"


# ----------------------------------------------------------------------------------------------
# bench/backward.py on CPU: a tiny shape under the interpreter, SDPA math as the reference
# ----------------------------------------------------------------------------------------------
@pytest.fixture
def tiny_bench(monkeypatch: pytest.MonkeyPatch):
    import bench.backward as bench

    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.setattr(bench, "DTYPE_NAME", "float32")
    monkeypatch.setattr(bench, "SHAPES", (("tiny causal", 1, 2, 130, 64, True),))
    monkeypatch.setattr(bench, "REFERENCE", "sdpa/math")
    monkeypatch.setattr(bench, "BASELINES", ("sdpa/math",))
    monkeypatch.setattr(bench, "CANDIDATE_FORWARD", "triton/tiled")
    return bench


def read_rows(path: Path) -> list[dict]:
    import csv

    with path.open() as handle:
        return list(csv.DictReader(handle))


def test_bench_candidates_checks_and_times_every_variant(tiny_bench, tmp_path: Path) -> None:
    assert tiny_bench.run_candidates(tmp_path, budget_s=600) == 0
    rows = read_rows(tmp_path / "candidates.csv")
    variants = [row["variant"] for row in rows if row["impl"] == "triton/backward/tiled"]
    assert variants == [config.label for config in tiled_backward.CANDIDATES[64]]
    assert all(row["status"] == "ok" and float(row["vs_cudnn"]) > 0 for row in rows)
    assert all(float(row[f"{name}_vs_cudnn"]) < 1e-4 for row in rows[1:] for name in ("dq", "dk", "dv"))


def test_bench_candidates_times_only_the_variants_named_in_their_order(tiny_bench, tmp_path: Path) -> None:
    """``--variant``: those candidates alone, in the order named (the budget skips the last), ``default``
    the head dim's first; a label that is no candidate is refused before anything runs."""
    labels = [config.label for config in tiled_backward.CANDIDATES[64]]
    assert tiny_bench.run_candidates(tmp_path, budget_s=600, variants=[labels[2], "default", labels[0]]) == 0
    rows = read_rows(tmp_path / "candidates.csv")
    assert [row["variant"] for row in rows if row["impl"] == "triton/backward/tiled"] == [labels[2], labels[0]]
    with pytest.raises(ValueError, match=r"\['no such variant'\] not among tiled's candidates"):
        tiny_bench.run_candidates(tmp_path / "bad", budget_s=600, variants=["no such variant"])


def test_bench_candidates_times_a_named_variant_no_release_lists(
    tiny_bench, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--variant`` may name one of the rung's ``ALL_CANDIDATES`` that ``CANDIDATES`` leaves out (an
    off-by-default variant under A/B); ``default`` stays ``CANDIDATES``' first. Planted: without
    ``ALL_CANDIDATES`` the same label is refused."""
    listed = tiled_backward.CANDIDATES[64]
    extra = dataclasses.replace(listed[0], num_stages=listed[0].num_stages + 1)
    assert extra.label not in {config.label for config in listed}
    with pytest.raises(ValueError, match="not among tiled's candidates"):
        tiny_bench.run_candidates(tmp_path / "bad", budget_s=600, variants=[extra.label])
    monkeypatch.setattr(tiled_backward, "ALL_CANDIDATES", {64: (*listed, extra)}, raising=False)
    assert tiny_bench.run_candidates(tmp_path, budget_s=600, variants=["default", extra.label]) == 0
    rows = read_rows(tmp_path / "candidates.csv")
    assert [row["variant"] for row in rows if row["impl"] == "triton/backward/tiled"] == [listed[0].label, extra.label]


def test_bench_candidates_default_is_the_masks_first(tiny_bench, tmp_path: Path, monkeypatch) -> None:
    """A rung with ``NON_CAUSAL_CANDIDATES`` (gluon/hopper) has its non-causal shapes' ``default`` and sweep from that
    list, its causal ones from ``CANDIDATES``. Planted: a non-causal list led by another variant leads the row."""
    listed = tiled_backward.CANDIDATES[64]
    monkeypatch.setattr(tiled_backward, "NON_CAUSAL_CANDIDATES", {64: (listed[1], listed[0])}, raising=False)
    monkeypatch.setattr(tiny_bench, "SHAPES", (("tiny", 1, 2, 130, 64, False), ("tiny causal", 1, 2, 130, 64, True)))
    assert tiny_bench.run_candidates(tmp_path, budget_s=600, variants=["default"]) == 0
    rows = read_rows(tmp_path / "candidates.csv")
    chosen = [(row["shape"], row["variant"]) for row in rows if row["impl"] == "triton/backward/tiled"]
    assert chosen == [("tiny", listed[1].label), ("tiny causal", listed[0].label)], chosen


def test_bench_candidates_reports_a_wrong_variant_untimed(tiny_bench, tmp_path: Path, monkeypatch) -> None:
    """A variant whose dQ is off (the softmax scale applied twice) is 'wrong' and has no time."""
    real = tiled_backward.tiled_gradients

    def scaled_twice(*args, **kwargs):
        dq, dk, dv = real(*args, **kwargs)
        return dq * args[6].scale, dk, dv

    monkeypatch.setattr(tiled_backward, "tiled_gradients", scaled_twice)
    assert tiny_bench.run_candidates(tmp_path, budget_s=600) == 1
    rows = [row for row in read_rows(tmp_path / "candidates.csv") if row["impl"] == "triton/backward/tiled"]
    assert {row["status"] for row in rows} == {"wrong"}
    assert all(row["bwd_ms"] == "" and "dq_vs_cudnn" in row["reason"] for row in rows)


def test_bench_candidate_rungs_name_real_variants_and_forwards() -> None:
    """``--candidates --rung``: each rung's module has its CANDIDATES and gradients function taking the
    variant by the named keyword, and its forward is a registered rung whose backward is that rung."""
    import importlib
    import inspect

    import bench.backward as bench
    from common.contract.registry import get

    for candidate in bench.CANDIDATE_RUNGS.values():
        module = importlib.import_module(candidate.module)
        assert {64, 128} <= set(module.CANDIDATES)
        assert candidate.keyword in inspect.signature(getattr(module, candidate.gradients)).parameters
        forward = get(candidate.forward or bench.CANDIDATE_FORWARD)
        assert forward.backward is not None and forward.backward.name == candidate.name


def test_bench_ladder_rows_past_the_budget_are_skipped(tiny_bench, tmp_path: Path) -> None:
    assert tiny_bench.run_ladder(tmp_path, ["triton/tiled"], budget_s=600) == 0
    rows = read_rows(tmp_path / "results.csv")
    assert [(row["impl"], row["status"]) for row in rows] == [("sdpa/math", "ok"), ("triton/tiled", "ok")]
    assert float(rows[1]["dq_vs_cudnn"]) < 1e-4
    assert tiny_bench.run_ladder(tmp_path, ["triton/tiled"], budget_s=0) == 0
    assert {row["status"] for row in read_rows(tmp_path / "results.csv")} == {"skipped"}


class Timed:
    """A call to time, named (implementation, column) for the fake timer's log."""

    def __init__(self, call, label: tuple[str, str]):
        self.call, self.label = call, label

    def __call__(self):
        return self.call()


@pytest.fixture
def logged_bench(tiny_bench, monkeypatch: pytest.MonkeyPatch) -> list:
    """The tiny bench with every gradient check and timing logged in order: ('check', impl) when an
    implementation's gradients are taken, (impl, 'bwd'/'fwd_bwd') when a call is timed. The fake timer
    returns the call's place in the log, a clock that slows by 1 ms a call."""
    import common.measure.backward as measure_backward

    log, real = [], measure_backward.gradients_of

    def gradients_of(entry, inputs):
        log.append(("check", entry.name))
        grads, backward, forward_backward = real(entry, inputs)
        return grads, Timed(backward, (entry.name, "bwd")), Timed(forward_backward, (entry.name, "fwd_bwd"))

    def timer(call) -> float:
        call()
        log.append(call.label)
        return float(len(log))

    monkeypatch.setattr(measure_backward, "gradients_of", gradients_of)
    monkeypatch.setattr(tiny_bench, "_timer", timer)
    return log


LADDER = ["sdpa/math", "triton/tiled"]
LADDER_TIMINGS = [(impl, column) for impl in LADDER for column in ("bwd", "fwd_bwd")]


def test_bench_one_round_checks_and_times_row_by_row_as_before(tiny_bench, logged_bench: list, tmp_path: Path) -> None:
    """``--rounds 1`` (the default) is the bench as it was: each row checked, then timed, before the next is
    checked, the columns without ``rounds_ms``, each time the timer's one value."""
    assert tiny_bench.run_ladder(tmp_path, ["triton/tiled"], budget_s=600) == 0
    assert logged_bench == [("check", "sdpa/math"), *LADDER_TIMINGS[:2], ("check", "triton/tiled"), *LADDER_TIMINGS[2:]]
    with (tmp_path / "results.csv").open() as handle:
        assert handle.readline().strip() == ",".join(tiny_bench.COLUMNS)
    rows = read_rows(tmp_path / "results.csv")
    assert [(row["bwd_ms"], row["fwd_bwd_ms"]) for row in rows] == [("2.0", "3.0"), ("5.0", "6.0")]
    assert float(rows[1]["vs_cudnn"]) == pytest.approx(2 / 5)


@pytest.mark.parametrize("rounds", [1, 4])
def test_bench_rounds_check_every_row_first_then_alternate_the_order(
    tiny_bench, logged_bench: list, tmp_path: Path, rounds: int
) -> None:
    """``--rounds 4``: both rows checked before any timing, then four rounds, the second and fourth in reverse;
    each row's times are the medians of its rounds (``rounds_ms``). On the fake's steadily slowing clock the
    ladder row, last in one pass, reads 0.4x cuDNN; in four rounds the two read the same, 1.0x. Planted:
    one round would leave the bias (so the ratio test can fail)."""
    assert tiny_bench.run_ladder(tmp_path, ["triton/tiled"], budget_s=600, rounds=rounds) == 0
    rows = read_rows(tmp_path / "results.csv")
    ratio = float(rows[1]["vs_cudnn"])
    if rounds == 1:
        assert ratio == pytest.approx(0.4)
        return
    checks = [("check", impl) for impl in LADDER]
    one_round = LADDER_TIMINGS
    assert logged_bench == [*checks, *one_round, *one_round[::-1], *one_round, *one_round[::-1]]
    for row in rows:
        each = [float(value) for value in row["rounds_ms"].split()]
        assert len(each) == rounds and float(row["bwd_ms"]) == statistics.median(each), row
    assert ratio == pytest.approx(1.0)


def test_bench_rounds_stop_at_the_budget_keeping_the_rounds_so_far(
    tiny_bench, logged_bench: list, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The budget runs out during the first round of the first shape: that shape's checked rows keep that
    round (ok, 'timed in 1 of 3 rounds'); the next shape's rows are skipped, past --budget-s."""
    shape = tiny_bench.SHAPES[0]
    monkeypatch.setattr(tiny_bench, "SHAPES", (shape, ("tiny", *shape[1:5], False)))
    monkeypatch.setattr(tiny_bench.Table, "over_budget", lambda table: ("sdpa/math", "bwd") in logged_bench)
    assert tiny_bench.run_ladder(tmp_path, ["triton/tiled"], budget_s=600, rounds=3) == 0
    rows = read_rows(tmp_path / "results.csv")
    assert [(row["shape"], row["status"]) for row in rows] == [
        ("tiny causal", "ok"), ("tiny causal", "ok"), ("tiny", "skipped"), ("tiny", "skipped")]  # fmt: skip
    assert all(row["reason"] == "timed in 1 of 3 rounds" and len(row["rounds_ms"].split()) == 1 for row in rows[:2])
    assert {row["reason"] for row in rows[2:]} == {"past --budget-s"}


def test_bench_candidate_rounds_interleave_the_baselines_and_the_variants(
    tiny_bench, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--candidates --rounds 2``: cuDNN's two timings and every variant's backward in one order, reversed in
    the second round; a wrong variant is checked but never timed."""
    calls, real = [], tiled_backward.tiled_gradients
    wrong = tiled_backward.CANDIDATES[64][1].label

    def timer(call) -> float:
        call()
        calls.append(call)
        return float(len(calls))

    def one_wrong(*args, config, **kwargs):
        dq, dk, dv = real(*args, config=config, **kwargs)
        return (dq * 2 if config.label == wrong else dq), dk, dv

    monkeypatch.setattr(tiny_bench, "_timer", timer)
    monkeypatch.setattr(tiled_backward, "tiled_gradients", one_wrong)
    assert tiny_bench.run_candidates(tmp_path, budget_s=600, rounds=2) == 1
    rows = read_rows(tmp_path / "candidates.csv")
    timed = [row for row in rows if row["status"] == "ok"]
    assert len(timed) == len(rows) - 1 == len(tiled_backward.CANDIDATES[64])
    first, second = calls[: len(calls) // 2], calls[len(calls) // 2 :]
    assert len(first) == len(timed) + 1 and second == first[::-1]
    assert all(len(row["rounds_ms"].split()) == 2 for row in timed)
    assert next(row for row in rows if row["variant"] == wrong)["rounds_ms"] == ""


# ----------------------------------------------------------------------------------------------
# compare.py --backward on CPU: a tiny problem under the interpreter, judged against fp64
# ----------------------------------------------------------------------------------------------
COMPARE_ARGS = ["--backward", "--device", "cpu", "--seqlen", "40", "--causal", "true", "--kv-heads", "1",
                "--only", "triton/naive", "--only", "triton/hopper", "--only", "sdpa/*"]  # fmt: skip


def test_compare_backward_writes_rows_plots_and_report(tmp_path: Path) -> None:
    import compare

    assert compare.main([*COMPARE_ARGS, "--out", str(tmp_path)]) == 0
    rows = {row["impl"]: row for row in read_rows(tmp_path / "backward.csv")}
    assert rows["triton/hopper"]["backward"] == "triton/backward/tiled"
    for impl in ("triton/naive", "triton/hopper", "sdpa/math"):
        row = rows[impl]
        assert row["status"] == "ok", row
        assert row["kv_heads"] == "1" and float(row["bwd_ms"]) > 0 and float(row["fwd_bwd_ms"]) > 0
        assert all(0 < float(row[f"{g}_err"]) <= float(row[f"{g}_bound"]) for g in ("dq", "dk", "dv"))
    assert rows["sdpa/cudnn"]["status"] == "skipped" and "CUDA" in rows["sdpa/cudnn"]["reason"]
    for name in ("env.json", "report.md", "bwd_latency.png", "dq_error.png", "dk_error.png", "dv_error.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    report = (tmp_path / "report.md").read_text()
    assert "CPU run" in report and "| triton/hopper | triton/backward/tiled | ok |" in report


def test_compare_backward_rounds_alternate_the_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--rounds 3``: every row that passed its capability check timed three times, the order of the second
    round the first's reversed; each row's times the medians of its rounds (``rounds_ms``), a skipped row
    untimed. ``--rounds`` is refused without ``--backward``."""
    import compare

    calls = []

    def timer(call) -> float:
        call()
        calls.append(call)
        return float(len(calls))

    monkeypatch.setattr(compare, "backward_timer", lambda device: timer)
    assert compare.main([*COMPARE_ARGS, "--rounds", "3", "--out", str(tmp_path)]) == 0
    rows = {row["impl"]: row for row in read_rows(tmp_path / "backward.csv")}
    ok = [row for row in rows.values() if row["status"] == "ok"]
    assert len(ok) == 3 and len(calls) == 3 * 2 * len(ok)
    first, second, third = (calls[index : index + 2 * len(ok)] for index in range(0, len(calls), 2 * len(ok)))
    assert second == first[::-1] and third == first
    for row in ok:
        each = [float(value) for value in row["rounds_ms"].split()]
        assert len(each) == 3 and float(row["bwd_ms"]) == statistics.median(each), row
    assert rows["sdpa/cudnn"]["status"] == "skipped" and rows["sdpa/cudnn"]["rounds_ms"] == ""
    with pytest.raises(SystemExit) as refused:
        compare.main(["--rounds", "2", "--device", "cpu"])
    assert refused.value.code == 2


def test_compare_backward_reports_a_wrong_gradient_and_exits_1(tmp_path: Path, monkeypatch) -> None:
    """dK of the ladder rows halved after the backward: those rows are 'wrong' naming dk, SDPA's stay ok."""
    import common.measure.backward as measure_backward
    import compare

    real = measure_backward.gradients_of

    def dk_halved(entry, inputs):
        (dq, dk, dv), backward, forward_backward = real(entry, inputs)
        return ((dq, dk if entry.name.startswith("sdpa/") else dk / 2, dv), backward, forward_backward)

    monkeypatch.setattr(measure_backward, "gradients_of", dk_halved)
    assert compare.main([*COMPARE_ARGS, "--out", str(tmp_path)]) == 1
    rows = {row["impl"]: row for row in read_rows(tmp_path / "backward.csv")}
    assert rows["sdpa/math"]["status"] == "ok"
    for impl in ("triton/naive", "triton/hopper"):
        assert rows[impl]["status"] == "wrong" and rows[impl]["reason"].startswith("dk"), rows[impl]


def test_a_checked_row_runs_the_problems_own_softmax_scale() -> None:
    """The sweep's ladder contender runs ``problem.softmax_scale``, as the fp64 reference and SDPA do (the CPU gradient
    fuzz found it at the default scale: dQ, dK, dV 0.45 off at a scale of 0.5). Planted: judged at the default scale,
    the same row is wrong."""
    from common.contract.registry import lookup
    from common.measure.backward import checked_row

    prob = problem(17, 23, causal=True).with_(softmax_scale=0.5)
    inputs = backward_inputs(prob, seed=3, device="cpu", offset=0.5)
    judged_against = (reference_gradients(*inputs, prob), sdpa_gradients(*inputs, prob))
    row, _ = checked_row(lookup("triton/tiled"), prob, inputs, judged_against)
    assert row["status"] == "ok", row["reason"]
    default = prob.with_(softmax_scale=None)
    planted = (reference_gradients(*inputs, default), sdpa_gradients(*inputs, default))
    assert checked_row(lookup("triton/tiled"), prob, inputs, planted)[0]["status"] == "wrong"


# ----------------------------------------------------------------------------------------------
# bench/train.py: the data, the verdict, and a tiny training run on CPU (fp32, interpreter)
# ----------------------------------------------------------------------------------------------
TINY_RECIPE = {"layers": 1, "hidden": 128, "heads": 2, "kv_heads": 1, "intermediate": 256, "vocab": 64,
               "seqlen": 64, "batch": 2, "steps": 3, "warmup": 2, "min_period": 4, "max_period": 8}  # fmt: skip
# fp32 on CPU: the ladder's losses and SDPA's agree to rounding; a planted gradient bug moves them more.
TRAIN_RTOL = 1e-5


def test_train_data_is_deterministic_and_periodic() -> None:
    from bench.train import Recipe, batch_of

    recipe = Recipe(**TINY_RECIPE)
    tokens = batch_of(recipe, step=5, seed=0, device="cpu")
    assert torch.equal(tokens, batch_of(recipe, step=5, seed=0, device="cpu"))
    assert not torch.equal(tokens, batch_of(recipe, step=6, seed=0, device="cpu"))
    for row in tokens:
        period = next(p for p in range(recipe.min_period, recipe.max_period + 1) if torch.equal(row[p:], row[:-p]))
        assert recipe.min_period <= period <= recipe.max_period


def test_train_verdict_uses_the_larger_of_seed_spread_and_one_percent() -> None:
    from bench.train import verdict

    assert verdict(1.009, 1.0, 1.001)["passed"] and not verdict(1.011, 1.0, 1.001)["passed"]
    assert verdict(1.04, 1.0, 1.05)["passed"] and not verdict(1.06, 1.0, 1.05)["passed"]


def test_train_without_a_gpu_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.train import main

    assert main(["--out", "/nonexistent"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.parametrize("planted", [False, True], ids=["as_is", "dk_sign_flipped"])
def test_train_ladder_losses_follow_sdpa(planted: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three steps of the same model, init and data: the ladder's losses equal SDPA's to fp32 rounding,
    and dK with the wrong sign makes them differ (so the comparison can fail; a dK off by a constant
    factor would not: AdamW normalises each parameter's gradient scale away)."""
    from bench.train import LADDER, SDPA, Recipe, train
    from common.contract.autograd import AttentionFunction

    recipe = Recipe(**TINY_RECIPE)
    sdpa_losses = train(recipe, SDPA, 0, "cpu")
    if planted:
        real = AttentionFunction.backward

        def dk_sign_flipped(ctx, d_out, d_lse=None):
            dq, dk, *rest = real(ctx, d_out, d_lse)
            return (dq, -dk, *rest)

        monkeypatch.setattr(AttentionFunction, "backward", staticmethod(dk_sign_flipped))
    ladder_losses = train(recipe, LADDER, 0, "cpu")
    assert ladder_losses[0] == pytest.approx(sdpa_losses[0], rel=TRAIN_RTOL)
    same = ladder_losses == pytest.approx(sdpa_losses, rel=TRAIN_RTOL)
    assert same != planted, (ladder_losses, sdpa_losses)


def test_train_run_gives_each_ladder_stack_its_verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run per ladder stack beside the two SDPA runs, a verdict each; a stack whose run fails (planted)
    has no verdict and the exit status is 1."""
    import bench.train as train_tool

    recipe = train_tool.Recipe(**TINY_RECIPE)
    assert train_tool.run(tmp_path / "ok", recipe, "cpu", ("ladder:triton",)) == 0
    summary = json.loads((tmp_path / "ok" / "summary.json").read_text())
    assert set(summary["verdicts"]) == {"ladder:triton"} and summary["verdicts"]["ladder:triton"]["passed"]
    real = train_tool.train

    def broken_gluon(recipe, attn_implementation, seed, device):
        if attn_implementation == "ladder:gluon":
            raise RuntimeError("planted")
        return real(recipe, attn_implementation, seed, device)

    monkeypatch.setattr(train_tool, "train", broken_gluon)
    assert train_tool.run(tmp_path / "bad", recipe, "cpu", ("ladder:triton", "ladder:gluon")) == 1
    summary = json.loads((tmp_path / "bad" / "summary.json").read_text())
    assert set(summary["verdicts"]) == {"ladder:triton"} and "planted" in summary["failures"]["ladder:gluon seed 0"]


# Each backward rung with tile variants: the forward whose O and LSE it differentiates, its gradients
# function, the keyword that takes a variant and its variants (every one, those a release leaves out of
# its CANDIDATES for spilling included: a spill slows a kernel, it must not make it wrong).
VARIANT_RUNGS = (
    ("triton/tiled", tiled_backward.tiled_gradients, "config", tiled_backward.ALL_CANDIDATES),
    ("gluon/hopper", gluon_backward.hopper_gradients, "tiles", gluon_backward.ALL_CANDIDATES),
)
GPU_VARIANTS = [
    pytest.param(forward, gradients, {keyword: variant}, head_dim, id=f"{forward}-d{head_dim}-{variant.label}")
    for forward, gradients, keyword, candidates in VARIANT_RUNGS
    for head_dim, variants in candidates.items()
    for variant in variants
]


@pytest.mark.gpu
@pytest.mark.parametrize(("forward", "gradients", "variant", "head_dim"), GPU_VARIANTS)
def test_gpu_every_candidate_passes_the_rule(forward: str, gradients, variant: dict, head_dim: int) -> None:
    """Each variant the candidates bench may make the default (the tiled rung's and the Gluon rung's),
    bf16 on the GPU, GQA, causal bottom-right, ragged lengths over several blocks (key and query tails
    inside them), against fp64 by the same rule; also Sq > Sk, whose first query blocks see no key (a dQ
    CTA without a step)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    for seqlen_q, seqlen_k, heads in ((300, 1000, 8), (1000, 300, 6)):
        prob = problem(seqlen_q, seqlen_k, heads=heads, kv_heads=2, head_dim=head_dim, causal=True,
                       alignment="bottom_right").with_(dtype=torch.bfloat16)  # fmt: skip
        q, k, v = make_inputs(prob, seed=12, device="cuda", offset=0.5)
        generator = torch.Generator(device="cuda").manual_seed(4)
        d_out = torch.randn(q.shape, generator=generator, device="cuda").bfloat16()
        with torch.no_grad():
            out, lse = attention(q, k, v, causal=True, causal_alignment="bottom_right", impl=forward, return_lse=True)
        assert_all_pass(gradients(q, k, v, out, lse, d_out, prob, **variant), q, k, v, d_out, prob)
