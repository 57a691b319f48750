"""One ``cute_impl.fp8`` knob's A/B at P1 (B=2 H=16 S=8192 D=128 bf16, FA3 inputs), issue #37, shared by
``bench.fp8_tile_work`` and ``bench.fp8_quotient``: causal first, then non-causal, in one process, ``--rounds`` rounds
in ``fp8_q_in_kernel.interleaved_samples``' order (reversed every other round; medians, every timing
``common.measure.timing.time_cuda``: L2 flushed): cute/hopper (bf16, the issue's denominator), then per setting
cute/fp8 kernel only and end to end (the K/V quantiser + the kernel per call), and the quantiser alone. Before any
timing each setting's kernel-only and end-to-end O is checked equal to the first setting's kernel only, bit for bit
(these knobs change how Q's e4m3 values are computed, not their bytes); one that differs is not timed and the run
exits 1."""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass

import torch

from bench import fp8_q_in_kernel, require_gpu
from bench.fp8_q_in_kernel import cell
from common.contract.problem import Problem
from common.measure.timing import tflops

Key = tuple[str, str]


@dataclass(frozen=True)
class Fp8KnobAB:
    """``knob`` (a ``cute_impl.fp8`` attribute, read when a launch is built) at each of ``settings`` (name -> value,
    the first the reference every O is compared with); ``config_field``: the launch config's field that must then
    hold the value; ``title`` and ``stem`` name the table and its files; ``max_rel_l2``: 0 (O bit for bit the
    reference's) or the relative L2 distance a knob that reorders fp32 arithmetic may leave."""

    knob: str
    settings: dict[str, object]
    title: str
    stem: str
    config_field: str | None = None
    max_rel_l2: float = 0.0

    @property
    def reference(self) -> str:
        return next(iter(self.settings))

    def runs(self, problem: Problem, inputs) -> dict[Key, object]:
        """What one case times, keyed (setting, kind)."""
        from cute_impl import fp8, hopper

        runs: dict[Key, object] = {("bf16", "kernel"): hopper.prepare(*inputs, problem)}
        default = getattr(fp8, self.knob)
        for name, value in self.settings.items():
            setattr(fp8, self.knob, value)
            try:
                runs[(name, "kernel")] = fp8.prepare(*inputs, problem)
                runs[(name, "e2e")] = fp8.prepare_end_to_end(*inputs, problem)
            finally:
                setattr(fp8, self.knob, default)
            if self.config_field:
                assert getattr(runs[(name, "kernel")].config, self.config_field) == value, (name, self.config_field)
        kernel = runs[(self.reference, "kernel")]
        runs[(self.reference, "quantiser")] = lambda: kernel.quantise(*inputs)
        return runs

    def differing(self, runs: dict[Key, object]) -> list[Key]:
        """The cute/fp8 runs whose O differs from the reference setting's kernel only (each launched once more after
        NaN-poisoning its O, so an unwritten tile cannot pass)."""
        from common.contract.check import run_poisoned

        reference = runs[(self.reference, "kernel")]().clone()
        checked = [key for key in runs if key[0] != "bf16" and key[1] != "quantiser"]
        return [key for key in checked if not self.same(run_poisoned(runs[key]), reference)]

    def same(self, out: torch.Tensor, reference: torch.Tensor) -> bool:
        """``out`` is ``reference`` bit for bit, or within ``max_rel_l2`` of it (NaN never is)."""
        if self.max_rel_l2 == 0.0:
            return torch.equal(out, reference)
        distance = torch.linalg.vector_norm((out - reference).double()) / torch.linalg.vector_norm(reference.double())
        return bool(distance <= self.max_rel_l2)

    def case_rows(self, causal: bool, inputs, args: argparse.Namespace) -> list[dict]:
        problem = fp8_q_in_kernel.problem_of(args, causal)
        runs = self.runs(problem, inputs)
        differing = self.differing(runs)
        for name, kind in differing:
            print(f"causal={causal!s:5s} cute/fp8 {name} {kind}: O differs from {self.reference}'s, not timed")
            del runs[(name, kind)]
        samples = fp8_q_in_kernel.interleaved_samples(runs, args.rounds, args)
        rows = [self._row(causal, key, values, samples, problem) for key, values in samples.items()]
        return rows + [{"causal": causal, "rung": "cute/fp8", "setting": name, "what": f"{kind}: O differs", "us": "",
                        "tflops": "", "vs_bf16": "", "spread_us": ""} for name, kind in differing]  # fmt: skip

    @staticmethod
    def _row(causal: bool, key: Key, values: list[float], samples: dict, problem: Problem) -> dict:
        (name, kind), us = key, statistics.median(values) * 1e3
        bf16_us = statistics.median(samples[("bf16", "kernel")]) * 1e3
        attention = kind != "quantiser"
        row = {"causal": causal, "rung": "cute/hopper" if name == "bf16" else "cute/fp8", "setting": name,
               "what": kind, "us": us, "tflops": tflops(problem.flops, us * 1e-3) if attention else "",
               "vs_bf16": bf16_us / us if attention else "",
               "spread_us": (max(values) - min(values)) * 1e3}  # fmt: skip
        rate = f" {row['tflops']:.0f} TFLOP/s, {row['vs_bf16']:.3f}x bf16" if attention else ""
        print(f"causal={causal!s:5s} {row['rung']:11s} {name:13s} {kind:9s} {us:8.1f} us{rate} "
              f"(spread {row['spread_us']:.1f} us)", flush=True)  # fmt: skip
        return row

    def main(self, doc: str) -> None:
        args = fp8_q_in_kernel.arguments(doc, f"runs/{self.stem}")
        require_gpu(f"bench.{self.stem}")
        rows = fp8_q_in_kernel.both_masks(args, self.case_rows)
        lines = [f"# cute/fp8, {self.title}, {torch.cuda.get_device_name()} (P1, {args.rounds} rounds)", "",
                 "| causal | rung | setting | what | µs | TFLOP/s | ÷ cute/hopper | spread µs |",
                 "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for row in rows:
            cells = [row["causal"], row["rung"], row["setting"], row["what"], cell(row["us"], 1),
                     cell(row["tflops"], 0), cell(row["vs_bf16"], 3), cell(row["spread_us"], 1)]  # fmt: skip
            lines.append("| " + " | ".join(str(text) for text in cells) + " |")
        fp8_q_in_kernel.write(args.out, self.stem, rows, lines)
        # A setting whose O differs was not timed: the run fails, so the A/B cannot be read as a result.
        if any(row["us"] == "" for row in rows):
            sys.exit(1)
