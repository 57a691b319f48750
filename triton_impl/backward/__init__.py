"""Triton backward ladder: one rung per file, named like the forward rung it mirrors.

``naive`` materialises P and dS in HBM, five launches, the definition; ``tiled`` is the FlashAttention-2
backward (recompute P per KV block, dK and dV in registers, dQ by a separate pass or by fp32 atomics,
Q/K/V/dO tiles by TMA on Hopper). Each module defines a
``BACKWARD`` (``common.contract.registry.Backward``) that forward rungs name as their ``backward``.
"""
