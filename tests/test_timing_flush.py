"""``time_cuda``'s flushes on a fake, CUDA-less device (CPU): the stream order of zeroing, clean read, events and
the timed call, as the fake driver sees them enqueued.

``"write"`` must be ``triton.testing.do_bench`` as before; ``"clean"`` must enqueue the same calls with a clean read
after every zeroing and before every start event, and is the default. A planted bug (the read landing after the
start event) fails.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import triton
import triton.testing

from common.measure import timing

# The fake timed call's duration; flushes take no fake time, so both flushes run the same counts.
FN_MS = 0.01


class FakeDevice:
    """The device interface ``do_bench`` uses (``torch.cuda``'s part of it), logging to ``ops``."""

    def __init__(self, ops: list[str]) -> None:
        self.ops = ops
        self.clock_ms = 0.0
        self.events = 0
        self.starts: set[int] = set()
        # A planted bug: a read enqueued now lands after the next event.
        self.deferred: list[str] = []
        device = self

        class Event:
            def __init__(self, enable_timing: bool) -> None:
                assert enable_timing
                self.ms = 0.0
                self.serial = device.events = device.events + 1

            def record(self) -> None:
                self.ms = device.clock_ms
                device.ops.append(f"event {self.serial}")
                device.ops.extend(device.deferred)
                device.deferred.clear()

            def elapsed_time(self, end: Event) -> float:
                device.starts.add(self.serial)
                return end.ms - self.ms

        self.Event = Event

    def synchronize(self) -> None:
        self.ops.append("sync")

    def run(self) -> None:
        self.clock_ms += FN_MS
        self.ops.append("fn")

    def named(self) -> list[str]:
        """``ops`` with each event named by its role (``start`` of a timing or its ``end``)."""
        return [("start" if int(op.split()[1]) in self.starts else "end") if op.startswith("event") else op
                for op in self.ops]  # fmt: skip


class FakeDriver:
    def __init__(self, device: FakeDevice) -> None:
        self.device = device

    def get_device_interface(self) -> FakeDevice:
        return self.device

    def get_empty_cache_for_benchmark(self) -> str:
        return "cache"

    def clear_cache(self, cache: str) -> None:
        assert cache == "cache"
        self.device.ops.append("zero")


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDevice]:
    """A fake active Triton driver (for ``do_bench`` and the clean loop alike) and the clean read logged."""
    fake = FakeDevice([])
    monkeypatch.setattr(type(triton.runtime.driver), "active", property(lambda _: FakeDriver(fake)))
    monkeypatch.setattr(timing, "_read_back", lambda cache: fake.ops.append("clean"))
    yield fake


def traced(device: FakeDevice, flush: timing.Flush, **options: object) -> list[str]:
    timing.time_cuda(device.run, warmup_ms=1, rep_ms=1, flush=flush, **options)
    return device.named()


def timed_windows(ops: list[str]) -> list[tuple[list[str], list[str]]]:
    """(what was enqueued after the previous call or end event, what between the events) of each timed single call."""
    windows = []
    for index, op in enumerate(ops):
        end = ops.index("end", index) if op == "start" else index
        if ops[index + 1 : end] == ["fn"]:
            previous = max(i for i in range(index) if ops[i] in ("fn", "end"))
            windows.append((ops[previous + 1 : index], ops[index + 1 : end]))
    return windows


def assert_flushed_before_every_start(ops: list[str], flush: list[str]) -> None:
    """Every timed call: ``flush`` enqueued right before its start event, nothing but the call inside."""
    windows = timed_windows(ops)
    assert windows, "no timed call"
    for before, inside in windows:
        assert before == flush, (before, inside)
        assert inside == ["fn"], inside
    assert ops.count("clean") == ("clean" in flush) * ops.count("zero")


def test_clean_reads_after_the_zeroing_and_before_every_start(device: FakeDevice) -> None:
    assert_flushed_before_every_start(traced(device, "clean"), ["zero", "clean"])


def test_write_is_do_bench_unchanged(device: FakeDevice, monkeypatch: pytest.MonkeyPatch) -> None:
    ops = traced(device, "write")
    assert "clean" not in ops
    assert_flushed_before_every_start(ops, ["zero"])
    calls: list[tuple] = []

    def recorder(fn: Callable[[], object], **kwargs: object) -> list[float]:
        calls.append((fn, kwargs))
        return [3.0, 1.0, 2.0]

    monkeypatch.setattr(triton.testing, "do_bench", recorder)
    result = timing.time_cuda(device.run, warmup_ms=7, rep_ms=9, flush="write")
    assert calls == [(device.run, {"warmup": 7, "rep": 9, "return_mode": "all"})]
    assert result == timing.Timing(2.0, 1.0, 3.0, False)


def test_clean_runs_do_bench_step_for_step(device: FakeDevice) -> None:
    """Less its reads, "clean" enqueues what this Triton's do_bench does: estimate, warm-up, repetitions."""
    written = traced(device, "write")
    device.ops.clear()
    cleaned = traced(device, "clean")
    assert [op for op in cleaned if op != "clean"] == written


def test_clean_flushes_around_a_cuda_graph_replay(device: FakeDevice, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timing, "_graphed", lambda fn: lambda: (device.ops.append("replay"), fn()))
    ops = [op for op in traced(device, "clean", cuda_graph=True) if op != "replay"]
    assert_flushed_before_every_start(ops, ["zero", "clean"])
    assert device.ops.count("replay") == device.ops.count("fn")


def test_planted_read_after_the_start_event_fails(device: FakeDevice, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timing, "_read_back", lambda cache: device.deferred.append("clean"))
    with pytest.raises(AssertionError):
        assert_flushed_before_every_start(traced(device, "clean"), ["zero", "clean"])


def test_clean_is_the_default(device: FakeDevice) -> None:
    timing.time_cuda(device.run, warmup_ms=1, rep_ms=1)
    assert device.ops.count("clean") == device.ops.count("zero") > 0


def test_unknown_flush_is_refused(device: FakeDevice) -> None:
    with pytest.raises(ValueError, match="flush"):
        timing.time_cuda(device.run, flush="none")  # type: ignore[arg-type]
