"""Misbehaving implementations for the isolation tests (imported by name in a child process)."""

from __future__ import annotations

import os
import time

import torch

from common.contract.registry import Implementation

HANG_SECONDS = 600
CRASH_EXIT_CODE = 3


def _hang(q, k, v, problem):
    def run() -> torch.Tensor:
        time.sleep(HANG_SECONDS)
        return q

    return run


def _crash(q, k, v, problem):
    def run() -> torch.Tensor:
        # What a corrupted CUDA context looks like from outside: the process dies mid-call.
        os._exit(CRASH_EXIT_CODE)

    return run


def _always(problem, device):
    return True, ""


HANGS = Implementation("triton/naive", "triton", "naive", prepare=_hang, supports=_always, runs_on_cpu=True)
CRASHES = Implementation("triton/online", "triton", "online", prepare=_crash, supports=_always, runs_on_cpu=True)
