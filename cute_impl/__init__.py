"""CuTe DSL FlashAttention-forward ladder: one rung per file."""
