"""Answering: a question and its sources in, a stream of generated tokens out.

Takes in the search stage's sources and the conversation so far, builds the prompt within its token
budgets, and hands on a ``Generator`` (the OpenAI-compatible model, or the offline fallback that quotes
the book) plus the FAQ answers used when search is down.
"""
