"""Everything that is not a kernel: problem, inputs, references, metrics, timing, registry, reports."""

from common.api import attention

__all__ = ["attention"]
