"""The reader-facing pages: the book's docs rendered as HTML at ``/docs/...`` (``/`` is its first page), each
with the built chat panel (``frontend/dist``, or the wheel's copy) mounted, and the panel's assets under ``/assets``.

Citation URLs are ``{BOOK_BASE_URL}/docs/{path}#anchor``; when BOOK_BASE_URL is this server, these pages are
where they land. A page is rendered from the blocks ``book/mdx.py`` parses, the ones ``chunking.py`` cuts
citations from, so a heading's id here is the anchor its citations carry; this module keeps no MDX reading of its own.
"""

from __future__ import annotations

import html
import json
import logging
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from textbook_chat.book import chunking, docusaurus
from textbook_chat.book.mdx import Block, parse_blocks
from textbook_chat.book.slugs import Slugger, read_front_matter
from textbook_chat.core import resources
from textbook_chat.core.settings import Settings
from textbook_chat.index.ingest import docs_root

if TYPE_CHECKING:
    from markdown_it import MarkdownIt
    from markdown_it.rules_core import StateCore

log = logging.getLogger(__name__)

DEMO_BOOK = resources.current().demo_book  # the checkout's examples/textbook, or the wheel's copy
DIST_DIR = resources.current().panel  # frontend/dist, or the wheel's copy
ENTRY = "src/main.tsx"  # the Vite entry whose files the manifest names
PANEL_TITLE = "Ask the textbook"

# Content-Security-Policy for the pages: our own scripts only (the panel config is inert JSON), no framing.
_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)


@dataclass(frozen=True)
class Page:
    url: str  # "/docs/ros2/nodes-and-topics"
    file_path: str  # relative to the docs root
    title: str
    module: str
    body_html: str


@dataclass(frozen=True)
class Section:
    id: str
    title: str
    pages: list[Page]


@dataclass(frozen=True)
class RenderedBook:
    title: str
    sections: list[Section]
    pages: dict[str, Page] = field(default_factory=dict)

    @property
    def first(self) -> Page | None:
        return next((p for s in self.sections for p in s.pages), None)

    def neighbours(self, page: Page) -> tuple[Page | None, Page | None]:
        order = [p for s in self.sections for p in s.pages]
        i = order.index(page)
        return (order[i - 1] if i > 0 else None), (order[i + 1] if i + 1 < len(order) else None)


def render_book(path: Path) -> RenderedBook:
    """Every doc of the book at ``path`` (a site folder or its docs folder) as HTML, in sidebar order."""
    root = docs_root(path)
    # Only the structure is wanted here (order, titles, URLs): one huge chunk per section is cheapest.
    book = chunking.read_book(root, base_url="", count_tokens=len, max_tokens=10**9, overlap_tokens=0)
    urls = {d.file_path: d.url for d in book.documents}
    sections: list[Section] = []
    pages: dict[str, Page] = {}
    for module in book.modules:
        docs = [d for d in book.documents if d.module == module.id]
        section = Section(module.id, module.title, [])
        for doc in docs:
            source = (root / doc.file_path).read_text(encoding="utf-8-sig")
            page = Page(doc.url, doc.file_path, doc.chapter, module.id, render_markdown(source, doc.file_path, urls))
            section.pages.append(page)
            pages[doc.url] = page
        sections.append(section)
    first_chapter = book.documents[0].chapter if book.documents else None
    return RenderedBook(docusaurus.book_title(path, first_chapter), sections, pages)


def render_markdown(source: str, file_path: str = "doc.md", doc_urls: dict[str, str] | None = None) -> str:
    """One doc's Markdown/MDX as HTML, from the blocks ``book/mdx.py`` reads (the ones citations come from):
    headings carry their anchors, admonitions become boxes, raw HTML and JSX are not rendered, links to other
    docs' files point at their URLs."""
    _, text = read_front_matter(source.replace("\r\n", "\n").replace("\r", "\n"))
    env: dict[str, Any] = {"file_path": file_path, "doc_urls": doc_urls or {}}
    return _render_blocks(parse_blocks(text, Slugger()), _markdown(), env)


