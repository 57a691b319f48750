"""The GPU test suite in parts, each of which fits one device call.

    python -m common.tools.gpu_tests --part 1/2 --log $OUT/gpu-tests-1.log      # one call
    python -m common.tools.gpu_tests --part 2/2 --log $OUT/gpu-tests-2.log      # the next

The whole ``-m gpu`` suite takes longer than a device call may run (over 440 s on 8 workers against a
600 s limit), and a call cut by its limit loses the names of the tests it never reached. A part is every
PARTS-th test of pytest's collection order, so the slow files are shared out instead of landing in one
part; it runs verbosely (one line per test, written to ``--log`` as it goes), so even a part cut short
says what passed, what failed and where it stopped. Together the parts run every GPU test once.

Exit status: pytest's for the part; 2 without a CUDA GPU (one line), with a bad ``--part`` or a ``--done`` log that
is not there.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXIT_MISSING = 2
# The outcome line pytest -v prints under xdist: "[gw0] [ 10%] PASSED tests/...::test_x[...]", its id followed by
# "@group" where the test is in an xdist_group (--dist loadgroup).
OUTCOME = re.compile(r"(PASSED|SKIPPED|XFAIL|XPASS|FAILED|ERROR) (tests/\S+::.+?)(?:@[\w.-]+)?\s*$")
SETTLED = {"PASSED", "SKIPPED", "XFAIL", "XPASS"}


def parse_part(text: str) -> tuple[int, int]:
    """``"i/n"`` → (i, n) with 1 <= i <= n."""
    try:
        part, parts = (int(field) for field in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected PART/PARTS such as 1/2, got {text!r}") from None
    if not 1 <= part <= parts:
        raise argparse.ArgumentTypeError(f"expected 1 <= PART <= PARTS, got {text!r}")
    return part, parts


def part_of(test_ids: Sequence[str], part: int, parts: int) -> list[str]:
    """Every ``parts``-th test from the ``part``-th (1-based): the parts are disjoint and cover all."""
    return list(test_ids[part - 1 :: parts])


def settled_tests(logs: Sequence[Path]) -> set[str]:
    """The node ids that ``logs`` (verbose pytest output) report passed, skipped or xfailed."""
    settled = set()
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            match = OUTCOME.search(line)
            if match and match.group(1) in SETTLED:
                settled.add(match.group(2))
    return settled


def collect_gpu_tests() -> list[str]:
    """The node ids of the ``-m gpu`` tests, in pytest's collection order."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "tests"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    test_ids = [line for line in done.stdout.splitlines() if "::" in line]
    if not test_ids:
        raise RuntimeError(f"pytest collected no GPU test:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return test_ids


def run_part(test_ids: Sequence[str], workers: int, log: Path) -> int:
    """pytest on ``test_ids`` with ``workers`` xdist workers, its output to stdout and ``log`` line by line."""
    command = [sys.executable, "-m", "pytest", "-v", "-m", "gpu", "-n", str(workers), "--dist", "loadgroup", *test_ids]
    log.parent.mkdir(parents=True, exist_ok=True)
    with (
        log.open("w") as sink,
        subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as pytest,
    ):
        for line in pytest.stdout:
            sys.stdout.write(line)
            sink.write(line)
            sink.flush()
    return pytest.returncode


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", type=parse_part, default=(1, 1), help="PART/PARTS (default 1/1: all)")
    parser.add_argument("--workers", type=int, default=8, help="xdist workers (default 8)")
    parser.add_argument("--log", type=Path, default=Path("runs/gpu-tests.log"), help="where the output goes too")
    parser.add_argument("--done", type=Path, nargs="*", default=[], help="logs of a cut run: skip what they settled")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    missing = [str(log) for log in args.done if not log.is_file()]
    if missing:
        print(f"gpu_tests: --done expects logs of an earlier run; not files: {', '.join(missing)}", file=sys.stderr)
        return EXIT_MISSING
    import torch

    if not torch.cuda.is_available():
        print("gpu_tests: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return EXIT_MISSING
    part, parts = args.part
    settled = settled_tests(args.done)
    test_ids = part_of([test for test in collect_gpu_tests() if test not in settled], part, parts)
    print(f"gpu_tests: part {part}/{parts}, {len(test_ids)} tests ({len(settled)} settled before)", flush=True)
    return run_part(test_ids, args.workers, args.log)


if __name__ == "__main__":
    sys.exit(main())
