"""The ``fa4/sm90`` baseline row on a machine without FA4 or a GPU: its unavailable paths, its
capability rules, and its layout plumbing through a stand-in ``flash_attn.cute`` package."""

from __future__ import annotations

import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from common.contract.check import run_poisoned
from common.contract.inputs import make_inputs
from common.contract.problem import Problem
from common.measure import fa4
from tests._helpers import install_fake_package

PROBLEM = Problem(batch=2, heads=3, seqlen_q=40, seqlen_k=56, head_dim=64, dtype=torch.float32)
# A stand-in for FA4's interface: its forward's signature, computing with SDPA in (B, S, H, D).
STAND_IN = """
import torch
import torch.nn.functional as F


def _flash_attn_fwd(q, k, v, softmax_scale=None, causal=False, out=None):
    o = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, scale=softmax_scale
    )
    out.copy_(o.transpose(1, 2))
    return out, None, None, None
"""


@pytest.fixture(autouse=True)
def fresh_import(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test imports FA4 afresh and leaves no flash_attn module behind."""
    before = {name for name in sys.modules if name.split(".")[0] == "flash_attn"}
    fa4.load_forward.cache_clear()
    yield
    for name in [name for name in sys.modules if name.split(".")[0] == "flash_attn"]:
        if name not in before:
            del sys.modules[name]
    fa4.load_forward.cache_clear()


def fake_package(root: Path, interface: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``flash_attn/cute/interface.py`` with the given source, first on sys.path."""
    files = {"flash_attn/__init__.py": "", "flash_attn/cute/__init__.py": "", "flash_attn/cute/interface.py": interface}
    install_fake_package(root, files, monkeypatch)


def test_not_installed_is_unavailable_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flash_attn", None)
    ok, reason = fa4.supports(PROBLEM.with_(dtype=torch.bfloat16), torch.device("cuda"))
    assert not ok
    assert reason.startswith("unavailable: flash_attn.cute is not installed")
    info = fa4.fa4_version_info()
    assert info["available"] is False and info["reason"] == reason


def test_an_import_that_fails_is_unavailable_with_its_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # What fa4 4.0.0b3 does with nvidia-cutlass-dsl 4.8.1.
    error = "module 'cutlass.cute.core' has no attribute 'ThrMma'"
    fake_package(tmp_path, f"raise AttributeError({error!r})", monkeypatch)
    ok, reason = fa4.availability()
    assert not ok
    assert reason == f"unavailable: flash_attn.cute failed to import: AttributeError: {error}"
    info = fa4.fa4_version_info()
    assert info["path"] == str(tmp_path / "flash_attn" / "cute")
    assert info["source"].startswith("unknown source")


def test_an_interface_without_the_forward_is_unavailable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_package(tmp_path, "def _flash_attn_fwd(q, k, v, softmax_scale=None, causal=False):\n    pass\n", monkeypatch)
    ok, reason = fa4.availability()
    assert not ok and "_flash_attn_fwd(..., out=...)" in reason
    with pytest.raises(RuntimeError, match="unavailable"):
        fa4.bind(*make_inputs(PROBLEM, seed=0, device="cpu"), PROBLEM)


def test_bind_changes_the_layout_and_returns_the_buffer_it_launches_into(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_package(tmp_path, STAND_IN, monkeypatch)
    assert fa4.availability() == (True, "")
    q, k, v = make_inputs(PROBLEM, seed=0, device="cpu")
    run = fa4.bind(q, k, v, PROBLEM)
    # Poisoned between two runs: the second must overwrite every element of the same buffer.
    out = run_poisoned(run)
    assert out.shape == q.shape
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), rtol=1e-6, atol=1e-6)
    assert run().data_ptr() == out.data_ptr()


