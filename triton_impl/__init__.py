"""Triton FlashAttention-forward ladder: one rung per file."""
