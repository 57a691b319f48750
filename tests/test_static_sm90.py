"""Every rung compiles for sm_90a on a CPU, and its PTX uses the instructions its rung claims."""

from __future__ import annotations

import pytest

from common.contract.devices import triton_interpreting
from common.contract.problem import Problem
from common.contract.registry import discover
from common.reporting.static import StaticRow, static_report, static_report_subprocess

# Every rung compiles once, in one pytest-xdist worker (--dist loadgroup), for the module's fixture.
pytestmark = [pytest.mark.xdist_group("static-sm90"), pytest.mark.static]
AVAILABLE, _ = discover(include_baselines=False)
COMPILED = {impl.name: impl for impl in AVAILABLE if impl.compile_sm90 is not None}
CANONICAL = Problem.canonical(8192)


@pytest.fixture(scope="module")
def static_rows() -> dict[str, StaticRow]:
    rows = static_report_subprocess(CANONICAL) if triton_interpreting() else static_report(CANONICAL)
    return {row.impl: row for row in rows}


def test_every_rung_has_a_compile_path():
    missing = [impl.name for impl in AVAILABLE if impl.compile_sm90 is None]
    assert not missing, f"rungs without an sm_90a compile path: {missing}"


@pytest.mark.parametrize("impl_name", sorted(COMPILED))
def test_ptx_uses_the_rung_instructions(impl_name: str, static_rows: dict[str, StaticRow]):
    row = static_rows[impl_name]
    assert not row.error, f"{impl_name} failed to compile for sm_90a: {row.error}"
    impl = COMPILED[impl_name]
    missing = [name for name in impl.required_ptx if not row.features[name]]
    forbidden = [name for name in impl.forbidden_ptx if row.features[name]]
    print(f"{impl_name}: {row.registers} registers, {row.spill_bytes} spill bytes, {row.shared_bytes} B shared")
    assert not missing, f"{impl_name} PTX lacks {missing}"
    assert not forbidden, f"{impl_name} PTX contains {forbidden}"


@pytest.mark.parametrize("impl_name", sorted(COMPILED))
def test_no_spills_at_canonical_configuration(impl_name: str, static_rows: dict[str, StaticRow]):
    row = static_rows[impl_name]
    assert not row.error, row.error
    assert row.spill_bytes == 0, f"{impl_name} spills {row.spill_bytes} bytes per thread"
