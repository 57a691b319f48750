"""Helpers the test files share: skipping a case a rung refuses, a stand-in package for a baseline's
import, compiling in a child process (one script, or a batch of scripts in one process), and the problem
features the CuTe rungs' GPU tests cross (masks, edge key lengths, the shared check, the FP8 rungs' cases)."""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from common.contract.check import check_on_inputs
from common.contract.fp8 import fa3_inputs
from common.contract.inputs import make_inputs, make_paged_kv
from common.contract.problem import Problem
from common.contract.registry import Implementation
from common.reporting.static import compile_environment

ROOT = Path(__file__).resolve().parents[1]


def require_supported(impl: Implementation, problem: Problem, device: torch.device | str) -> None:
    """Skip the test, with the rung's own reason, when its capability check refuses ``problem`` on
    ``device``; a refusal is a skip that says why, never a pass."""
    ok, reason = impl.check(problem, torch.device(device))
    if not ok:
        pytest.skip(reason)


def install_fake_package(root: Path, files: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in package under ``root``: each of ``files`` (path under ``root`` -> source, dedented) written,
    ``root`` first on sys.path and any cached import of the package (the first part of the paths) dropped."""
    for relative, source in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(root))
    packages = {Path(relative).parts[0] for relative in files}
    for name in [name for name in sys.modules if name.split(".")[0] in packages]:
        monkeypatch.delitem(sys.modules, name)


def json_from_child(args: list[str], timeout: float) -> Any:
    """Run ``python *args`` from the project root in a process without ``TRITON_INTERPRET`` (Triton and
    Gluon compile for sm_90a there; the CPU test session interprets) and return its last stdout line,
    parsed as JSON. A failing child fails the test with the end of its stderr."""
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=compile_environment(), capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"the child process failed:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def json_from_child_with_empty_triton_cache(script: str, timeout: float) -> Any:
    """Run ``python -c script`` from the project root (this process's environment, the root as ``PYTHONPATH``)
    with an empty Triton cache of its own, and return its last stdout line, parsed as JSON. For a planted bug on
    the GPU: Triton keys a compiled kernel on its callees' source as first seen in the process, so in a shared
    process (or from the disk cache) the unplanted kernel could run for the planted one, or the planted one be
    cached for later tests. A failing child fails the test with the end of its stderr."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TRITON_CACHE_DIR": cache, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(
            [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def triton_balanced_sm90(problem: Problem) -> Any:
    """triton/decode's balanced split kernel for ``problem`` compiled for sm_90a as ``bind_balanced`` launches it
    (its constexprs, ``M_TILE_MAJOR`` as the module holds it, and ``launch_options``): the static tests' one copy,
    for a child process (``json_from_child``), where Triton compiles instead of interpreting."""
    from common.toolchain.compile import compile_triton_sm90
    from triton_impl import decode
    from triton_impl._host import POINTER_ALIGNED, pointer_signature

    signature = {
        **pointer_signature(problem.dtype), "OutPartial": "*fp32", "LsePartial": "*fp32", "Counters": "*i32",
        "batch_size": "i32", "target_shares": "i32", "min_share_blocks": "i32", "max_item_shares": "i32",
    }  # fmt: skip
    constexprs = decode.balanced_constexprs(problem, decode.M_TILE_MAJOR)
    if problem.page_size:
        signature.update({"BlockTable": "*i32", "stride_btb": "i32"})
    else:
        constexprs.update({"BlockTable": None, "stride_btb": None})
    return compile_triton_sm90(
        decode._balanced_split_kernel, signature, constexprs, options=decode.launch_options(problem),
        aligned=(*POINTER_ALIGNED, "OutPartial", "LsePartial"),
    )  # fmt: skip


def triton_decode_sm90_facts(problem: Problem, kernel: str) -> tuple[Any, dict[str, int]]:
    """triton/decode's ``kernel`` ("split": the split kernel, with the merge kernel of the two-launch path,
    ``FUSED_MERGE = False``, whose spills are summed in; "balanced") for ``problem`` compiled for sm_90a, for a child
    process: (the kernel's binary, its spill bytes, registers, shared bytes, threads and packed rows a CTA)."""
    from common.reporting.static import cubin_resources
    from triton_impl import decode

    binaries = decode.compile_sm90(problem) if kernel == "split" else [triton_balanced_sm90(problem)]
    binary, spills = binaries[0], 0
    for compiled in binaries:
        (resources,) = cubin_resources(compiled.cubin).values()
        spills += resources["local_bytes"] + resources["stack_bytes"]
    (resources,) = cubin_resources(binary.cubin).values()
    facts = {"spill_bytes": spills, "registers": resources["registers"], "shared_bytes": binary.shared_bytes,
             "threads": binary.threads_per_cta, "block_m": decode.block_m_for(problem)}  # fmt: skip
    return binary, facts


# Runs each script of a batch as ``python -c script *args`` would (its own globals, ``sys.argv``), in one
# process: one import of torch, Triton and the rungs for the batch. A script that raises gives its traceback
# in place of its result, so the other scripts still run.
_BATCH_SCRIPT = """
import contextlib, io, json, sys, traceback
results = {}
for key, (script, args) in json.loads(sys.argv[1]).items():
    sys.argv = ["-c", *args]
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(script, f"<{key}>", "exec"), {"__name__": "__main__"})
        results[key] = {"result": json.loads(printed.getvalue().strip().splitlines()[-1])}
    except Exception:
        results[key] = {"error": traceback.format_exc()}
print(json.dumps(results))
"""


def scripts_in_one_child(scripts: dict[str, tuple[str, list[str]]], timeout: float) -> dict[str, dict]:
    """Run every ``key: (script, args)`` of ``scripts`` in one child process (as ``json_from_child``: without
    ``TRITON_INTERPRET``), each as ``python -c script *args`` would; each script's last stdout line is JSON.
    Returns, per key, ``{"result": ...}`` or ``{"error": traceback}``: read one with ``child_result``."""
    return json_from_child(["-c", _BATCH_SCRIPT, json.dumps(scripts)], timeout=timeout)


def child_result(results: dict[str, dict], key: str) -> Any:
    """The result of script ``key`` of a ``scripts_in_one_child`` batch; a script that raised fails the test
    that reads it, with its traceback (the batch's other tests stand on their own results)."""
    entry = results[key]
    if "error" in entry:
        pytest.fail(f"{key} failed in the child process:\n{entry['error'][-4000:]}", pytrace=False)
    return entry["result"]


def triton_wide_tile_at_every_head_dim(monkeypatch: pytest.MonkeyPatch) -> None:
    """triton/decode's ``WIDE_M_TILE`` on at each head dim it has a wide tile for (``WIDE_CONFIGS``), D=64 included,
    which the default (``WIDE_M_TILE_HEAD_DIMS``) leaves to 64-row tiles since 2026-12-06: the wide tile's own tests."""
    from triton_impl import decode

    monkeypatch.setattr(decode, "WIDE_M_TILE", True)
    monkeypatch.setattr(decode, "WIDE_M_TILE_HEAD_DIMS", tuple(decode.WIDE_CONFIGS))


# The masks of the CuTe rungs' feature tests: (causal, causal_alignment).
MASKS = {"full": (False, "top_left"), "causal": (True, "top_left"), "causal_bottom_right": (True, "bottom_right")}


def edge_cache_seqlens(batch: int, seqlen_k: int, device: torch.device | str) -> torch.Tensor:
    """(B,) int32 key lengths with the edges: a full sequence (Sk), an empty one (0), ragged others."""
    lengths = [seqlen_k, 0, *(max(1, (seqlen_k * (3 + 2 * i)) // 7) for i in range(batch - 2))]
    return torch.tensor(lengths[:batch], dtype=torch.int32, device=device)


def feature_problem(
    seqlens: tuple[int, int], head_dim: int, kv_heads: int, mask: str, cache_lengths: bool,
    return_lse: bool = True, batch: int = 3, heads: int = 8,
) -> Problem:  # fmt: skip
    """A bf16 problem of the feature tests: GQA over ``kv_heads``, the ``MASKS[mask]`` alignment, per-sequence
    key lengths when ``cache_lengths``."""
    causal, alignment = MASKS[mask]
    return Problem(
        batch, heads, *seqlens, head_dim, dtype=torch.bfloat16, causal=causal, kv_heads=kv_heads,
        causal_alignment=alignment, has_cache_seqlens=cache_lengths, return_lse=return_lse,
    )  # fmt: skip


def fa3_case(
    dims: tuple[int, int, int, int, int], mask: str, seed: int, head_dim: int = 128
) -> tuple[Problem, tuple[torch.Tensor, ...]]:
    """The FP8 rungs' GPU case: a bf16 problem of ``dims`` (batch, heads, kv_heads, Sq, Sk) at ``head_dim`` under the
    ``MASKS[mask]`` alignment, and FA3's inputs for it drawn with ``seed``."""
    batch, heads, kv_heads, seqlen_q, seqlen_k = dims
    problem = feature_problem(
        (seqlen_q, seqlen_k), head_dim, kv_heads, mask, cache_lengths=False, return_lse=False, batch=batch, heads=heads
    )
    return problem, fa3_inputs(problem, seed=seed, device="cuda")


def check_features(impl: Implementation, problem: Problem, seed: int) -> None:
    """``impl`` on a feature problem, on the GPU: offset inputs (seed ``seed``), the edge key lengths when
    the problem has them; O against the fp64 reference by the rung's rule and the LSE by the contract's
    LSE rule, on poisoned outputs. The rung must accept the problem (no skip)."""
    q, k, v = make_inputs(problem, seed=seed, offset=0.5)
    cache_seqlens = edge_cache_seqlens(problem.batch, problem.seqlen_k, q.device) if problem.has_cache_seqlens else None
    assert impl.check(problem, q.device) == (True, "")
    result = check_on_inputs(impl, q, k, v, problem, cache_seqlens=cache_seqlens)
    assert result.ok, f"{impl.name} {problem.describe()}: {result.summary()}"
    assert result.lse is not None


def feature_grid(seqlens: tuple[tuple[int, int], ...] = ((77, 1000), (1000, 77), (333, 333))) -> Callable:
    """The cases of a feature test, as stacked ``parametrize`` marks (GPU only): head dims 64 and 128,
    MQA and GQA-4, the (Sq, Sk) ``seqlens``, every mask of ``MASKS``, dense and per-sequence key lengths."""
    marks = (
        pytest.mark.parametrize("head_dim", [64, 128]),
        pytest.mark.parametrize("kv_heads", [1, 4], ids=["mqa", "gqa4"]),
        pytest.mark.parametrize("seqlens", list(seqlens), ids=str),
        pytest.mark.parametrize("mask", list(MASKS)),
        pytest.mark.parametrize("cache_lengths", [False, True], ids=["dense", "cache_seqlens"]),
        pytest.mark.gpu,
    )
    return lambda test: functools.reduce(lambda marked, mark: mark(marked), marks, test)


def decode_call_inputs(
    problem: Problem, lengths: tuple[int, ...] | None, seed: int
) -> tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor]]:
    """(q, k, v) on the GPU (offset inputs) and the call's keyword tensors: ``cache_seqlens`` from ``lengths`` (None:
    a full cache) and, for a paged problem, the page pools and their shuffled block table."""
    q, k, v = make_inputs(problem, seed=seed, device="cuda", offset=0.5)
    extra = {}
    if lengths is not None:
        extra["cache_seqlens"] = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    if problem.paged:
        k, v, extra["block_table"] = make_paged_kv(problem, k, v, seed=seed)
    return (q, k, v), extra


def knob_ab_words(script_name: str, name: str) -> list[str]:
    """The words after ``knob_ab NAME`` in ``bench/SCRIPT_NAME`` to the end of its command (the first line that does
    not end in a backslash): the A/B's limit, knob, values, rungs and rows, as the shell passes them."""
    script = (ROOT / "bench" / script_name).read_text()
    command = re.match(r"(?:[^\n]*\\\n)*[^\n]*", script.split(f"\nknob_ab {name} ", 1)[1]).group(0)
    return shlex.split(command.replace("\\\n", " "))


def knob_ab_problems(script_name: str, name: str) -> tuple[list[str], list[Problem]]:
    """:func:`knob_ab_words` split into the A/B's limit, knob, values and rungs, and the Problems of its rows
    (``bench.decode_knob_ab.parse_row``)."""
    from bench.decode_knob_ab import parse_row

    words = knob_ab_words(script_name, name)
    return words[:4], [parse_row(text)[1].problem for text in words[4:]]


def packed_rows_by_rule(
    problem: Problem, lengths: tuple[int, ...], token_of_row: Callable[[torch.Tensor], torch.Tensor],
    k: torch.Tensor, v: torch.Tensor, packed_q: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
) -> None:  # fmt: skip
    """The packed prefill's kernel replaced by its rule in float64 (cute/decode's and gluon/decode's CPU stand-in):
    packed row r of a KV head sees key j < its sequence's length and, causal, j <= token_of_row(r) + the causal
    offset (length - Sq bottom-right, 0 top-left); O (in ``out``'s dtype) and the LSE written into the packed outputs
    (B, Hkv, rows, D) and (B, Hkv, rows)."""
    rows, keys = torch.arange(packed_q.shape[2]), torch.arange(problem.seqlen_k)
    for b, length in enumerate(lengths):
        offset = length - problem.seqlen_q if problem.causal_alignment == "bottom_right" else 0
        visible = keys[None, :] < length
        if problem.causal:
            visible = visible & (keys[None, :] <= token_of_row(rows)[:, None] + offset)
        for kv_head in range(problem.kv_heads):
            scores = packed_q[b, kv_head].double() @ k[b, kv_head].double().T * problem.scale
            row_lse = torch.logsumexp(scores.masked_fill(~visible, float("-inf")), dim=-1)
            probs = torch.exp(scores.masked_fill(~visible, float("-inf")) - row_lse.nan_to_num(neginf=0.0)[:, None])
            out[b, kv_head] = (probs @ v[b, kv_head].double()).to(out.dtype)
            lse[b, kv_head] = row_lse.float()


def packed_rows_match(
    out: torch.Tensor, lse: torch.Tensor, reference: tuple[torch.Tensor, torch.Tensor], check_lse: bool = True
) -> bool:
    """Whether a packed route's O (rounded once to its dtype) and, with ``check_lse``, its LSE (the same rows
    infinite) are the float64 reference's."""
    ref_out, ref_lse = reference
    if not torch.allclose(out.double(), ref_out, rtol=1e-3, atol=1e-3):
        return False
    seen = torch.isfinite(ref_lse)
    return not check_lse or (
        torch.equal(seen, torch.isfinite(lse)) and torch.allclose(lse.double()[seen], ref_lse[seen], atol=1e-5)
    )


def _packed_step(batch: int, kv_heads: int, group: int, seqlen_q: int, seqlen_k: int, **changes: Any) -> Problem:
    fields = {"dtype": torch.float16, "causal": True, "causal_alignment": "bottom_right", "return_lse": True}
    return Problem(
        batch, kv_heads * group, seqlen_q, seqlen_k, 64, kv_heads=kv_heads, has_cache_seqlens=True,
        **{**fields, **changes},
    )  # fmt: skip


# The packed prefill's CPU stand-in cases (problem, lengths): both alignments and none, Sq 1 and 5, lengths below Sq
# (rows that see no key) and of one key; fp16 D=64 with cache lengths, returning the LSE.
PACKED_STAND_IN_CASES = {
    "bottom-right-ragged": (_packed_step(3, 2, 8, 5, 40), (40, 3, 17)),
    "top-left": (_packed_step(2, 2, 16, 5, 33, causal_alignment="top_left"), (33, 9)),
    "non-causal": (_packed_step(2, 1, 8, 4, 30, causal=False), (30, 1)),
    "one-token": (_packed_step(2, 2, 16, 1, 20), (20, 0)),
}


def packed_stand_in_matches(stand_in: Callable[..., tuple], case: str) -> bool:
    """Whether ``stand_in`` (a stack's packed route with its kernel replaced by :func:`packed_rows_by_rule`, called as
    ``stand_in(problem, lengths, token_of_row)``) gives case ``case`` of ``PACKED_STAND_IN_CASES``'s O and LSE with each
    row's token its row % Sq."""
    problem, lengths = PACKED_STAND_IN_CASES[case]
    (out, lse), reference = stand_in(problem, lengths, lambda rows: rows % problem.seqlen_q)
    return packed_rows_match(out, lse, reference)
