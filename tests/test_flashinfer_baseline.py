"""The ``flashinfer/decode`` baseline row: its unavailable paths and capability rules on any machine,
its plumbing (zero-copy pages, page table, LSE units, rows without keys) against fp64 through a
stand-in ``flashinfer`` package on the CPU, with planted bugs the check must fail, and the real
FlashInfer against fp64 on a GPU."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from common.contract.check import check_on_inputs
from common.contract.inputs import make_inputs, make_paged_kv
from common.contract.problem import Problem
from common.measure import flashinfer as baseline
from tests._helpers import install_fake_package

CUDA = torch.device("cuda")
# A stand-in for FlashInfer's decode wrapper: the same call signatures, reading the HND or NHD pages
# through the page table exactly as its kernels do, in torch on the CPU, with FlashInfer's log2 LSE. A row that
# sees no key comes out NaN (0/0), as nothing guarantees otherwise.
STAND_IN = """
import math

import torch


class BatchDecodeWithPagedKVCacheWrapper:
    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_tensor_cores=False):
        assert kv_layout in ("HND", "NHD")
        self.use_tensor_cores, self.layout = use_tensor_cores, kv_layout

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *,
             q_data_type, kv_data_type, sm_scale, q_len_per_req=1):
        assert q_len_per_req == 1 or self.use_tensor_cores, "Sq > 1 needs the tensor-core path"
        self.indptr, self.indices, self.last = indptr.tolist(), indices.tolist(), last_page_len.tolist()
        self.page_size, self.scale, self.q_len = page_size, sm_scale, q_len_per_req

    def run(self, q, paged_kv_cache, *, out=None, lse=None, return_lse=False):
        k_pages, v_pages = paged_kv_cache
        if self.layout == "NHD":
            k_pages, v_pages = k_pages.transpose(1, 2), v_pages.transpose(1, 2)
        kv_heads, page_size, head_dim = k_pages.shape[1:]
        group = q.shape[1] // kv_heads
        for b in range(len(self.last)):
            pages = self.indices[self.indptr[b]:self.indptr[b + 1]]
            length = (len(pages) - 1) * page_size + self.last[b]
            k = k_pages[pages].transpose(0, 1).reshape(kv_heads, -1, head_dim)[:, :length]
            v = v_pages[pages].transpose(0, 1).reshape(kv_heads, -1, head_dim)[:, :length]
            rows = q[b * self.q_len:(b + 1) * self.q_len].transpose(0, 1)
            k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
            scores = rows @ k.transpose(1, 2) * self.scale
            token = torch.arange(self.q_len)[:, None]
            scores = scores.masked_fill(torch.arange(length)[None, :] > token + length - self.q_len, float("-inf"))
            total = torch.logsumexp(scores, dim=-1)
            out[b * self.q_len:(b + 1) * self.q_len] = (torch.exp(scores - total[..., None]) @ v).transpose(0, 1)
            if return_lse:
                lse[b * self.q_len:(b + 1) * self.q_len] = (total / math.log(2.0)).transpose(0, 1)
        return (out, lse) if return_lse else out
"""


@pytest.fixture(autouse=True)
def fresh_import() -> Iterator[None]:
    """Each test imports FlashInfer afresh and leaves no flashinfer module or probe result behind."""
    before = {name for name in sys.modules if name.split(".")[0] == "flashinfer"}
    baseline.load_flashinfer.cache_clear()
    baseline._builds.cache_clear()
    yield
    for name in [name for name in sys.modules if name.split(".")[0] == "flashinfer" and name not in before]:
        del sys.modules[name]
    baseline.load_flashinfer.cache_clear()
    baseline._builds.cache_clear()


def fake_package(root: Path, source: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``flashinfer`` package with the given source, first on sys.path."""
    install_fake_package(root, {"flashinfer/__init__.py": source}, monkeypatch)


def decode_problem(**changes: object) -> Problem:
    fields = dict(
        batch=3, heads=8, seqlen_q=1, seqlen_k=48, head_dim=64, dtype=torch.bfloat16, causal=True, kv_heads=2,
        causal_alignment="bottom_right",
    )  # fmt: skip
    return Problem(**{**fields, **changes})


# ----------------------------------------------------------------------------------------------------
# Registration, unavailable paths, capability rules
# ----------------------------------------------------------------------------------------------------
def test_not_installed_is_unavailable_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    ok, reason = baseline.supports(decode_problem(), CUDA)
    assert not ok
    assert reason.startswith("unavailable: flashinfer is not installed")
    info = baseline.flashinfer_version_info()
    assert info["available"] is False and info["reason"] == reason


