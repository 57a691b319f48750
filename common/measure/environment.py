"""The environment manifest written next to every run (env.json)."""

from __future__ import annotations

import importlib
import os
import platform
import re
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    """HEAD of the checkout; LADDER_GIT_COMMIT overrides it where the tree was copied without history."""
    if os.environ.get("LADDER_GIT_COMMIT"):
        return os.environ["LADDER_GIT_COMMIT"]
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    commit = done.stdout.strip()
    return commit if re.fullmatch(r"[0-9a-f]{40}", commit) else None


def gpu_clocks() -> dict[str, str] | None:
    """Current SM and memory clocks from nvidia-smi (read-only), or None where unavailable."""
    query = "clocks.sm,clocks.mem,temperature.gpu,power.draw"
    try:
        done = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    values = [value.strip() for value in done.stdout.strip().split(",")]
    return dict(zip(query.split(","), values, strict=True)) if len(values) == 4 else None


def _cutlass_dsl_version() -> str | None:
    version = _version("nvidia-cutlass-dsl")
    if version is None:
        try:
            import cutlass

            version = getattr(cutlass, "__version__", None)
        except ImportError:
            return None
    return version


def _baseline_info(module: str, function: str) -> dict[str, Any] | None:
    """``module.function()`` of a baseline's module (FlashAttention-4's version or source fingerprint,
    FlashInfer's version or why it cannot be used), None before that module exists."""
    try:
        info = getattr(importlib.import_module(module), function)
    except ModuleNotFoundError as error:
        if error.name != module:
            raise
        return None
    return info()


def _triton_toolchain() -> dict[str, Any]:
    """Whether the installed Triton is a tested release, and the Triton tile configurations in force."""
    try:
        from common.toolchain.releases import tested_triton_status, triton_config_record
    except ModuleNotFoundError as error:
        if error.name != "common.toolchain.releases":
            raise
        return {}
    try:
        from common.contract.registry import discover

        available, _ = discover(include_baselines=False)
        configs: Any = triton_config_record(available)
    except Exception as error:  # noqa: BLE001 - a rung that fails to import shows in its row; env.json says so
        configs = f"not recorded: {type(error).__name__}: {error}"
    return {"triton_status": tested_triton_status(), "triton_configs": configs}


def manifest(device: torch.device) -> dict[str, Any]:
    """GPU, clocks, driver and library versions, git commit and the full command line."""
    info: dict[str, Any] = {
        "command": " ".join(shlex.quote(arg) for arg in sys.argv),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "nvidia_cutlass_dsl": _cutlass_dsl_version(),
        # The CuTe rungs' launch path (TVM-FFI) and whether torch hands it tensors through the DLPack
        # exchange API (a C call per tensor) rather than a Python __dlpack__ capsule.
        "apache_tvm_ffi": _version("apache-tvm-ffi"),
        "torch_dlpack_exchange_api": hasattr(torch.Tensor, "__dlpack_c_exchange_api__"),
        "git_commit": _git_commit(),
        "device": str(device),
        "fa4": _baseline_info("common.measure.fa4", "fa4_version_info"),
        "flashinfer": _baseline_info("common.measure.flashinfer", "flashinfer_version_info"),
        **_triton_toolchain(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            gpu=props.name,
            sm_count=props.multi_processor_count,
            capability=f"{props.major}.{props.minor}",
            memory_gib=round(props.total_memory / 2**30, 1),
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(),
            driver=_driver_version(),
            clocks_start=gpu_clocks(),
        )
    else:
        info.update(gpu=None, note="CPU run: Triton rungs under the interpreter; timings are not GPU timings")
    return info


def _driver_version() -> str | None:
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    version = done.stdout.strip().splitlines()[0] if done.stdout.strip() else ""
    return version if re.fullmatch(r"\d+(\.\d+)+", version) else None
