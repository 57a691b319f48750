"""The sanitizer sweep's verdicts: device errors fail, host API probe failures are reported, not fatal."""

from __future__ import annotations

from common.tools.sanitize import SANITIZER_ERROR_EXIT, _verdict

HOST_ONLY = "\n".join(
    [
        '========= Program hit CUDA_ERROR_INVALID_VALUE (error 1) due to "invalid argument" '
        "on CUDA API call to cuGetProcAddress_v2.",
        "=========     Saved host backtrace up to driver entry point at error",
        "========= ERROR SUMMARY: 34 errors",
    ]
)
DEVICE = """========= Invalid __global__ write of size 2 bytes
=========     at attention_kernel+0x1a0
========= ERROR SUMMARY: 1 error"""


def test_host_api_failures_alone_are_clean_but_named():
    verdict, detail = _verdict(SANITIZER_ERROR_EXIT, HOST_ONLY)
    assert verdict == "clean"
    assert "cuGetProcAddress_v2" in detail and "34 errors" in detail


def test_device_memory_errors_fail():
    verdict, detail = _verdict(SANITIZER_ERROR_EXIT, DEVICE)
    assert verdict == "errors" and "Invalid __global__ write" in detail


def test_a_crash_without_a_summary_is_not_clean():
    verdict, _ = _verdict(-11, "Segmentation fault")
    assert verdict == "exit -11"
