"""CuTe DSL backward ladder: one rung per file, named like the forward rung it mirrors.

``naive`` materialises P and dS in HBM, five SIMT launches, the definition; ``tiled`` is the
FlashAttention-2 backward on ``mma.sync`` tensor cores (recompute P per key block, dK and dV in
registers, dQ by a separate pass); ``hopper`` is the same algorithm on sm_90a's TMA, WGMMA and a
producer warp (the backward of ``cute/hopper``). Each module defines a ``BACKWARD``
(``common.contract.registry.Backward``) that forward rungs name as their ``backward``; the Triton
counterparts live in ``triton_impl/backward/``.
"""
