"""How rungs are run and timed: CUDA timing, peaks, the runner and its isolation, the result rows
(results.csv) and the end-to-end column, the SDPA, FA4 and FlashInfer baselines and the environment
record. Nothing here imports ``common.reporting``.
"""
