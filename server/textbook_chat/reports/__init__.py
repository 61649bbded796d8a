"""Reports on what readers asked: stored questions in, topics and gaps in the book out.

Takes in the search stage (retrieval and the embedder) and hands on a ``Report`` of questions grouped by
topic with how well the book covered each, and its HTML and JSON views.
"""