class WebApp:
    """The page handlers; the book is rendered on first use and kept (it does not change while serving)."""

    def __init__(self, book_path: Path, dist_dir: Path, *, api_base: str = "") -> None:
        self.book_path = book_path
        self.dist_dir = dist_dir
        self.api_base = api_base
        self._book: RenderedBook | None = None

    @property
    def book(self) -> RenderedBook:
        if self._book is None:
            self._book = render_book(self.book_path)
        return self._book

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/", self.home, methods=["GET", "HEAD"]),
            Route("/docs", self.home, methods=["GET", "HEAD"]),
            Route("/docs/{path:path}", self.doc, methods=["GET", "HEAD"]),
            # Compressed for browsers that accept it (the panel's bundle: 243 KB -> 77 KB); only these assets,
            # so no API response, and no event stream, ever goes through the compressor.
            Mount(
                "/assets",
                app=GZipMiddleware(StaticFiles(directory=self.dist_dir, check_dir=False), minimum_size=1024),
                name="assets",
            ),
        ]

    async def home(self, request: Request) -> Response:
        page = self.book.first
        if page is None:
            return self._html(_layout(self.book, None, "<p>This book has no pages yet.</p>", self._panel()), 200)
        return self._page(page)

    async def doc(self, request: Request) -> Response:
        path = "/docs/" + request.path_params["path"]
        if path.endswith("/") and path.rstrip("/") in self.book.pages:
            return RedirectResponse(path.rstrip("/"), status_code=308)  # Docusaurus doc URLs have no trailing slash
        page = self.book.pages.get(path)
        if page is None:
            missing = html.escape(path)
            body = f'<h1>Page not found</h1><p>No page at <code>{missing}</code>. <a href="/">Start here</a>.</p>'
            return self._html(_layout(self.book, None, body, self._panel()), 404)
        return self._page(page)

    def _page(self, page: Page) -> Response:
        previous, following = self.book.neighbours(page)
        pager = "".join(
            f'<a class="pager-{rel}" href="{html.escape(p.url)}" rel="{rel}">{label} {html.escape(p.title)}</a>'
            for rel, label, p in (("prev", "←", previous), ("next", "→", following))
            if p is not None
        )
        body = f'<article class="markdown">{page.body_html}</article><nav class="pager">{pager}</nav>'
        return self._html(_layout(self.book, page, body, self._panel()), 200)

    def _panel(self) -> str:
        """The script and style tags of the built panel, or a visible note when it has not been built."""
        manifest = self.dist_dir / "manifest.json"
        try:
            entry = json.loads(manifest.read_text())[ENTRY]
        except (OSError, ValueError, KeyError):
            log.warning("the chat panel is not built (%s missing): run scripts/setup.sh", manifest)
            return (
                '<p class="panel-missing" role="alert">'
                "The chat panel is not built yet: run <code>scripts/setup.sh</code>.</p>"
            )
        config = json.dumps({"apiBase": self.api_base, "title": PANEL_TITLE}).replace("<", "\\u003c")
        styles = "".join(f'<link rel="stylesheet" href="/assets/{html.escape(c)}">' for c in entry.get("css", []))
        return (
            f'{styles}<div id="textbook-chat"></div>'
            f'<script type="application/json" id="textbook-chat-config">{config}</script>'
            f'<script type="module" src="/assets/{html.escape(entry["file"])}"></script>'
        )

    @staticmethod
    def _html(content: str, status: int) -> HTMLResponse:
        headers = {"Content-Security-Policy": _CSP, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}
        return HTMLResponse(content, status_code=status, headers=headers)


def routes(settings: Settings, *, dist_dir: Path = DIST_DIR) -> list[BaseRoute]:
    """The page routes for ``app.py``: the book being served (``--book``), else the demo book."""
    return WebApp(settings.book_path or DEMO_BOOK, dist_dir).routes()


# -- rendering --------------------------------------------------------------------------------------------


def _markdown() -> MarkdownIt:
    from markdown_it import MarkdownIt  # here: a server whose book pages nobody opens never loads it

    md = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable(["table", "strikethrough"])
    md.core.ruler.push("doc_links", _doc_links)
    return md


def _render_blocks(blocks: list[Block], md: MarkdownIt, env: dict[str, Any]) -> str:
    """Headings and admonitions as ``mdx`` found them; each run of other blocks between them is rendered as
    one Markdown text, spaced as the source was, so a list that runs round a code fence stays one list."""
    out: list[str] = []
    run: list[str] = []
    for block in blocks:
        if block.kind not in ("heading", "admonition"):
            run.append(("\n\n" if block.gap else "\n") + block.text if run else block.text)
            continue
        if run:
            out.append(md.render("".join(run), env))
            run = []
        if block.kind == "heading":
            content = md.renderInline(block.text.lstrip("#").strip(), env)
            # Docusaurus gives the h1 no id, but its slug still counted for duplicates (``slugs.Slugger``).
            anchor = f' id="{html.escape(block.anchor)}"' if block.level > 1 else ""
            out.append(f"<h{block.level}{anchor}>{content}</h{block.level}>\n")
        else:
            title = html.escape(block.plain or block.variant.capitalize())
            out.append(f'<div class="admonition admonition-{html.escape(block.variant)}" role="note">')
            out.append(f'<p class="admonition-title">{title}</p>{_render_blocks(block.children, md, env)}</div>')
    if run:
        out.append(md.render("".join(run), env))
    return "".join(out)


def _doc_links(state: StateCore) -> None:
    """``[x](./other.md#y)`` → ``/docs/.../other#y``, as Docusaurus resolves file links."""
    urls: dict[str, str] = state.env["doc_urls"]
    here = posixpath.dirname(state.env["file_path"])
    for token in state.tokens:
        for child in token.children or []:
            href = str(child.attrGet("href") or "")
            if child.type != "link_open" or "://" in href or not re.search(r"\.mdx?(#|$)", href):
                continue
            target, _, anchor = href.partition("#")
            resolved = posixpath.normpath(posixpath.join(here, target)).lstrip("/")
            if resolved in urls:
                child.attrSet("href", urls[resolved] + (f"#{anchor}" if anchor else ""))


def _layout(book: RenderedBook, current: Page | None, body: str, panel: str) -> str:
    nav: list[str] = []
    for section in book.sections:
        links = "".join(
            f'<li><a href="{html.escape(p.url)}"{" aria-current=page" if p is current else ""}>'
            f"{html.escape(p.title)}</a></li>"
            for p in section.pages
        )
        nav.append(f"<li><span class='nav-section'>{html.escape(section.title)}</span><ul>{links}</ul></li>")
    title = f"{current.title} | {book.title}" if current else book.title
    return (
        "<!doctype html>"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'
        f"<title>{html.escape(title)}</title></head><body>"
        f'<header class="site-header"><a class="site-title" href="/">{html.escape(book.title)}</a>'
        '<button type="button" id="theme-toggle" class="theme-toggle" aria-label="Switch between dark and light mode">'
        "◐</button></header>"
        f'<div class="layout"><nav class="sidebar" aria-label="Book"><ul>{"".join(nav)}</ul></nav>'
        f'<main class="doc">{body}</main></div>{panel}</body></html>'
    )
