"""Building and querying the index: chunks in, dense and sparse vectors in Qdrant out.

Takes in the book stage's chunks and hands on a ``VectorIndex`` (the embedded Qdrant Edge shard or a Qdrant
server behind one interface), the ``Embedder`` that turns text into vectors, the keyword (sparse) terms,
and incremental ingest that keeps the index in line with the book.
"""