def test_an_import_that_fails_is_unavailable_with_its_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_package(tmp_path, "import tvm_ffi_missing_for_this_test\n", monkeypatch)
    ok, reason = baseline.availability()
    assert not ok
    assert reason == "unavailable: flashinfer failed to import: No module named 'tvm_ffi_missing_for_this_test'"


def test_a_flashinfer_without_the_wrapper_is_unavailable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_package(tmp_path, "", monkeypatch)
    ok, reason = baseline.availability()
    assert not ok and "has no BatchDecodeWithPagedKVCacheWrapper" in reason
    q, k, v = make_inputs(decode_problem(), seed=0, device="cpu")
    with pytest.raises(RuntimeError, match="unavailable"):
        baseline.bind(q, k, v, decode_problem())


def test_a_kernel_that_cannot_be_built_is_unavailable_with_the_build_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing = STAND_IN.replace(
        "        self.indptr, ", '        raise RuntimeError("Could not find nvcc")\n        self.indptr, '
    )
    fake_package(tmp_path, failing, monkeypatch)
    ok, reason = baseline._builds(torch.bfloat16, 128, True, torch.device("cpu"))
    assert not ok
    assert reason == (
        "unavailable: flashinfer could not build or run its tensor-core decode for bf16 D=128: "
        "RuntimeError: Could not find nvcc"
    )


