"""Textbook Chat: streaming, grounded question answering over a Docusaurus textbook."""

__version__ = "0.1.0"
