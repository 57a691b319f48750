"""Every rung compiles for sm_90a on a CPU, and its PTX uses the instructions its rung claims."""

from __future__ import annotations

import pytest

from common.contract.devices import triton_interpreting
from common.contract.problem import Problem
from common.contract.registry import discover
from common.reporting.static import StaticRow, loop_census, static_report, static_report_subprocess

# Every rung compiles once, in one pytest-xdist worker (--dist loadgroup), for the module's fixture.
pytestmark = [pytest.mark.xdist_group("static-sm90"), pytest.mark.static, pytest.mark.release]
AVAILABLE, _ = discover(include_baselines=False)
COMPILED = {impl.name: impl for impl in AVAILABLE if impl.compile_sm90 is not None}
CANONICAL = Problem.canonical(8192)


@pytest.fixture(scope="session")
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


# A key-block loop as cuobjdump prints it (addresses in hex, predicates, encodings in comments), inside
# a spin-wait loop without exp2, an outer loop over tiles, and a retry stub after EXIT that jumps back
# into the loop (a shorter span with exp2 and a GEMM, but no loop): the census must pick the inner loop.
_SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;              /* 0x00000a0000017a02 */
        /*0010*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R0 ;
        /*0020*/              @!P0 BRA 0x10 ;                           /* 0x0000000000008947 */
        /*0030*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR8], RZ, !UPT ;
        /*0040*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR8], R24, gsb0 ;
        /*0050*/                   FMNMX R4, R24, R25, !PT ;
        /*0060*/                   FFMA R2, R24, R3, -R4 ;
        /*0070*/                   MUFU.EX2 R2, R2 ;
        /*0080*/                   MUFU.EX2 R5, R6 ;
        /*0090*/                   FADD R7, R7, R2 ;
        /*00a0*/                   HGMMA.64x64x16.F32.BF16 R88, R8, gdesc[UR12], R88 ;
        /*00b0*/               @P1 BRA 0x30 ;
        /*00c0*/                   FADD R7, R7, R5 ;
        /*00d0*/               @P2 BRA 0x30 ;
        /*00e0*/                   EXIT ;
        /*00f0*/                   BRA 0x80 ;
"""


def test_loop_census_counts_the_key_block_loop():
    """The smallest backward-branch loop with exp2 and a GEMM, its pipes' cycles and limiter (no compile)."""
    loop = loop_census(_SASS)
    assert loop is not None
    assert (loop.instructions, loop.exp2, loop.gmma) == (9, 2, 3)
    # Two e4m3 64x128x32 (256 cycles at 8192 FLOP/clk) and one bf16 64x64x16 (32 cycles at 4096).
    assert loop.gmma_flops == 2 * (2 * 64 * 128 * 32) + 2 * 64 * 64 * 16
    assert loop.tensor_cycles == 2 * 64 + 32
    assert loop.xu_cycles == 16 and loop.limiter == "tensor cores"
    assert loop.ceiling_tflops(132, 1.0) == pytest.approx(loop.gmma_flops / 160 * 132 * 1e-3)
    assert loop_census(_SASS.replace("MUFU.EX2", "FMUL")) is None, "a loop without exp2 is not the key-block loop"
