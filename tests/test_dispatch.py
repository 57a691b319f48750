"""Per-stack dispatch (common/contract/dispatch.py): ``impl="triton" | "gluon" | "cute" | "auto"``.

Fake rungs that accept every problem and record each ``prepare`` and ``bind`` show which rung a
stack name runs for a decode step (Sq=1 against 1000 keys) and a prefill (Sq=Sk=128), on the call
that plans the signature and on the plan-cache hit after it. Planted wrong routes (decode sent to a
prefill rung, a decode threshold of zero, a plan key without the shapes) must fail the same check.
Then the real registry on CPU: the Triton stack under the interpreter, the GPU-only stacks refusing
with every candidate's reason.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import common.contract.api as api
from common import attention, plan_cache_info
from common.contract import dispatch
from common.contract.inputs import make_inputs
from common.contract.problem import Problem
from common.contract.registry import Implementation, Unavailable, discover

DECODE = Problem(batch=1, heads=4, seqlen_q=1, seqlen_k=1000, head_dim=64, dtype=torch.float32, kv_heads=2)
PREFILL = dataclasses.replace(DECODE, seqlen_q=128, seqlen_k=128)
# What each stack name must run: (decode rung, prefill rung); "auto" takes the first stack of its order.
EXPECTED = {stack: (f"{stack}/decode", f"{stack}/hopper") for stack in dispatch.STACK_NAMES}
EXPECTED["auto"] = EXPECTED[dispatch.AUTO_ORDER[0]]


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api, "_PLANS", api.PlanCache())


def recording_registry(calls: list[tuple[str, str]]):
    """A lookup of fake rungs (every stack, every rung) that accept anything and record their calls."""

    def fake(name: str) -> Implementation:
        stack, rung = name.split("/")

        def recorded(kind: str):
            def make(q, k, v, problem, **extra):
                calls.append((name, kind))
                return lambda: torch.zeros_like(q)

            return make

        return Implementation(
            name, stack, rung, prepare=recorded("prepare"), bind=recorded("bind"),
            supports=lambda problem, device: (True, ""), runs_on_cpu=True,
        )  # fmt: skip

    return fake


def dispatched(name: str, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(rung, prepare | bind) of each call: decode, prefill, then both again (plan-cache hits)."""
    calls: list[tuple[str, str]] = []
    monkeypatch.setattr(dispatch, "lookup", recording_registry(calls))
    for problem in (DECODE, PREFILL, DECODE, PREFILL):
        attention(*make_inputs(problem, device="cpu"), impl=name)
    return calls


def check_routes(name: str, calls: list[tuple[str, str]]) -> None:
    """The rule: the decode rung for the decode step, the hopper rung for the prefill, planned once
    each and reused from the plan on the second call."""
    decode, prefill = EXPECTED[name]
    expected = [(decode, "prepare"), (prefill, "prepare"), (decode, "bind"), (prefill, "bind")]
    assert calls == expected, f"{name}: ran {calls}, expected {expected}"


@pytest.mark.parametrize("name", dispatch.DISPATCH_NAMES)
def test_each_stack_routes_decode_and_prefill(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    check_routes(name, dispatched(name, monkeypatch))
    assert plan_cache_info().hits == 2


def plant_decode_to_prefill(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatch, "DECODE_RUNG", "hopper")


def plant_no_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatch, "DECODE_MAX_SEQLEN_Q", 0)


def plant_key_without_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan key of the name alone: the prefill would reuse the decode step's plan."""
    monkeypatch.setattr(api, "_plan_key", lambda impl, q_signature, k, v, options_signature: (impl,))


@pytest.mark.parametrize("plant", [plant_decode_to_prefill, plant_no_decode, plant_key_without_shapes])
@pytest.mark.parametrize("name", ["triton", "auto"])
def test_a_planted_wrong_route_is_caught(name: str, plant, monkeypatch: pytest.MonkeyPatch) -> None:
    plant(monkeypatch)
    with pytest.raises(AssertionError):
        check_routes(name, dispatched(name, monkeypatch))


def test_fp8_is_never_chosen_implicitly_and_no_prefill_rung_is_left_out() -> None:
    """Each stack's preference list holds exactly its registry rungs, less fp8 (opt-in) and decode."""
    available, missing = discover(include_baselines=False)
    for stack in dispatch.STACK_NAMES:
        rungs = {item.name.split("/")[1] for item in (*available, *missing) if item.name.startswith(f"{stack}/")}
        assert set(dispatch.PREFILL_ORDER[stack]) == rungs - {"fp8", dispatch.DECODE_RUNG}, stack


