"""Streaming one answer's events: published events in, Server-Sent Events out, on any worker.

Takes in the events a generation publishes and hands on ``MessageStream`` and its registry, the Redis
relay that mirrors them to other workers, replay of finished answers from Postgres, and the signed
capabilities that let a holder of ``stream_url`` read or stop a stream.
"""
