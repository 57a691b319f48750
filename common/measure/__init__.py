"""How rungs are run and timed: CUDA timing, peaks, the runner and its isolation, the SDPA and
FA4 baselines, the Triton release table and the environment record.
"""
