"""What a run leaves behind: plots, report.md, the tradeoff table, the static (sm_90a) analysis and
the README tables. It reads what ``common.measure`` wrote (result rows) and never the other way round.
"""