@pytest.mark.parametrize(
    ("change", "capability", "expected"),
    [
        ({}, (9, 0), ""),
        ({"kv_heads": 8}, (8, 0), ""),
        ({"seqlen_q": 4, "has_cache_seqlens": True, "return_lse": True}, (9, 0), ""),
        ({"causal": False}, (9, 0), ""),
        ({"seqlen_q": 48, "causal_alignment": "top_left"}, (9, 0), "takes 1 to 16 query tokens, got Sq=48"),
        ({}, (7, 5), "needs compute capability 8.0 or newer, got 7.5"),
        ({"dtype": torch.float32}, (9, 0), "runs fp16 and bf16, got fp32"),
        ({"head_dim": 96}, (9, 0), "supports head_dim in [64, 128, 256], got 96"),
        ({"seqlen_q": 17}, (9, 0), "takes 1 to 16 query tokens, got Sq=17"),
        ({"causal_alignment": "top_left"}, (9, 0), "aligns the causal mask bottom-right"),
        ({"seqlen_q": 4, "causal": False}, (9, 0), "masks Sq > 1 query tokens causally, got a non-causal Sq=4"),
    ],
)
def test_capability_rules(
    change: dict, capability: tuple[int, int], expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_package(tmp_path, STAND_IN, monkeypatch)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(baseline, "_builds", lambda *key: (True, ""))
    ok, reason = baseline.supports(decode_problem(**change), CUDA)
    assert ok == (expected == ""), reason
    assert expected in reason


def test_cpu_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_package(tmp_path, STAND_IN, monkeypatch)
    assert baseline.supports(decode_problem(), torch.device("cpu")) == (
        False,
        "flashinfer/decode needs a CUDA GPU, got cpu",
    )


@pytest.mark.parametrize(
    ("kv_heads", "seqlen_q", "tensor_cores"), [(8, 1, False), (4, 1, False), (2, 1, True), (8, 2, True)]
)
def test_tensor_cores_for_large_groups_and_speculative_steps(kv_heads: int, seqlen_q: int, tensor_cores: bool) -> None:
    assert baseline.uses_tensor_cores(decode_problem(kv_heads=kv_heads, seqlen_q=seqlen_q)) is tensor_cores


# ----------------------------------------------------------------------------------------------------
# The zero-copy pages and the page table
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("seqlen_k", "page_size"), [(4096, 16), (1000, 8), (300, 4), (77, 1)])
def test_every_page_of_the_view_is_its_chunk_of_the_cache(seqlen_k: int, page_size: int) -> None:
    assert baseline.page_size_for(seqlen_k) == page_size
    cache = torch.randn(3, 2, seqlen_k, 8)
    pages, page_rows = baseline.paged_view(cache, page_size)
    assert pages.data_ptr() == cache.data_ptr() and pages.shape[1:] == (2, page_size, 8)
    assert page_rows.shape == (3, seqlen_k // page_size)
    for b, row in enumerate(page_rows.tolist()):
        for c, page in enumerate(row):
            assert torch.equal(pages[page], cache[b, :, c * page_size : (c + 1) * page_size])


def test_page_table_follows_each_length_and_gives_an_empty_sequence_one_key() -> None:
    rows = torch.tensor([[0, 1, 2, 3], [100, 101, 102, 103], [7, 5, 9, 200]])
    table = baseline.page_table([33, 0, 16], rows, 16)
    assert table.indptr.tolist() == [0, 3, 4, 5]
    assert table.indices.tolist() == [0, 1, 2, 100, 7]
    assert table.last_page_len.tolist() == [1, 1, 16]


def test_a_paged_problem_reads_its_pools_as_nhd_pages_through_the_block_table() -> None:
    problem = decode_problem(seqlen_k=64, has_cache_seqlens=True, page_size=16)
    k, v = torch.randn(13, 16, 2, 64), torch.randn(13, 16, 2, 64)
    block_table = torch.tensor([[3, 1, 4, 0], [5, 9, 2, 6], [12, 8, 7, 10]], dtype=torch.int32)
    layout, page_size, k_pages, v_pages, page_rows = baseline.kv_pages(k, v, problem, block_table)
    assert (layout, page_size) == ("NHD", 16)
    assert k_pages is k and v_pages is v and torch.equal(page_rows, block_table)
    with pytest.raises(ValueError, match="reads a paged KV cache, but block_table is None"):
        baseline.kv_pages(k, v, problem, None)


def test_a_sequence_shorter_than_sq_is_refused_with_the_reason() -> None:
    speculative = Problem(
        2, 8, 4, 64, 64, kv_heads=2, causal=True, causal_alignment="bottom_right", has_cache_seqlens=True
    )
    with pytest.raises(ValueError, match=r"cache_seqlens >= Sq.*Sq=4 and a sequence of 3 keys"):
        baseline.refuse_short_sequences(speculative, [64, 3])
    baseline.refuse_short_sequences(speculative, [64, 4])
    baseline.refuse_short_sequences(speculative.with_(seqlen_q=1), [64, 0])


def test_rows_without_keys() -> None:
    speculative = decode_problem(seqlen_q=3, has_cache_seqlens=True)
    assert baseline.rows_without_keys(speculative, [48, 0, 1]).tolist() == [
        [False, False, False],
        [True, True, True],
        [True, True, False],
    ]
    assert baseline.rows_without_keys(decode_problem(), [48, 48, 48]) is None
    assert baseline.rows_without_keys(decode_problem(causal=False), [5, 0, 5]).tolist() == [[False], [True], [False]]


# ----------------------------------------------------------------------------------------------------
# The plumbing against fp64 (the stand-in computes; bind does the rest) and planted bugs
# ----------------------------------------------------------------------------------------------------
# (kv_heads of 8 heads, Sq, Sk, lengths or None, return_lse, page_size): the CUDA-core and tensor-core
# paths, a speculative step with sequences as short as it may be (``refuse_short_sequences``), an
# empty sequence, lengths ending mid-page, a padded length that only pages of one key divide, and
# paged pools read through a shuffled block table (an empty sequence among them).
CASES = [
    (8, 1, 48, None, True, 0),
    (2, 1, 300, (300, 0, 131), True, 0),
    (2, 3, 48, (48, 3, 4), True, 0),
    (1, 5, 77, (77, 40, 9), False, 0),
    (2, 1, 64, (64, 0, 17), True, 16),
    (8, 2, 96, (96, 33, 2), True, 32),
]


def _check(case: tuple, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    kv_heads, seqlen_q, seqlen_k, lengths, return_lse, page_size = case
    fake_package(tmp_path, STAND_IN, monkeypatch)
    problem = decode_problem(
        kv_heads=kv_heads, seqlen_q=seqlen_q, seqlen_k=seqlen_k, dtype=torch.float32,
        has_cache_seqlens=lengths is not None, return_lse=return_lse, page_size=page_size,
    )  # fmt: skip
    q, k, v = make_inputs(problem, seed=3, device="cpu", offset=0.5)
    cache_seqlens = None if lengths is None else torch.tensor(lengths, dtype=torch.int32)
    block_table = None
    if problem.paged:
        k, v, block_table = make_paged_kv(problem, k, v, seed=3)
    # bind as prepare: prepare's validation and capability check need a GPU.
    impl = dataclasses.replace(baseline.IMPLEMENTATION, prepare=baseline.bind)
    return check_on_inputs(impl, q, k, v, problem, cache_seqlens=cache_seqlens, block_table=block_table)


@pytest.mark.parametrize(
    "case", CASES, ids=[f"hkv{c[0]}-sq{c[1]}-sk{c[2]}-ragged{c[3] is not None}-paged{c[5]}" for c in CASES]
)
def test_plumbing_against_fp64(case: tuple, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    result = _check(case, monkeypatch, tmp_path)
    assert result.ok, result.summary()


PAGE_TABLE = baseline.page_table


def _shifted_table(lengths, page_rows, page_size):
    table = PAGE_TABLE(lengths, page_rows, page_size)
    return dataclasses.replace(table, indices=table.indices + 1)


PLANTED = {
    "page index off by one": ("page_table", _shifted_table),
    "LSE left in log2 units": ("LN_2", 1.0),
    "rows without keys left to FlashInfer": ("rows_without_keys", lambda problem, lengths: None),
}


@pytest.mark.parametrize("case", [CASES[1], CASES[4]], ids=["contiguous", "paged"])
@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_bug_fails_the_check(bug: str, case: tuple, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    name, replacement = PLANTED[bug]
    monkeypatch.setattr(baseline, name, replacement)
    result = _check(case, monkeypatch, tmp_path)
    assert not result.ok, f"{bug}: the check passed ({result.summary()})"
    print(bug, result.summary())


KV_PAGES = baseline.kv_pages


def _pools_in_table_order(k, v, problem, block_table):
    layout, page_size, k_pages, v_pages, page_rows = KV_PAGES(k, v, problem, block_table)
    return layout, page_size, k_pages, v_pages, torch.arange(page_rows.numel()).view(page_rows.shape)


def test_a_block_table_left_unread_fails_the_check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(baseline, "kv_pages", _pools_in_table_order)
    result = _check(CASES[4], monkeypatch, tmp_path)
    assert not result.ok, f"the pools read in page order passed ({result.summary()})"


# ----------------------------------------------------------------------------------------------------
# GPU: the real FlashInfer against fp64 (skipped only where it is not installed)
# ----------------------------------------------------------------------------------------------------
# (dtype, head dim, kv_heads of 32, Sq, Sk, ragged, page_size): CUDA-core (group 1) and tensor-core
# (group 4) decode, a single long sequence (split-KV), a speculative step, fp16 at D=64, and paged pools
# (pages of 16 on both paths, 256 in a speculative step).
GPU_CASES = [
    (torch.bfloat16, 128, 8, 1, 4096, True, 0),
    (torch.bfloat16, 128, 32, 1, 4096, True, 0),
    (torch.bfloat16, 128, 8, 1, 32768, False, 0),
    (torch.bfloat16, 128, 8, 4, 4096, True, 0),
    (torch.float16, 64, 32, 1, 1000, True, 0),
    (torch.bfloat16, 128, 8, 1, 4096, True, 16),
    (torch.bfloat16, 128, 32, 1, 32768, True, 16),
    (torch.bfloat16, 128, 8, 4, 4096, True, 256),
]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "case",
    GPU_CASES,
    ids=[f"{str(c[0])[6:]}-d{c[1]}-hkv{c[2]}-sq{c[3]}-sk{c[4]}-ragged{c[5]}-paged{c[6]}" for c in GPU_CASES],
)
def test_gpu_flashinfer_against_fp64(case: tuple) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    installed, reason = baseline.availability()
    if not installed:
        pytest.skip(reason)
    dtype, head_dim, kv_heads, seqlen_q, seqlen_k, ragged, page_size = case
    batch = 4 if ragged else 1
    problem = Problem(
        batch, 32, seqlen_q, seqlen_k, head_dim, dtype=dtype, causal=True, kv_heads=kv_heads,
        causal_alignment="bottom_right", has_cache_seqlens=ragged, return_lse=True, page_size=page_size,
    )  # fmt: skip
    ok, reason = baseline.supports(problem, CUDA)
    assert ok, reason
    q, k, v = make_inputs(problem, seed=5, device="cuda", offset=0.5)
    # FlashInfer takes a sequence shorter than Sq only for Sq = 1 (``refuse_short_sequences``).
    shortest = (0, 2) if seqlen_q == 1 else (seqlen_q, seqlen_q + 1)
    lengths = torch.tensor([seqlen_k, shortest[0], seqlen_k // 3 + 1, shortest[1]], dtype=torch.int32, device="cuda")
    lengths = lengths if ragged else None
    block_table = None
    if problem.paged:
        k, v, block_table = make_paged_kv(problem, k, v, seed=5)
    result = check_on_inputs(baseline.IMPLEMENTATION, q, k, v, problem, cache_seqlens=lengths, block_table=block_table)
    assert result.ok, f"{problem.describe()}: {result.summary()}"
