"""What a rung computes and how it is judged: the problem, inputs, references, error rules,
the FP8 contract, the registry and the public API.
"""