@pytest.mark.parametrize(
    ("change", "capability", "expected"),
    [
        ({}, (9, 0), ""),
        ({"causal": True, "seqlen_k": 40}, (9, 0), ""),
        ({}, (10, 0), "needs sm_90 (FA4's SM90 kernel), got sm_100"),
        ({"dtype": torch.float32}, (9, 0), "runs fp16 and bf16, got fp32"),
        ({"head_dim": 260}, (9, 0), "needs head_dim in [8, 256]"),
        ({"head_dim": 36}, (9, 0), "a multiple of 8, got 36"),
        ({"causal": True}, (9, 0), "aligns the causal mask bottom-right"),
    ],
)
def test_capability_rules(
    change: dict, capability: tuple[int, int], expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_package(tmp_path, STAND_IN, monkeypatch)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    problem = PROBLEM.with_(dtype=torch.bfloat16).with_(**change)
    ok, reason = fa4.supports(problem, torch.device("cuda"))
    assert ok == (expected == "")
    assert expected in reason


def test_the_snapshot_fingerprint_is_known(tmp_path: Path) -> None:
    """The fingerprint recorded for the FA4 snapshot in ../shared/gpu/fa4 matches its sources."""
    snapshot = Path(__file__).resolve().parents[2] / "shared" / "gpu" / "fa4"
    archives = sorted(snapshot.glob("flash-attention-cute-*.tar.xz"))
    if not archives:
        pytest.skip(f"no FA4 snapshot under {snapshot} on this machine")
    with tarfile.open(archives[-1]) as archive:
        archive.extractall(tmp_path, filter="data")
    fingerprint = fa4.source_fingerprint(tmp_path / "flash_attn" / "cute")
    assert fingerprint in fa4.KNOWN_SOURCES


# A stand-in whose forward takes seqused_k and page_table (FA4's paged KV cache), computing with SDPA on
# the pages gathered into (B, Sk, Hkv, D), and recording which pool and table it was given.
PAGED_STAND_IN = """
import torch
import torch.nn.functional as F

CALLS = []


def _flash_attn_fwd(q, k, v, seqused_k=None, page_table=None, softmax_scale=None, causal=False, out=None):
    CALLS.append((k.data_ptr(), v.data_ptr(), page_table.data_ptr()))
    k, v = (t[page_table.long()].flatten(1, 2) for t in (k, v))
    visible = torch.arange(k.shape[1])[None, :] < seqused_k[:, None]
    o = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=visible[:, None, None, :],
        scale=softmax_scale, enable_gqa=True,
    )
    out.copy_(o.transpose(1, 2))
    return out, None, None, None
"""
PAGED = Problem(3, 4, 2, 64, 64, dtype=torch.float32, kv_heads=2, has_cache_seqlens=True, page_size=16)


def test_a_paged_cache_goes_to_fa4_as_its_page_table_without_copying_the_pools(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from common.contract.inputs import make_paged_kv
    from common.contract.reference import reference_attention

    fake_package(tmp_path, PAGED_STAND_IN, monkeypatch)
    q, k, v = make_inputs(PAGED, seed=0, device="cpu")
    k_pages, v_pages, table = make_paged_kv(PAGED, k, v, seed=0)
    lengths = torch.tensor([64, 1, 37], dtype=torch.int32)
    out = run_poisoned(fa4.bind(q, k_pages, v_pages, PAGED, cache_seqlens=lengths, block_table=table))
    ref = reference_attention(q, k_pages, v_pages, PAGED, cache_seqlens=lengths, block_table=table)
    torch.testing.assert_close(out, ref.float(), rtol=1e-5, atol=1e-5)
    calls = sys.modules["flash_attn.cute.interface"].CALLS
    assert calls[-1] == (k_pages.data_ptr(), v_pages.data_ptr(), table.data_ptr())


def test_an_fa4_without_page_table_refuses_a_paged_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    without_pages = PAGED_STAND_IN.replace("page_table=None, ", "")
    fake_package(tmp_path, without_pages, monkeypatch)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    ok, reason = fa4.supports(PAGED.with_(dtype=torch.bfloat16), torch.device("cuda"))
    assert not ok and "block_table needs _flash_attn_fwd(..., page_table=...)" in reason
    fake_package(tmp_path / "with", PAGED_STAND_IN, monkeypatch)
    fa4.load_forward.cache_clear()
    assert fa4.supports(PAGED.with_(dtype=torch.bfloat16), torch.device("cuda")) == (True, "")
