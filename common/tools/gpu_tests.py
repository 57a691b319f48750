"""The GPU test suite in parts, each of which fits one device call.

    python -m common.tools.gpu_tests --part 1/2 --log $OUT/gpu-tests-1.log      # one call
    python -m common.tools.gpu_tests --part 2/2 --log $OUT/gpu-tests-2.log      # the next
    python -m common.tools.gpu_tests --failed $OUT/gpu-tests-*.log                # what failed, by last outcome

The whole ``-m gpu`` suite takes longer than a device call may run (over 440 s on 8 workers against a
600 s limit), and a call cut by its limit loses the names of the tests it never reached. A part is every
PARTS-th test of pytest's collection order, so the slow files are shared out instead of landing in one
part; it runs verbosely (one line per test, written to ``--log`` as it goes), so even a part cut short
says what passed, what failed and where it stopped. Together the parts run every GPU test once.

Tests side by side share one GPU's memory: eight workers to a part and two parts to an 80 GB H100 ran some of the
largest cases out of it (2026-12-05), failures of the run, not of the kernels. A test that failed out of memory is run
again alone after its part, with one worker, into the same log; the part passes only if each such test then passes.
Only those: a test that failed for any other reason (a wrong answer that a race gives now and then) stays failed.

Exit status: pytest's for the part, or for its tests run again alone where every other test passed; 2 without a
CUDA GPU (one line), with a bad ``--part`` or a ``--done`` log that is not there.
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
# "@group" where the test is in an xdist_group (--dist loadgroup); the short summary's "FAILED tests/...::test_x[...] -
# reason" gives the same id.
OUTCOME = re.compile(
    r"(PASSED|SKIPPED|XFAIL|XPASS|FAILED|ERROR) (tests/\S+?::[^\s\[@]+(?:\[.*?\])?)(?:@[\w.-]+)?(?: - .*)?\s*$"
)
SETTLED = {"PASSED", "SKIPPED", "XFAIL", "XPASS"}
# A failure's section in pytest's FAILURES report starts with its name between underscores ("____ test_x[a] ____",
# one on the left where the name is long); a traceback's frames are parted by "_ _ _ _".
SECTION = re.compile(r"^_+ ([^_\s].*?) _+$")
OUT_OF_MEMORY = ("torch.OutOfMemoryError", "CUDA error: out of memory", "CUDA_ERROR_OUT_OF_MEMORY")
SLOWEST_REPORTED = 40


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


def failed_tests(log: Path) -> list[str]:
    """The node ids whose last outcome in ``log`` is a failure or an error (a test run again alone ends with that
    run's), in the order they first appear."""
    last: dict[str, str] = {}
    for line in log.read_text(errors="replace").splitlines():
        match = OUTCOME.search(line)
        if match:
            last[match.group(2)] = match.group(1)
    return [test for test, outcome in last.items() if outcome not in SETTLED]


def out_of_memory_failures(log: Path) -> list[str]:
    """Of ``log``'s failed tests, those whose section of the FAILURES report names an out-of-memory error. A section
    is headed by the test's name without its file, so a name that two failed tests share counts for both."""
    sections: dict[str, list[str]] = {}
    name = None
    for line in log.read_text(errors="replace").splitlines():
        header = SECTION.match(line)
        if header:
            name = header.group(1)
            sections.setdefault(name, [])
        elif line.startswith("=") and "short test summary" in line:
            name = None
        elif name is not None:
            sections[name].append(line)
    short_of_memory = {
        name for name, body in sections.items() if any(mark in line for line in body for mark in OUT_OF_MEMORY)
    }
    return [test for test in failed_tests(log) if test.split("::", 1)[1] in short_of_memory]


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


def run_part(test_ids: Sequence[str], workers: int, log: Path, mode: str = "w") -> int:
    """pytest on ``test_ids`` with ``workers`` xdist workers, its output to stdout and ``log`` line by line (``mode``
    "a": after what ``log`` holds). The slowest tests' times close the log: the whole suite takes two device calls on
    one GPU, and they say where that time goes."""
    command = [sys.executable, "-m", "pytest", "-v", "-m", "gpu", "-n", str(workers), "--dist", "loadgroup"]
    command += ["--durations", str(SLOWEST_REPORTED), *test_ids]
    log.parent.mkdir(parents=True, exist_ok=True)
    with (
        log.open(mode) as sink,
        subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as pytest,
    ):
        for line in pytest.stdout:
            sys.stdout.write(line)
            sink.write(line)
            sink.flush()
    return pytest.returncode


def rerun_out_of_memory(status: int, log: Path) -> int:
    """After a part that ended with ``status``: its tests that failed out of memory, run again alone (one worker,
    appended to ``log``, which then ends with a line that counts them). The part's status stands where another test
    failed or none ran short of memory; else the rerun's."""
    short = out_of_memory_failures(log) if status != 0 else []
    if not short:
        return status
    others = [test for test in failed_tests(log) if test not in short]
    with log.open("a") as sink:
        sink.write(f"\ngpu_tests: {len(short)} tests failed out of memory beside other workers; run again alone:\n")
    rerun = run_part(short, 1, log, mode="a")
    still = [test for test in failed_tests(log) if test in short]
    summary = (
        f"gpu_tests: out of memory beside other workers, run again alone: {len(short) - len(still)} passed, "
        f"{len(still)} failed; {len(others)} other failures"
    )
    print(summary, flush=True)
    with log.open("a") as sink:
        sink.write(summary + "\n")
    return status if others else rerun


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", type=parse_part, default=(1, 1), help="PART/PARTS (default 1/1: all)")
    parser.add_argument("--workers", type=int, default=8, help="xdist workers (default 8)")
    parser.add_argument("--log", type=Path, default=Path("runs/gpu-tests.log"), help="where the output goes too")
    parser.add_argument("--done", type=Path, nargs="*", default=[], help="logs of a cut run: skip what they settled")
    parser.add_argument("--failed", type=Path, nargs="+", help="print these logs' failures (last outcomes) and exit")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for option, logs in (("--done", args.done), ("--failed", args.failed or [])):
        missing = [str(log) for log in logs if not log.is_file()]
        if missing:
            not_files = ", ".join(missing)
            print(f"gpu_tests: {option} expects logs of an earlier run; not files: {not_files}", file=sys.stderr)
            return EXIT_MISSING
    if args.failed:
        # A test that ran out of memory and then passed alone is not one (its last outcome).
        for log in args.failed:
            print("\n".join(f"FAILED {test}" for test in failed_tests(log)[:40]) or f"{log.name}: no failure")
        return 0
    import torch

    if not torch.cuda.is_available():
        print("gpu_tests: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return EXIT_MISSING
    part, parts = args.part
    settled = settled_tests(args.done)
    test_ids = part_of([test for test in collect_gpu_tests() if test not in settled], part, parts)
    print(f"gpu_tests: part {part}/{parts}, {len(test_ids)} tests ({len(settled)} settled before)", flush=True)
    return rerun_out_of_memory(run_part(test_ids, args.workers, args.log), args.log)


if __name__ == "__main__":
    sys.exit(main())