def test_decode_threshold_matches_the_decode_rungs() -> None:
    from triton_impl import decode as triton_decode

    assert triton_decode.MAX_SEQLEN_Q == dispatch.DECODE_MAX_SEQLEN_Q
    cute_decode = pytest.importorskip("cute_impl.decode")
    assert cute_decode.MAX_SEQLEN_Q == dispatch.DECODE_MAX_SEQLEN_Q


def test_phases() -> None:
    assert dispatch.is_decode(DECODE) and not dispatch.is_decode(PREFILL)
    assert dispatch.is_decode(dataclasses.replace(DECODE, seqlen_q=16, seqlen_k=17))
    assert not dispatch.is_decode(dataclasses.replace(DECODE, seqlen_q=17, seqlen_k=1000))
    assert not dispatch.is_decode(dataclasses.replace(DECODE, seqlen_q=8, seqlen_k=8))  # a short prompt


def test_auto_tries_every_decode_rung_before_a_prefill_rung() -> None:
    names = dispatch.routes("auto", DECODE)
    decode_count = len(dispatch.AUTO_ORDER)
    assert all(name.endswith("/decode") for name in names[:decode_count])
    assert not any(name.endswith("/decode") for name in names[decode_count:])


# ---------------------------------------------------------------- the real registry on this CPU
CPU = torch.device("cpu")


@pytest.mark.parametrize(("problem", "rung"), [(DECODE, "triton/decode"), (PREFILL, "triton/hopper")])
def test_triton_runs_the_phase_rung_on_cpu(problem: Problem, rung: str) -> None:
    """The interpreter runs both: the stack name's output is the chosen rung's, bit for bit."""
    q, k, v = make_inputs(problem, device="cpu", offset=0.5)
    assert dispatch.choose("triton", problem, CPU).implementation.name == rung
    out = attention(q, k, v, impl="triton")
    assert torch.equal(out, attention(q, k, v, impl="triton"))  # the plan-cache hit
    assert torch.equal(out, attention(q, k, v, impl=rung))
    assert plan_cache_info().hits == 1


def test_auto_falls_back_to_triton_without_a_gpu() -> None:
    choice = dispatch.choose("auto", DECODE, CPU)
    assert choice.implementation.name == "triton/decode"
    assert [candidate for candidate, _ in choice.refusals] == ["cute/decode", "gluon/decode"]
    assert all("needs a CUDA GPU" in reason for _, reason in choice.refusals)


def test_auto_skips_a_stack_that_does_not_import(monkeypatch: pytest.MonkeyPatch) -> None:
    real = dispatch.lookup
    broken = Unavailable("cute_impl.decode", "import failed: No module named 'cutlass'")
    monkeypatch.setattr(dispatch, "lookup", lambda name: broken if name.startswith("cute/") else real(name))
    choice = dispatch.choose("auto", DECODE, CPU)
    assert choice.implementation.name == "triton/decode"
    assert choice.refusals[0] == ("cute/decode", "unavailable: import failed: No module named 'cutlass'")


@pytest.mark.parametrize("name", ["gluon", "cute"])
def test_a_stack_that_cannot_run_lists_every_candidate(name: str) -> None:
    q, k, v = make_inputs(DECODE, device="cpu")
    with pytest.raises(ValueError, match=f"no rung of '{name}' can run") as refused:
        attention(q, k, v, impl=name)
    for candidate in dispatch.routes(name, DECODE):
        assert f"  {candidate} needs a CUDA GPU" in str(refused.value)
        assert f"{candidate}: {candidate}" not in str(refused.value)


def test_each_refusal_names_its_candidate_once() -> None:
    """A reason that opens with the rung's name keeps it; any other gets it in front (planted: the doubled form)."""
    choice = dispatch.Choice(
        "triton", None, (("triton/hopper", "triton/hopper: bf16 refused"), ("triton/tiled", "bf16 refused"))
    )
    lines = choice.refusal_lines()
    assert lines == ("triton/hopper: bf16 refused", "triton/tiled: bf16 refused")
    assert "triton/hopper: triton/hopper" not in choice.describe()


def test_an_unknown_name_lists_the_stack_names() -> None:
    q, k, v = make_inputs(PREFILL, device="cpu")
    with pytest.raises(ValueError, match="triton, gluon, cute, auto"):
        attention(q, k, v, impl="tritonn")
    with pytest.raises(ValueError, match="dispatch name must be one of"):
        dispatch.routes("tritonn", PREFILL)
