"""Command-line studies and checks: ``python -m common.tools.fuzz``, ``common.tools.sanitize``,
``common.tools.fp8_error``.
"""
