"""The Triton release table (``common.toolchain.releases``) and what it promises.

Every Triton rung's default tile, at every head dim it supports, causal and not, compiles for sm_90a
without spills under the installed release (bf16; fp16 builds allocate the same registers). CI runs
this on every release ``pyproject.toml`` admits, one leg each (3.6, 3.7, 3.8, 3.9). The table must
cover exactly the releases ``pyproject.toml`` admits; any other version gets a warning naming it, and
an installed release is never itself a failure. The online rung's tiles of every release are also
checked for correctness under the interpreter on each leg, so a release's tile that only another leg
would run (e.g. 3.9's 64-key tile at D=128) is still tested on all of them."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton

from common.contract.check import check_implementation
from common.contract.devices import triton_interpreting
from common.contract.problem import Problem
from common.contract.registry import get
from common.toolchain.releases import (
    RELEASE_OVERRIDES,
    TESTED_TRITON,
    tested_triton_status,
    tile_key_name,
    triton_config_record,
    triton_release,
)
from triton_impl import fp8, hopper, naive, online, pipelined, tiled
from triton_impl.gluon import fp8 as gluon_fp8
from triton_impl.gluon import hopper as gluon_hopper

ROOT = Path(__file__).resolve().parent.parent
# One worker compiles them all (pytest-xdist's --dist loadgroup), not one copy per worker.
pytestmark = [pytest.mark.xdist_group("triton-releases"), pytest.mark.static, pytest.mark.release]

HEAD_DIMS = {
    "naive": naive.HEAD_DIMS,
    "online": online.HEAD_DIMS,
    "tiled": tiled.HEAD_DIMS,
    "pipelined": pipelined.HEAD_DIMS,
    "hopper": hopper.HEAD_DIMS,
    "fp8": hopper.HEAD_DIMS,
}
TABLES = {
    "triton/online": online.CONFIGS,
    "triton/tiled": tiled.BLOCKS,
    "triton/pipelined": pipelined.DEFAULT_CONFIGS,
    "triton/hopper": hopper.DEFAULT_CONFIGS,
    "triton/fp8": fp8.DEFAULT_CONFIGS,
    "gluon/hopper": gluon_hopper.DEFAULT_CONFIGS,
    "gluon/fp8": gluon_fp8.DEFAULT_CONFIGS,
}
# A tile that spills on every tested release (fp8 at D=256 with one warpgroup: O and the fresh P V
# accumulator need 2 × 128 fp32 registers per thread), so the probe is seen to catch a spill.
PLANTED = "planted: triton/fp8 D=256 HopperKernelConfig(64, 64, 4, 2)"

_SPILL_PROBE = """
import json, sys
from common.contract.problem import Problem
from common.reporting.static import cubin_resources
from triton_impl import fp8, hopper, naive, online, pipelined, tiled

def usage(binaries):
    found = [u for b in binaries for u in cubin_resources(b.cubin).values()]
    return [max(u["registers"] for u in found), max(u["stack_bytes"] + u["local_bytes"] for u in found)]

rows = {}
for name, head_dims in json.loads(sys.argv[1]).items():
    for head_dim in head_dims:
        for causal in (False, True):
            problem = Problem.canonical(8192, head_dim=head_dim, causal=causal)
            rows[f"triton/{name} D={head_dim}" + (" causal" if causal else "")] = usage(
                globals()[name].compile_sm90(problem))
planted = hopper.HopperKernelConfig(64, 64, 4, 2)
rows[sys.argv[2]] = usage(fp8.compile_sm90(Problem.canonical(8192, head_dim=256), planted))
print(json.dumps(rows))
"""
CASES = [
    f"triton/{name} D={head_dim}" + (" causal" if causal else "")
    for name, head_dims in HEAD_DIMS.items()
    for head_dim in head_dims
    for causal in (False, True)
]


@pytest.fixture(scope="session")
def compiled() -> dict[str, list[int]]:
    """Registers and spill bytes of every case, compiled in a process without TRITON_INTERPRET."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    command = [sys.executable, "-c", _SPILL_PROBE, json.dumps(HEAD_DIMS), PLANTED]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("case", CASES)
def test_default_tile_does_not_spill(case: str, compiled: dict[str, list[int]]):
    registers, spills = compiled[case]
    assert spills == 0, (
        f"{case} spills {spills} bytes per thread ({registers} registers) under Triton {triton.__version__}: "
        f"give it a spill-free tile in common.toolchain.releases.RELEASE_OVERRIDES[{triton_release()!r}]"
    )


def test_probe_catches_a_spilling_tile(compiled: dict[str, list[int]]):
    registers, spills = compiled[PLANTED]
    assert spills > 0, f"{PLANTED}: {registers} registers and no spill; the probe would miss one"


def admitted_minor_releases(requirement: str) -> list[str]:
    """The minor releases ``major.minor`` that a ``>=X.Y,<X.Z`` requirement admits (same major)."""
    match = re.fullmatch(r"triton\s*>=\s*(\d+)\.(\d+)(?:\.\d+)?\s*,\s*<\s*(\d+)\.(\d+)(?:\.0)?", requirement.strip())
    assert match, f"expected Triton's requirement as 'triton>=X.Y,<X.Z', got {requirement!r}"
    low_major, low_minor, high_major, high_minor = map(int, match.groups())
    assert low_major == high_major, f"{requirement!r} spans major releases; list them in the table by hand"
    return [f"{low_major}.{minor}" for minor in range(low_minor, high_minor)]


