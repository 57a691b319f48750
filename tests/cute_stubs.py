"""Stand-ins for the CuTe rungs' bind, shared by their test files: prepare() validates CPU tensors and
stops where it would bind, so the host checks run without a GPU (imported by the files that need the
CuTe DSL): ``never_bind`` for any rung, ``stop_at_bind`` for cute/decode (it records bind's keywords)."""

from __future__ import annotations

import functools

import pytest

from cute_impl import _host, decode


class BindReachedError(Exception):
    """Raised by the stand-in ``bind``: validation let the problem through."""


def never_bind(*args: object, **kwargs: object) -> None:
    """A rung's ``bind`` replaced by a loud failure: a prepare that refuses must do so before binding."""
    raise BindReachedError


def stop_at_bind(monkeypatch: pytest.MonkeyPatch) -> dict:
    """cute/decode's prepare() validates CPU tensors and stops at bind; returns bind's keywords once reached."""
    validate = functools.partial(_host.validate_for_problem, device_types=("cpu",))
    monkeypatch.setattr(_host, "validate_for_problem", validate)
    seen: dict = {}

    def never_bind(*args: object, **kwargs: object) -> None:
        seen.update(kwargs)
        raise BindReachedError

    monkeypatch.setattr(decode.HOST, "bind", never_bind)
    return seen
