"""Reading the book: a Docusaurus folder of Markdown/MDX pages in, chunks out.

Takes in the book's folder (front matter, slugs, sidebar positions, MDX blocks) and hands on ``Doc``s,
their sections and the ``Chunk``s (heading path, text, URL) that the index stage embeds.
"""
