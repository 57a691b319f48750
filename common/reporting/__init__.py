"""What a run leaves behind: results.csv rows, plots, report.md, the tradeoff table, the static
(sm_90a) analysis and the README tables.
"""
