"""The chat history in Postgres: sessions, messages, citations, feedback, and purging old ones.

Takes in connections from the pool (or an embedded PostgreSQL and its migrations) and hands on ``Store``,
its row types, and the batching ``AnswerWriter`` that writes finished answers off the answer's path.
"""
