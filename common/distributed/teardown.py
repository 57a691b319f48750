"""Leaving a process group so that the interpreter can exit.

A gloo worker thread drops its reference to a finished collective (``all_gather_object``'s byte
tensors among them) after the caller has already been woken. If the caller then destroys the group and
Python starts finalising, that thread's decref of a Python-owned tensor waits for the GIL of a dying
interpreter and aborts the process ("terminate called without an active exception", SIGABRT; seen
with torch 2.11 on CPUs about once in twenty runs, the stack in ``ProcessGroupGloo::runLoop`` →
``~AsyncAllgatherWork``). A barrier first: while the caller waits in it (the GIL released), every
rank's workers finish with the collectives before it.

The barrier narrows the window without closing it: a gloo group has two worker threads, and the one that
ran the last collective may still be in its C++ cleanup, short of the decref, when the barrier (run by
the other) returns. It aborts because Python 3.12 ends a thread that asks for the GIL during finalisation
with ``pthread_exit``, whose unwinding through the work's ``noexcept`` destructor is ``std::terminate``
(the abort was still seen, once in about twenty runs of the two-process CPU test with torch 2.11). A
command-line tool run by torchrun therefore leaves through :func:`exit_without_finalising`: its output is
written, flushed and closed, and the process ends without the finalisation that a late worker thread
would trip over.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import torch.distributed as dist


@contextmanager
def leaving_process_group(group: dist.ProcessGroup | None = None) -> Iterator[None]:
    """Runs the body, then destroys the process group: after a barrier on ``group`` (default: the
    world) when the body finished, at once when it raised (another rank may never reach a barrier)."""
    try:
        yield
    except BaseException:
        dist.destroy_process_group()
        raise
    try:
        dist.barrier(group=group)
    finally:
        dist.destroy_process_group()


def exit_without_finalising(status: int) -> NoReturn:
    """End a distributed tool's process with ``status`` after flushing stdout and stderr, skipping the
    interpreter's finalisation (see the module docstring): for a ``__main__`` after its process group
    is left, never for code that a caller imports and continues after."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
