"""Fingerprint what every rung compiles to for sm_90a, so a refactor can show its machine code unchanged.

    python -m bench.fingerprint --out results/sm90a-fingerprint/<rev>.csv       # no GPU needed
    python -m bench.fingerprint --diff before.csv after.csv                      # exit 1 on a difference

Each row is one kernel of one rung at one problem (P1 and its causal twin, and a decode step): the
SHA-256 of its PTX and of its SASS, each with what a move between files changes and code does not
taken out (``.loc``/``.file`` lines, DWARF ``.debug`` sections and the ``$L__tmp`` labels only they use,
``//`` comments, blank lines, the kernel's mangled entry name), and the
instruction and register counts, so a difference says where to look. Rungs compile in a clean child
process (as ``common.reporting.static`` does), kernels in the order each rung's ``compile_sm90`` gives.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from common.contract.problem import Problem
from common.measure.results import write_rows

ROOT = Path(__file__).resolve().parents[1]

PROBLEMS: dict[str, Problem] = {
    "p1": Problem(2, 16, 8192, 8192, 128, torch.bfloat16),
    "p1-causal": Problem(2, 16, 8192, 8192, 128, torch.bfloat16, causal=True),
    "decode": Problem(8, 32, 1, 32768, 128, torch.bfloat16, kv_heads=8, has_cache_seqlens=True),
}

_PTX_NOISE = re.compile(r"^\s*(\.loc|\.file|//).*$", re.MULTILINE)
# DWARF sections (call lines, directories) and the labels that only they refer to (inlined-call ranges).
_PTX_DEBUG = re.compile(r"^\s*\.section\s+\.debug\w*\s*\{.*?^\s*\}", re.MULTILINE | re.DOTALL)
_PTX_DEBUG_LABEL = re.compile(r"^\s*\$L__tmp\d+:\s*$", re.MULTILINE)
_SASS_NOISE = re.compile(r"/\*[0-9a-f]{4,}\*/|//.*$|^\s*\.(?:text|section|headerflags|elftype).*$", re.MULTILINE)


@dataclass(frozen=True)
class Fingerprint:
    """One compiled kernel: where it came from and hashes of its code without names and line info."""

    problem: str
    rung: str
    index: int
    ptx_sha: str
    sass_sha: str
    ptx_lines: int
    sass_instructions: int
    error: str = ""


def _normalised_ptx(ptx: str, entry: str) -> str:
    text = _PTX_DEBUG_LABEL.sub("", _PTX_DEBUG.sub("", _PTX_NOISE.sub("", ptx)))
    return "\n".join(line for line in text.replace(entry, "KERNEL").splitlines() if line.strip())


def _sass(cubin: bytes) -> str:
    from common.reporting.static import _cuobjdump

    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        done = subprocess.run([_cuobjdump(), "-sass", handle.name], capture_output=True, text=True, check=True)
    body = done.stdout.split("Function :", 1)[-1].split("\n", 1)[-1]
    return "\n".join(line.strip() for line in _SASS_NOISE.sub("", body).splitlines() if line.strip())


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _entry_name(ptx: str) -> str:
    found = re.search(r"\.entry\s+([\w$]+)", ptx)
    return found.group(1) if found else "\0"


def fingerprints(problem_name: str) -> list[Fingerprint]:
    """Compile every rung that has an sm_90a compile path at one named problem (in this process)."""
    from common.contract.registry import discover

    rows = []
    available, _ = discover(include_baselines=False)
    for impl in available:
        if impl.compile_sm90 is None:
            continue
        try:
            binaries = impl.compile_sm90(PROBLEMS[problem_name])
        except Exception as error:  # noqa: BLE001 - a rung that cannot compile a problem is a row
            rows.append(Fingerprint(problem_name, impl.name, 0, "", "", 0, 0, f"{type(error).__name__}: {error}"))
            continue
        for index, binary in enumerate(binaries):
            ptx = _normalised_ptx(binary.ptx, _entry_name(binary.ptx))
            sass = _sass(binary.cubin) if binary.cubin else ""
            rows.append(
                Fingerprint(problem_name, impl.name, index, _sha(ptx), _sha(sass), ptx.count("\n"), sass.count("\n"))
            )
    return rows


def _in_child(problem_name: str) -> list[Fingerprint]:
    from common.reporting.static import compile_environment

    done = subprocess.run(
        [sys.executable, "-m", "bench.fingerprint", "--child", problem_name],
        capture_output=True,
        text=True,
        env=compile_environment(),
        cwd=ROOT,
    )
    if done.returncode != 0:
        raise RuntimeError(f"fingerprinting {problem_name} failed:\n{done.stderr[-4000:]}")
    return [Fingerprint(**row) for row in json.loads(done.stdout.splitlines()[-1])]


def _write(rows: list[Fingerprint], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    write_rows(out, rows, list(Fingerprint.__dataclass_fields__))


def _read(path: Path) -> dict[tuple[str, str, str], dict[str, str]]:
    with path.open() as handle:
        return {(row["problem"], row["rung"], row["index"]): row for row in csv.DictReader(handle)}


def diff(before: Path, after: Path) -> list[str]:
    """One line per kernel whose fingerprint differs, or that is in one file only."""
    old, new = _read(before), _read(after)
    lines = []
    for key in sorted(old.keys() | new.keys()):
        if key not in old or key not in new:
            lines.append(f"{'/'.join(key)}: only in {'after' if key in new else 'before'}")
            continue
        changed = [
            f"{field} {old[key][field]} -> {new[key][field]}"
            for field in ("ptx_sha", "sass_sha", "ptx_lines", "sass_instructions", "error")
            if old[key][field] != new[key][field]
        ]
        if changed:
            lines.append(f"{'/'.join(key)}: " + "; ".join(changed))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="CSV to write (every problem, every rung)")
    parser.add_argument("--problem", action="append", choices=sorted(PROBLEMS), help="default: all")
    parser.add_argument("--diff", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps([asdict(row) for row in fingerprints(args.child)]))
        return
    if args.diff:
        differences = diff(*args.diff)
        print("\n".join(differences) or "identical: every kernel's PTX and SASS fingerprint matches")
        sys.exit(1 if differences else 0)
    if args.out is None:
        parser.error("--out or --diff is needed")
    rows = [row for name in args.problem or sorted(PROBLEMS) for row in _in_child(name)]
    _write(rows, args.out)
    print(f"{len(rows)} kernels fingerprinted into {args.out}")


if __name__ == "__main__":
    main()
