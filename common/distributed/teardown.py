"""Leaving a process group so that the interpreter can exit.

A gloo worker thread drops its reference to a finished collective (``all_gather_object``'s byte
tensors among them) after the caller has already been woken. If the caller then destroys the group and
Python starts finalising, that thread's decref of a Python-owned tensor waits for the GIL of a dying
interpreter and aborts the process ("terminate called without an active exception", SIGABRT; seen
with torch 2.11 on CPUs about once in twenty runs, the stack in ``ProcessGroupGloo::runLoop`` →
``~AsyncAllgatherWork``). A barrier first: while the caller waits in it (the GIL released), every
rank's workers finish with the collectives before it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

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