def triton_requirement() -> str:
    """pyproject.toml's Triton requirement (Python 3.10 has no tomllib: the one quoted entry is enough)."""
    (requirement,) = re.findall(r'"(triton\s*[<>=][^"]*)"', (ROOT / "pyproject.toml").read_text())
    return requirement


def releases_missing_from(table: tuple[str, ...], requirement: str) -> list[str]:
    """The releases ``requirement`` admits that ``table`` lacks, and any the table has that it does not admit."""
    admitted = admitted_minor_releases(requirement)
    return sorted(set(admitted) ^ set(table))


def test_release_table_covers_every_release_pyproject_admits():
    # A user's installed Triton is not a test failure; a release the project admits without having
    # tested it is. The "untested release" warning stays for releases outside the table.
    requirement = triton_requirement()
    missing = releases_missing_from(TESTED_TRITON, requirement)
    assert not missing, f"pyproject.toml's {requirement!r} and the release table {TESTED_TRITON} differ on {missing}"


@pytest.mark.parametrize(
    ("requirement", "admitted"),
    [("triton>=3.6,<3.10", ["3.6", "3.7", "3.8", "3.9"]), ("triton >= 3.6.0, < 3.8", ["3.6", "3.7"])],
)
def test_admitted_releases_are_read_from_the_requirement(requirement: str, admitted: list[str]):
    assert admitted_minor_releases(requirement) == admitted


def test_a_table_missing_an_admitted_release_fails():
    # The rule against planted gaps: a table without 3.8, and one with a release pyproject does not admit.
    assert releases_missing_from(("3.6", "3.7", "3.9"), "triton>=3.6,<3.10") == ["3.8"]
    assert releases_missing_from(("3.6", "3.7", "3.8", "3.9", "3.10"), "triton>=3.6,<3.10") == ["3.10"]


@pytest.mark.parametrize(
    ("version", "release", "tested"),
    [
        ("3.6.0", "3.6", True),
        ("3.7.1", "3.7", True),
        ("3.8.0", "3.8", True),
        ("3.9.0", "3.9", True),
        ("3.9.1+gitabc123", "3.9", True),
        ("3.10.0", "3.9", False),
        ("4.0.0", "3.9", False),
        ("3.5.0", "3.6", False),
    ],
)
def test_versions_map_to_a_release_and_untested_ones_warn(version: str, release: str, tested: bool):
    assert triton_release(version) == release
    status = tested_triton_status(version)
    if tested:
        assert status is None, status
    else:
        assert status is not None and version in status and ", ".join(TESTED_TRITON) in status, status


def test_version_that_is_not_a_version_is_named():
    with pytest.raises(ValueError, match="'main'"):
        triton_release("main")


def test_overrides_replace_fields_of_existing_tiles():
    assert set(RELEASE_OVERRIDES) == set(TESTED_TRITON)
    for release, overrides in RELEASE_OVERRIDES.items():
        for (rung, key), fields in overrides.items():
            assert key in TABLES[rung], f"{release}: {rung} has no tile {key!r}"
            names = {field.name for field in dataclasses.fields(TABLES[rung][key])}
            assert set(fields) <= names, f"{release}: {rung} {key!r}: {set(fields) - names} are not tile fields"


def test_config_record_shows_the_tiles_in_force():
    record = triton_config_record(get(name) for name in TABLES)
    json.dumps(record)
    assert record["triton"] == triton.__version__ and record["config_release"] == triton_release()
    assert set(TABLES) <= set(record)
    for (rung, key), fields in RELEASE_OVERRIDES[triton_release()].items():
        entry = record[rung][tile_key_name(key)]
        assert all(entry[field] == value for field, value in fields.items()), (rung, key, entry)


ONLINE_OVERRIDES = [
    (release, key, fields)
    for release, overrides in RELEASE_OVERRIDES.items()
    for (rung, key), fields in overrides.items()
    if rung == "triton/online"
]


@pytest.mark.skipif(not triton_interpreting(), reason="interpreter test (CPU-only machines)")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(
    ("release", "head_dim", "fields"), ONLINE_OVERRIDES, ids=[f"{r}-D{k}" for r, k, _ in ONLINE_OVERRIDES]
)
def test_every_release_online_tile_matches_reference(
    release: str, head_dim: int, fields: dict, causal: bool, monkeypatch: pytest.MonkeyPatch
):
    tile = dataclasses.replace(online.CONFIGS[head_dim], **fields)
    monkeypatch.setitem(online.CONFIGS, head_dim, tile)
    problem = Problem(1, 2, 77, 100, head_dim, dtype=torch.float32, causal=causal)
    result = check_implementation(online.IMPLEMENTATION, problem, device="cpu", seed=head_dim)
    assert result.ok, f"Triton {release} tile {tile} {problem.describe()}: {result.summary()}"
