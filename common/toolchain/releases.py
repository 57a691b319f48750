"""The Triton releases this project is tested on, and the tile configurations that differ between them.

Every minor release that ``pyproject.toml`` admits (3.6 to 3.9) is tested, each in its own CI leg
(``.ci/run``) and the GPU-bearing ones on the GPU machine as well:

* Triton 3.6 (torch 2.11), the GPU machine's toolchain, pinned in ``.ci/gpu-machine-constraints.txt``;
* Triton 3.7 (torch 2.12 and 2.13 bring it), checked statically: every kernel compiles spill-free for sm_90a;
* Triton 3.8 (torch 2.14), what ``pip install`` resolves on a machine whose pip caps torch at 2.14;
* Triton 3.9 (torch 2.15), what a fresh ``pip install`` resolves to without such a cap.

Each Triton and Gluon rung keeps its own table of tiles, chosen on the H200 under Triton 3.6. A newer release
allocates registers differently, and a tile that fitted in 255 registers per thread may spill to
local memory under it. :data:`RELEASE_OVERRIDES` is the one place where a release replaces fields of
a rung's tile: each rung builds its table through :func:`release_configs`. A Triton between or past
the tested releases gets the overrides of the newest tested release not newer than it (below them
all, the oldest one's), and :func:`tested_triton_status` warns that it is untested.
:func:`triton_config_record` lists the tiles in force (each rung registers its table as
``Implementation.default_configs``), for the results' ``env.json``; nothing here imports a rung.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Hashable, Iterable, Mapping
from typing import Any, TypeVar

TESTED_TRITON = ("3.6", "3.7", "3.8", "3.9")
# The stacks Triton compiles: their rungs' tables are the ones a release may override.
TRITON_STACKS = ("triton", "gluon")

# release -> (rung, the key of the rung's own table) -> fields that replace the table's entry.
# An entry replaces a tile that spills under that release (ptxas, sm_90a) by the fastest spill-free
# one timed on the H200 under it, or a tile another one beats under that release only
# (docs/perf-log.md, "Triton 3.6 and 3.9", "Triton 3.9 on the early rungs", "P V as one FFMA chain" and
# "Every admitted Triton release tested").
RELEASE_OVERRIDES: dict[str, dict[tuple[str, Hashable], dict[str, Any]]] = {
    "3.6": {},
    "3.7": {
        # Chosen by spills alone (checked statically in CI's Triton 3.7 leg, not timed on a GPU):
        # online D=256, 2x16 rows, 16 keys: 72 / 56 bytes spilled -> 8 keys: 146 / 148 registers, no spill;
        ("triton/online", 256): {"block_n": 8},
        # pipelined D=256 causal, 64 x 32, 4 warps: 8 bytes spilled -> 8 warps: 186 registers, no spill.
        ("triton/pipelined", (256, True)): {"num_warps": 8},
    },
    "3.8": {
        # Not a spill: online D=128 takes 3.9's 2x16 rows, 64 keys, 8-column D-slices: 20.3 / 21.1 TFLOP/s against
        # 15.7 / 15.9 for 3.6's tile under 3.8 on the H200 (bench.release_overrides, 2026-11-26). 3.9's other P1
        # overrides lose or tie under 3.8 there (results/h200/triton-3.8/release-overrides.log).
        ("triton/online", 128): {"rows_rep": 2, "block_n": 64, "block_d": 8},
        # pipelined 64 x 32, 4 warps, causal: 24 bytes spilled -> 8 warps: 182 registers, no spill (the
        # non-causal build does not spill under 3.8). Like 3.9's D=256 override, chosen by spills alone.
        ("triton/pipelined", (256, True)): {"num_warps": 8},
    },
    "3.9": {
        # Not a spill: online D=128 takes 2x16 rows, 64 keys, 8-column D-slices (254 registers), the
        # fastest spill-free tile timed under 3.9 on the H200: 20.5 / 21.1 TFLOP/s; 3.6's 4x16 rows,
        # 16 keys, 16-column slices runs 16.1 / 16.0 there (docs/perf-log.md, "P V as one FFMA chain").
        ("triton/online", 128): {"rows_rep": 2, "block_n": 64, "block_d": 8},
        # Since issue #28's GQA / cache-length / LSE arguments (2026-11-26), 3.9 spills where it did not
        # before, in builds with those features off; chosen by spills alone, not timed on a GPU yet:
        # online D=64, 4x16 rows, 16 keys: 72 / 56 bytes -> D=128's 3.9 tile: 224 / 220 registers;
        ("triton/online", 64): {"rows_rep": 2, "block_n": 64, "block_d": 8},
        # pipelined D=256, 64 x 32, 4 warps: 56 bytes, causal or not -> 8 warps: 204 / 206 registers;
        ("triton/pipelined", (256, False)): {"num_warps": 8},
        ("triton/pipelined", (256, True)): {"num_warps": 8},
        # pipelined D=128 causal: the non-causal 128 x 128 tile (445 vs 433 TFLOP/s for 64 x 64 when it
        # fitted) now spills 16 bytes, so 3.9 keeps the table's 64 x 64 (192 registers, no spill).
        # hopper's hand-pipelined loop and fp8's 3 stages spill under 3.9's ptxas flag
        # --regAllocOptLevel=2 (104 / 16 bytes); --regAllocOptLevel=4 assembles them spill-free, and on
        # the H200 (one session, 2026-11-24) they then beat 3.9's spill-free tiles: hopper 514 / 472
        # vs 495 / 467, fp8 768 / 700 vs 694 / 649 TFLOP/s (docs/perf-log.md).
        ("triton/hopper", 128): {"ptx_options": "--regAllocOptLevel=4"},
        ("triton/fp8", 128): {"ptx_options": "--regAllocOptLevel=4"},
        # Not a spill: gluon/hopper D=64 drops ping-pong under 3.9, 492.5 vs 485.5 TFLOP/s (B=4 H=32,
        # five interleaved rounds; 3.6 keeps it, 508.1 vs 500.6) (docs/perf-log.md, "Fourth stop").
        ("gluon/hopper", 64): {"pingpong": False},
        # Not a spill: gluon/fp8 D=128 keeps gl.max / gl.sum under 3.9, which reduces as a tree itself: the
        # hand-made row trees measured 0.984 / 0.978 there at P1, causal or not (3.6: 1.072 / 1.024); D=64 keeps
        # them (3.9: 1.122 / 1.060) (docs/perf-log.md, "Fourth stop").
        ("gluon/fp8", (128, False)): {"row_tree": False},
        # Causal D=128 with ping-pong keeps 8 bytes of stack under 3.9 in the build with every feature on
        # (3.6, 3.7 and 3.8: none), so 3.9 runs it without.
        ("gluon/fp8", (128, True)): {"row_tree": False, "pingpong": False},
    },
}

ConfigT = TypeVar("ConfigT")
KeyT = TypeVar("KeyT", bound=Hashable)


def installed_triton() -> str:
    """The version string of the Triton that ``import triton`` finds (may be a PYTHONPATH copy)."""
    import triton

    return triton.__version__


def _major_minor(version: str) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError(f"expected a Triton version like '3.9.0', got {version!r}")
    return int(match.group(1)), int(match.group(2))


@functools.cache
def triton_release(version: str | None = None) -> str:
    """The tested release whose tile configurations apply to ``version`` (default: the installed one)."""
    wanted = _major_minor(version or installed_triton())
    older = [release for release in TESTED_TRITON if _major_minor(release) <= wanted]
    return max(older, key=_major_minor) if older else TESTED_TRITON[0]


def tested_triton_status(version: str | None = None) -> str | None:
    """None when ``version`` (default: the installed Triton) is a tested release, else a warning."""
    version = version or installed_triton()
    major, minor = _major_minor(version)
    if f"{major}.{minor}" in TESTED_TRITON:
        return None
    return (
        f"Triton {version} is not a tested release (tested: {', '.join(TESTED_TRITON)}); the Triton rungs use "
        f"the tiles chosen for {triton_release(version)}, which may spill or run slower on it"
    )


def release_configs(rung: str, table: Mapping[KeyT, ConfigT]) -> dict[KeyT, ConfigT]:
    """A rung's tile table with the installed release's overrides applied (a new dict)."""
    overrides = RELEASE_OVERRIDES[triton_release()]
    return {
        key: dataclasses.replace(config, **overrides[rung, key]) if (rung, key) in overrides else config
        for key, config in table.items()
    }


def tile_key_name(key: Hashable) -> str:
    """A rung table's key as the record names it: ``D=128`` or, for (head_dim, causal) keys, ``D=128 causal``."""
    head_dim, causal = key if isinstance(key, tuple) else (key, False)
    return f"D={head_dim}" + (" causal" if causal else "")


def triton_config_record(implementations: Iterable[Any]) -> dict[str, Any]:
    """For env.json: the Triton version, whose tile table applies, and the default tiles of each
    Triton or Gluon rung among ``implementations`` (registry entries; their ``default_configs``)."""

    def by_key(table: Mapping[Any, Any]) -> dict[str, Any]:
        return {
            tile_key_name(key): dataclasses.asdict(config) if dataclasses.is_dataclass(config) else config
            for key, config in table.items()
        }

    record: dict[str, Any] = {
        "triton": installed_triton(),
        "config_release": triton_release(),
        "untested": tested_triton_status(),
    }
    for impl in implementations:
        if impl.stack in TRITON_STACKS and impl.default_configs is not None:
            record[impl.name] = by_key(impl.default_configs)
    return record
