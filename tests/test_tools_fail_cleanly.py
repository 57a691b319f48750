"""The GPU tools, started where they cannot run, print one line naming what is missing, write nothing and exit 2."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
MISSING_EXIT = 2


def _run_tool(module: str, path: str, tmp_path: Path) -> subprocess.CompletedProcess:
    # CUDA hidden, so the test means the same on the GPU machine as on a CPU-only one.
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PATH=path, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", module], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
    )


def _fake_sanitizer(folder: Path) -> None:
    tool = folder / "compute-sanitizer"
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)


@pytest.mark.parametrize(
    ("module", "with_sanitizer", "missing"),
    [
        ("common.tools.fuzz", False, "needs a CUDA GPU"),
        ("common.tools.sanitize", False, "needs compute-sanitizer"),
        ("common.tools.sanitize", True, "needs a CUDA GPU"),
        ("common.tools.context_parallel", False, "not started by torchrun"),
        ("common.tools.gpu_tests", False, "needs a CUDA GPU"),
        ("bench.generate", False, "needs a CUDA GPU"),
        ("bench.graph_leak", False, "needs a CUDA GPU"),
        ("bench.backward", False, "needs a CUDA GPU"),
        ("bench.gluon_bwd_causal", False, "needs a CUDA GPU"),
        ("bench.gluon_paged_decode", False, "needs a CUDA GPU"),
        ("bench.cute_paged_decode", False, "needs a CUDA GPU"),
        ("bench.decode_fuse", False, "needs a CUDA GPU"),
        ("bench.decode_fewpairs", False, "needs a CUDA GPU"),
        ("bench.gluon_balanced_ab", False, "needs a CUDA GPU"),
        ("bench.cute_merge_plan_ab", False, "needs a CUDA GPU"),
        ("bench.decode_ragged_ab", False, "needs a CUDA GPU"),
        ("bench.decode_target_ab", False, "needs a CUDA GPU"),
        ("bench.decode_mtile_major", False, "needs a CUDA GPU"),
        ("bench.train", False, "needs a CUDA GPU"),
        ("bench.fp8_q_in_kernel", False, "needs a CUDA GPU"),
        ("bench.fp8_pdl", False, "needs a CUDA GPU"),
        ("bench.fp8_tile_work", False, "needs a CUDA GPU"),
        ("bench.fp8_quotient", False, "needs a CUDA GPU"),
        ("bench.fp8_scale_index", False, "needs a CUDA GPU"),
        ("bench.fp8_fold_v", False, "needs a CUDA GPU"),
        ("bench.cute_fp8_pingpong", False, "needs a CUDA GPU"),
        ("bench.gluon_fp8_pingpong", False, "needs a CUDA GPU"),
        ("bench.gluon_hopper_pingpong", False, "needs a CUDA GPU"),
        ("bench.decode_floor", False, "needs a CUDA GPU"),
        ("bench.decode_splits", False, "needs a CUDA GPU"),
        ("bench.generate_syncs", False, "needs a CUDA GPU"),
        ("bench.generate_trace", False, "needs a CUDA GPU"),
        ("bench.backward_kernels", False, "needs a CUDA GPU"),
        ("bench.backward_interleaved", False, "needs a CUDA GPU"),
        ("bench.cute_bwd_short_ab", False, "needs a CUDA GPU"),
    ],
)
def test_tool_names_what_is_missing_and_exits_2(module: str, with_sanitizer: bool, missing: str, tmp_path: Path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if with_sanitizer:
        _fake_sanitizer(bin_dir)
    done = _run_tool(module, str(bin_dir), tmp_path)
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode == MISSING_EXIT, f"exit {done.returncode}:\n{done.stdout}\n{done.stderr}"
    assert len(lines) == 1 and missing in lines[0], f"expected one line saying {missing!r}, got:\n{lines}"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["bin"], "it wrote before refusing"


def test_gpu_test_parts_are_disjoint_and_cover_the_suite():
    from common.tools import gpu_tests

    test_ids = [f"tests/test_{i % 5}.py::case[{i}]" for i in range(23)]
    parts = [gpu_tests.part_of(test_ids, part, 3) for part in (1, 2, 3)]
    assert sorted(test_id for p in parts for test_id in p) == sorted(test_ids)
    assert sum(len(p) for p in parts) == len(test_ids)
    assert gpu_tests.parse_part("2/3") == (2, 3)
    for bad in ("0/2", "3/2", "1", "a/b"):
        with pytest.raises(argparse.ArgumentTypeError, match="PART"):
            gpu_tests.parse_part(bad)


def test_a_cut_gpu_run_settles_only_what_its_log_finished(tmp_path: Path):
    """``--done``: the tests a cut log passed or skipped are not run again; a failure is, and so is every test the
    log never reached. Planted: the FAILED line counted as settled would hide the failure from the next call."""
    from common.tools import gpu_tests

    log = tmp_path / "gpu-tests-1.log"
    log.write_text(
        "[gw0] [ 10%] PASSED tests/test_a.py::test_x[d128-bf16] \n"
        "[gw1] [ 20%] SKIPPED tests/test_a.py::test_y[gpu_ring]@gluon-compile \n"
        "[gw2] [ 30%] FAILED tests/test_b.py::test_z[sq77 sk1000] \n"
    )
    settled = gpu_tests.settled_tests([log])
    assert settled == {"tests/test_a.py::test_x[d128-bf16]", "tests/test_a.py::test_y[gpu_ring]"}
    planted = gpu_tests.SETTLED | {"FAILED"}
    assert "tests/test_b.py::test_z[sq77 sk1000]" in {
        match.group(2)
        for line in log.read_text().splitlines()
        if (match := gpu_tests.OUTCOME.search(line)) and match.group(1) in planted
    }


# A part's log with two failures: one out of memory beside other workers, one a wrong answer.
PART_LOG = """\
[gw0] [ 33%] PASSED tests/test_a.py::test_x[d128]
[gw1] [ 66%] FAILED tests/test_paged_kv.py::test_gpu_paged[page64-d128]
[gw2] [100%] FAILED tests/test_rungs_gpu.py::test_gpu_matches_reference[cute/fp8-sq1000-sk77]
=================================== FAILURES ===================================
_ test_gpu_paged[page64-d128] _
    def test_gpu_paged(case):
_ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _
E       torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1024.00 MiB.
______ test_gpu_matches_reference[cute/fp8-sq1000-sk77] _______
E       AssertionError: cute/fp8 WRONG (rel_l2 4.674e-01 > ...)
=========================== short test summary info ============================
FAILED tests/test_paged_kv.py::test_gpu_paged[page64-d128] - torch.OutOfMemoryError: CUDA out of memory
"""
OUT_OF_MEMORY_TEST = "tests/test_paged_kv.py::test_gpu_paged[page64-d128]"
WRONG_TEST = "tests/test_rungs_gpu.py::test_gpu_matches_reference[cute/fp8-sq1000-sk77]"


def test_only_failures_out_of_memory_are_run_again(tmp_path: Path):
    """Of a part's failures, only the one whose report names an out-of-memory error is run again alone. Planted: every
    failure run again would give the wrong answer a second chance (a race's wrong answer may not come twice)."""
    from common.tools import gpu_tests

    log = tmp_path / "gpu-tests-1.log"
    log.write_text(PART_LOG)
    assert gpu_tests.failed_tests(log) == [OUT_OF_MEMORY_TEST, WRONG_TEST]
    assert gpu_tests.out_of_memory_failures(log) == [OUT_OF_MEMORY_TEST]
    planted = gpu_tests.failed_tests(log)  # every failure taken as out of memory
    assert WRONG_TEST in planted and planted != gpu_tests.out_of_memory_failures(log)


@pytest.mark.parametrize(
    ("wrong_answer", "alone", "status"),
    [(False, "PASSED", 0), (False, "FAILED", 1), (True, "PASSED", 1)],
    ids=["memory-only-passes-alone", "memory-only-fails-alone", "with-a-wrong-answer"],
)
def test_a_part_passes_only_when_its_memory_failures_pass_alone(
    tmp_path: Path, monkeypatch, wrong_answer: bool, alone: str, status: int
):
    """The rerun's status decides only where every other test passed; its outcome is the test's last line in the log.
    Planted: the rerun's status returned whatever else failed passes the part with a wrong answer in it."""
    from common.tools import gpu_tests

    text = PART_LOG if wrong_answer else PART_LOG.replace("FAILED tests/test_rungs_gpu", "PASSED tests/test_rungs_gpu")
    log = tmp_path / "gpu-tests-1.log"
    log.write_text(text)
    reruns, statuses = [], []

    def fake_run_part(test_ids, workers, to, mode="w"):
        reruns.append((list(test_ids), workers, mode))
        with to.open(mode) as sink:
            sink.write(f"[gw0] [100%] {alone} {OUT_OF_MEMORY_TEST} \n")
        statuses.append(0 if alone == "PASSED" else 1)
        return statuses[-1]

    monkeypatch.setattr(gpu_tests, "run_part", fake_run_part)
    assert gpu_tests.rerun_out_of_memory(1, log) == status
    assert reruns == [([OUT_OF_MEMORY_TEST], 1, "a")]
    assert log.read_text().startswith(text), "the rerun must append to the part's log"
    assert (OUT_OF_MEMORY_TEST in gpu_tests.failed_tests(log)) == (alone == "FAILED")
    assert "run again alone: " in log.read_text().splitlines()[-1]
    if wrong_answer:  # the rerun itself passed: a rule returning its status would pass the part
        assert statuses == [0]


def test_failed_prints_each_logs_failures_by_last_outcome(tmp_path: Path, capsys):
    """``--failed`` (the suite's summary): the wrong answer, and not the out-of-memory failure that passed alone.
    Planted: its first outcome read (as a grep of FAILED lines would) lists both."""
    from common.tools import gpu_tests

    log = tmp_path / "gpu-tests-1.log"
    log.write_text(PART_LOG + f"[gw0] [100%] PASSED {OUT_OF_MEMORY_TEST} \n")
    assert gpu_tests.main(["--failed", str(log)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"FAILED {WRONG_TEST}"]
    first = [line for line in PART_LOG.splitlines() if line.startswith("FAILED ")]
    assert any(OUT_OF_MEMORY_TEST in line for line in first)
    assert gpu_tests.main(["--failed", str(tmp_path / "gone.log")]) == MISSING_EXIT


def test_a_part_that_passed_runs_nothing_again(tmp_path: Path, monkeypatch):
    from common.tools import gpu_tests

    log = tmp_path / "gpu-tests-1.log"
    log.write_text(PART_LOG)
    monkeypatch.setattr(gpu_tests, "run_part", lambda *args, **kwargs: pytest.fail("nothing to run again"))
    assert gpu_tests.rerun_out_of_memory(0, log) == 0


def test_gpu_tests_names_a_done_log_that_is_not_there(tmp_path: Path, capsys):
    from common.tools import gpu_tests

    assert gpu_tests.main(["--done", str(tmp_path / "gone.log")]) == MISSING_EXIT
    assert "gone.log" in capsys.readouterr().err


FAKE_NVIDIA_SMI = """#!/usr/bin/env bash
if [ "$1" = --list-gpus ]; then for ((i = 0; i < GPUS; i++)); do echo "GPU $i: NVIDIA H200"; done; fi
"""
# python3 as the suite script calls it: the CUDA check passes, gpu_tests writes its --log, pytest prints a line.
FAKE_PYTHON = """#!/usr/bin/env bash
if [ "$1" = -c ]; then exit 0; fi
while [ $# -gt 0 ]; do if [ "$1" = --log ]; then echo "[gw0] [100%] PASSED tests/t.py::t" > "$2"; fi; shift; done
echo "1 passed"
"""
# What a device call returns from $OUT.
RETURNED_FILES = 8


def suite_outputs(tmp_path: Path, gpus: int, script: str) -> list[Path]:
    """The files ``script`` (``bench/gpu_suite.sh``'s text) leaves under $OUT on a faked host of ``gpus`` GPUs."""
    fakes, bench, out = tmp_path / "bin", tmp_path / "bench", tmp_path / f"out{gpus}"
    for folder in (fakes, bench):
        folder.mkdir(parents=True, exist_ok=True)
    for name, text in (("nvidia-smi", FAKE_NVIDIA_SMI), ("python3", FAKE_PYTHON)):
        (fakes / name).write_text(text)
        (fakes / name).chmod(0o755)
    (bench / "_gpu_run.sh").write_text((ROOT / "bench" / "_gpu_run.sh").read_text())
    (bench / "gpu_suite.sh").write_text(script)
    env = dict(os.environ, PATH=f"{fakes}{os.pathsep}{os.environ['PATH']}", GPUS=str(gpus), OUT=str(out))
    env.update(BUDGET_S="200", RING_S="10")
    done = subprocess.run(["bash", str(bench / "gpu_suite.sh")], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    return sorted(path for path in out.rglob("*") if path.is_file())


def test_the_gpu_suite_returns_every_log_on_any_host(tmp_path: Path):
    """On 1, 2, 4 and 8 GPUs the suite leaves at most the 8 files a device call returns, each part's log among
    them. Planted: two parts per GPU without the cap leave 18 files on 8 GPUs (the rest would be lost)."""
    script = (ROOT / "bench" / "gpu_suite.sh").read_text()
    for gpus in (1, 2, 4, 8):
        outputs = suite_outputs(tmp_path, gpus, script)
        parts = [path for path in outputs if re.fullmatch(r"gpu-tests-\d+\.log", path.name)]
        assert len(outputs) <= RETURNED_FILES and len(parts) == min(2 * gpus, 6), (gpus, outputs)
    planted = script.replace("MAX_PARTS=6", "MAX_PARTS=64")
    assert planted != script and len(suite_outputs(tmp_path / "planted", 8, planted)) > RETURNED_FILES


def test_the_gpu_suite_script_names_what_is_missing_and_exits_2(tmp_path: Path):
    """``bench/gpu_suite.sh`` (the whole GPU suite in one device call) refuses like the Python tools: one line,
    exit 2, nothing written (its logs go under $OUT only once a GPU is there)."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PATH=path, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_suite.sh")], capture_output=True, text=True, env=env, cwd=tmp_path,
        timeout=300,
    )  # fmt: skip
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode == MISSING_EXIT, f"exit {done.returncode}:\n{done.stdout}\n{done.stderr}"
    assert len(lines) == 1 and "needs a CUDA GPU" in lines[0], lines
    assert not any(tmp_path.iterdir()), "it wrote before refusing"


# python3 as bench/side_by_side.sh calls it: the CUDA check passes, torch counts $GPUS devices.
FAKE_TORCH_PYTHON = """#!/usr/bin/env bash
if [ "$1" = -c ] && [[ "$2" == *device_count* ]]; then echo "$GPUS"; fi
"""
# A job: records the GPU it was given in its $OUT, and fails when its name says so.
FAKE_JOB = """#!/usr/bin/env bash
source "$(dirname "$0")/_gpu_run.sh" "$(basename "$0")" runs/job
echo "$CUDA_VISIBLE_DEVICES" > "$OUT/gpu.txt"
case "$0" in *fails*) exit 1 ;; esac
"""


def side_by_side(tmp_path: Path, gpus: int, jobs: list[str], script: str | None = None) -> subprocess.CompletedProcess:
    """``bench/side_by_side.sh`` (or ``script``, its text) over ``jobs`` (names of FAKE_JOB copies) on a faked host of
    ``gpus`` GPUs, $OUT and $SIDE (its jobs' folders) under ``tmp_path``."""
    fakes, bench = tmp_path / "bin", tmp_path / "bench"
    for folder in (fakes, bench):
        folder.mkdir(parents=True, exist_ok=True)
    (fakes / "python3").write_text(FAKE_TORCH_PYTHON)
    (fakes / "python3").chmod(0o755)
    (bench / "_gpu_run.sh").write_text((ROOT / "bench" / "_gpu_run.sh").read_text())
    (bench / "side_by_side.sh").write_text(script or (ROOT / "bench" / "side_by_side.sh").read_text())
    for job in jobs:
        (bench / job).write_text(FAKE_JOB)
    env = dict(os.environ, PATH=f"{fakes}{os.pathsep}{os.environ['PATH']}", GPUS=str(gpus), OUT=str(tmp_path / "out"))
    env["SIDE"] = str(tmp_path / "side")
    command = ["bash", str(bench / "side_by_side.sh"), *(str(bench / job) for job in jobs)]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)


def _gpus_given(tmp_path: Path, jobs: list[str]) -> list[str]:
    return [(tmp_path / "side" / job.removesuffix(".sh") / "gpu.txt").read_text().strip() for job in jobs]


def test_side_by_side_gives_each_job_its_own_gpu_and_reports_a_failed_one(tmp_path: Path):
    """Three jobs on a faked 4-GPU host: GPUs 0, 1 and 2, one archive back, exit 1 because one job failed. Planted:
    every job on the first GPU (the counter never advanced) fails the rule."""
    jobs = ["a.sh", "b.sh", "c_fails.sh"]
    done = side_by_side(tmp_path, 4, jobs)
    assert done.returncode == 1, done.stdout + done.stderr
    assert _gpus_given(tmp_path, jobs) == ["0", "1", "2"]
    assert (tmp_path / "out" / "side.tgz").is_file() and "=== c_fails (GPU 2): exit 1" in done.stdout
    script = (ROOT / "bench" / "side_by_side.sh").read_text()
    planted = script.replace("gpu=$((gpu + 1))", ":")
    assert planted != script
    side_by_side(tmp_path / "planted", 4, jobs, planted)
    assert _gpus_given(tmp_path / "planted", jobs) != ["0", "1", "2"]


def test_side_by_side_refuses_more_jobs_than_gpus_in_one_line(tmp_path: Path):
    done = side_by_side(tmp_path, 2, ["a.sh", "b.sh", "c.sh"])
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode == MISSING_EXIT and len(lines) == 1 and "takes 1 to 2 scripts" in lines[0], lines
