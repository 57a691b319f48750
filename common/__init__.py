"""Everything that is not a kernel: problem, inputs, references, metrics, timing, registry, reports."""

from common.contract.api import attention, clear_plan_cache, plan_cache_info

__all__ = ["attention", "clear_plan_cache", "plan_cache_info"]
