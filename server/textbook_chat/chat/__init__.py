"""One exchange, end to end: a ``Question`` (question.py) in, a running answer and its stored record out.

Takes in the search, answer, store and streams stages and hands on ``ChatService``: the bookkeeping of a
session and its exchange (repeats, budgets, the stored question), the run of one answer from retrieval to
the persisted reply, and every way of reading a message's events back.
"""
