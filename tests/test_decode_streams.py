"""triton/decode's and gluon/decode's arrival counters are one buffer a device (``decode.arrival_counters``): two
launches that overlap would count their CTAs in one counter, so a CTA could take itself for its tile's last and merge
partials not yet written, a wrong answer without an error. ``decode.order_counter_users`` orders every eager bind after
the last one's stream when the stream changes, so launches from several streams of one process run one after another.

CPU: the rule on stand-in streams (one stream never waits; a switch waits for the last stream, both ways; a capturing
stream neither waits nor becomes the last); planted, an ordering that never waits fails the same check; every bind of
the counters asks the rule. GPU (``gpu``): each rung's launch on a second stream, bound while the first stream still
has a tenth of a second of work queued before its own launch, finishes after the first stream (and both outputs equal
an undisturbed launch's bit for bit); planted, with the ordering removed it finishes first.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from triton_impl import decode

CUDA0 = torch.device("cuda", 0)


class _Stream:
    """A stand-in for ``torch.cuda.Stream``: its name, and the streams it was made to wait for."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.waited_for: list[str] = []

    def wait_stream(self, other: _Stream) -> None:
        self.waited_for.append(other.name)


def _waits(
    order: Callable[[torch.device], None], steps: list[tuple[_Stream, bool]], monkeypatch: pytest.MonkeyPatch
) -> list[str]:
    """Each (stream, capturing) step's bind ordered by ``order`` on a fresh device table: who waited for whom."""
    monkeypatch.setattr(decode, "_COUNTER_STREAMS", {})
    waits = []
    for stream, capturing in steps:
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None, s=stream: s)
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda c=capturing: c)
        before = len(stream.waited_for)
        order(CUDA0)
        waits += [f"{stream.name}<-{name}" for name in stream.waited_for[before:]]
    return waits


def _switches_wait(order: Callable[[torch.device], None], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What is wrong with ``order`` on the rule's cases (empty: nothing)."""
    wrong = []
    one = _Stream("one")
    if _waits(order, [(one, False), (one, False), (one, False)], monkeypatch):
        wrong.append("one stream waited for itself")
    a, b = _Stream("a"), _Stream("b")
    if (got := _waits(order, [(a, False), (b, False), (b, False), (a, False)], monkeypatch)) != ["b<-a", "a<-b"]:
        wrong.append(f"switches a -> b -> a waited {got}, not b<-a then a<-b")
    eager, graph, other = _Stream("eager"), _Stream("graph"), _Stream("other")
    steps = [(eager, False), (graph, True), (other, False)]
    if (got := _waits(order, steps, monkeypatch)) != ["other<-eager"]:
        wrong.append(f"a capture between two eager streams waited {got}, not other<-eager alone")
    return wrong


def test_a_bind_on_another_stream_waits_for_the_last_one(monkeypatch: pytest.MonkeyPatch):
    assert _switches_wait(decode.order_counter_users, monkeypatch) == []


def test_planted_ordering_that_never_waits_fails_the_check(monkeypatch: pytest.MonkeyPatch):
    assert _switches_wait(lambda device: None, monkeypatch) == [
        "switches a -> b -> a waited [], not b<-a then a<-b",
        "a capture between two eager streams waited [], not other<-eager alone",
    ]


def test_every_bind_of_the_counters_asks_the_rule(monkeypatch: pytest.MonkeyPatch):
    asked = []
    monkeypatch.setattr(decode, "order_counter_users", asked.append)
    decode.arrival_counters(torch.device("cpu"), 1)
    assert asked == [torch.device("cpu")]


def _second_stream_finishes_after_the_first(impl: str, device: torch.device) -> bool:
    """Whether ``impl``'s launch on stream b, bound while stream a holds a tenth of a second of sleep and then its
    own launch, finishes after stream a; raises if either output differs from an undisturbed launch's."""
    from common.contract.api import attention

    generator = torch.Generator(device=device).manual_seed(20261206)
    q = torch.randn(1, 8, 1, 128, device=device, dtype=torch.bfloat16, generator=generator)
    k, v = (torch.randn(1, 1, 65536, 128, device=device, dtype=torch.bfloat16, generator=generator) for _ in "kv")
    undisturbed = attention(q, k, v, impl=impl)
    torch.cuda.synchronize(device)
    a, b = torch.cuda.Stream(device), torch.cuda.Stream(device)
    with torch.cuda.stream(a):
        torch.cuda._sleep(200_000_000)
        out_a = attention(q, k, v, impl=impl)
    with torch.cuda.stream(b):
        out_b = attention(q, k, v, impl=impl)
    b.synchronize()
    after = a.query()
    torch.cuda.synchronize(device)
    assert torch.equal(out_a, undisturbed) and torch.equal(out_b, undisturbed), f"{impl}: an output changed"
    return after


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["triton/decode", "gluon/decode"])
def test_gpu_a_launch_on_a_second_stream_waits_for_the_first(impl: str, monkeypatch: pytest.MonkeyPatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    device = torch.device("cuda", torch.cuda.current_device())
    assert _second_stream_finishes_after_the_first(impl, device), f"{impl}: stream b ran beside stream a"
    monkeypatch.setattr(decode, "order_counter_users", lambda device: None)
    assert not _second_stream_finishes_after_the_first(impl, device), f"{impl}: planted, b still waited for a"
