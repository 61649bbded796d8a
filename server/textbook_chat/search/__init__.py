"""Searching the index: a question in, ranked sources with a calibrated confidence out.

Takes in the index stage's ``VectorIndex`` and ``Embedder`` and hands on a ``Retrieval`` (sources, scope,
confidence level, notices), the per-embedder calibration of confidence, offline evaluation, and the
watcher that re-ingests and re-calibrates when the book changes.
"""
