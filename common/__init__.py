"""Everything that is not a kernel: problem, inputs, references, metrics, timing, registry, reports.

The layer order, lowest first. A module imports from its own layer and the layers below it, never from
one above (``tests/test_layers.py`` reads every file's imports and holds the tree to :data:`LAYERS`):

1. ``common.toolchain``: the sm_90 constants and capability check, compiling for sm_90a, the Triton
   release table. It imports nothing else from the project.
2. ``common.contract``: the problem, inputs, references, error rules, validation, the registry and the
   user's entry point (``common.attention``, re-exported here). The registry loads the rungs by name,
   never by import; the baselines it loads only for a baseline's name.
3. ``triton_impl``, ``cute_impl``: the rungs, one per file, and the kernels they share: the fused FP8
   quantiser (``triton_impl.fp8_quantiser``, a Triton kernel that the Gluon and CuTe FP8 rungs run too).
4. ``common.distributed``, ``common.integrations``: attention across GPUs, attention inside other libraries.
5. ``common.measure``: timing, the benchmark baselines (SDPA, FA4, FlashInfer), result rows.
6. ``common.reporting``: tables, plots, reports and static analysis of what was measured or compiled.
7. ``common.tools``, ``compare.py``, ``bench/``: the command-line tools.
"""

from common.contract.api import attention, clear_plan_cache, plan_cache_info

# The layer order above as module prefixes, lowest first.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("common.toolchain",),
    ("common.contract",),
    ("triton_impl", "cute_impl"),
    ("common.distributed", "common.integrations"),
    ("common.measure",),
    ("common.reporting",),
    ("common.tools", "compare", "bench"),
)

__all__ = ["LAYERS", "attention", "clear_plan_cache", "plan_cache_info"]
