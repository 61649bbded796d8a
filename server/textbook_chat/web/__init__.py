"""Speaking HTTP: requests in, JSON, HTML and SSE responses out.

Takes in every stage below through ``Services`` (the long-lived clients opened and closed together) and
hands on the Starlette application: the chat API, the admin reports, the book's pages, health, OpenAPI,
authentication, rate limits and the shutdown drain. The HTTP bodies (``schemas.py``) are read here
and nowhere else.
"""
