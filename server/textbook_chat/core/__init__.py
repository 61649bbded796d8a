"""The ground floor: what every stage shares and none of them owns.

Takes in the environment (``Settings``) and hands on the error types, what a question is asked about (``Mode``),
structured logging, the Prometheus metrics, token counting and the packaged MiniLM model files. Nothing here imports
a stage above it; every other subpackage may import from here.
"""
