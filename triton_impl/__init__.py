"""Triton FlashAttention-forward ladder: one rung per file, and the fused FP8 quantiser
(``fp8_quantiser``) that the FP8 rungs of all three stacks run before their kernels."""
