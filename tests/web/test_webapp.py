"""The reader-facing pages: the book rendered at /docs/... with citation anchors, the panel's assets, the demo page."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette

from tests.conftest import DEMO_BOOK, SHARED_BOOK
from textbook_chat.book import chunking
from textbook_chat.core.settings import Settings
from textbook_chat.index.ingest import docs_root
from textbook_chat.web import webapp
from textbook_chat.web.app import create_app


def fake_dist(tmp_path: Path) -> Path:
    """A built frontend as Vite leaves it: hashed files and the manifest naming them."""
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "main-abc123.js").write_text("console.log('panel')")
    (dist / "main-def456.css").write_text(".tc-root{}")
    manifest = {webapp.ENTRY: {"file": "main-abc123.js", "isEntry": True, "css": ["main-def456.css"]}}
    (dist / "manifest.json").write_text(json.dumps(manifest))
    return dist


def client_for(app: webapp.WebApp) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(Starlette(routes=app.routes())), base_url="http://book")


def ids(page_html: str) -> set[str]:
    return set(re.findall(r'\bid="([^"]+)"', page_html))


def citation_targets(book_path: Path) -> list[chunking.Chunk]:
    root = docs_root(book_path)
    return chunking.read_book(root, base_url="", count_tokens=len, max_tokens=300, overlap_tokens=0).chunks


async def test_every_citation_url_of_the_demo_book_lands_on_a_page_with_that_anchor(tmp_path: Path) -> None:
    chunks = citation_targets(DEMO_BOOK)
    async with client_for(webapp.WebApp(DEMO_BOOK, fake_dist(tmp_path))) as client:
        pages: dict[str, str] = {}
        for chunk in chunks:
            if chunk.doc_url not in pages:
                response = await client.get(chunk.doc_url)
                assert response.status_code == 200, chunk.doc_url
                pages[chunk.doc_url] = response.text
            assert not chunk.anchor or chunk.anchor in ids(pages[chunk.doc_url]), chunk.url
    assert len(pages) == 9 and len(chunks) > 50


@pytest.mark.slow
def test_every_citation_anchor_of_the_shared_real_book_exists_on_its_rendered_page() -> None:
    book = webapp.render_book(SHARED_BOOK)
    missing = [
        c.url
        for c in citation_targets(SHARED_BOOK)
        if c.anchor and c.anchor not in ids(book.pages[c.doc_url].body_html)
    ]
    assert missing == []
    assert len(book.pages) > 40


async def test_the_demo_page_is_the_first_page_of_the_book_with_the_built_panel(tmp_path: Path) -> None:
    async with client_for(webapp.WebApp(DEMO_BOOK, fake_dist(tmp_path))) as client:
        response = await client.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert "<h1>Welcome to Physical AI &amp; Humanoid Robotics</h1>" in response.text
    assert '<script type="module" src="/assets/main-abc123.js"></script>' in response.text
    assert '<link rel="stylesheet" href="/assets/main-def456.css">' in response.text
    assert "script-src 'self'" in response.headers["content-security-policy"]
    # The sidebar lists every module's chapters in sidebar order.
    sidebar = response.text.split('<nav class="sidebar"', 1)[1].split("</nav>", 1)[0]
    assert sidebar.index("Module 1: Foundations") < sidebar.index("Module 2: ROS 2") < sidebar.index("Module 3")
    assert 'href="/docs/ros2/nodes-and-topics"' in sidebar


async def test_built_assets_are_served_and_unknown_ones_are_404(tmp_path: Path) -> None:
    async with client_for(webapp.WebApp(DEMO_BOOK, fake_dist(tmp_path))) as client:
        script = await client.get("/assets/main-abc123.js")
        missing = await client.get("/assets/nope.js")
    assert script.status_code == 200 and script.text == "console.log('panel')"
    assert "javascript" in script.headers["content-type"]
    assert missing.status_code == 404


async def test_the_panels_bundle_is_sent_compressed_to_browsers_that_accept_it(tmp_path: Path) -> None:
    dist = fake_dist(tmp_path)
    (dist / "main-abc123.js").write_text("console.log('panel');\n" * 500)
    async with client_for(webapp.WebApp(DEMO_BOOK, dist)) as client:
        compressed = await client.get("/assets/main-abc123.js", headers={"Accept-Encoding": "gzip"})
        plain = await client.get("/assets/main-abc123.js", headers={"Accept-Encoding": "identity"})
    assert compressed.headers["content-encoding"] == "gzip" and int(compressed.headers["content-length"]) < 2000
    assert compressed.text == plain.text and "content-encoding" not in plain.headers


async def test_pages_still_render_with_a_visible_note_when_the_panel_is_not_built(tmp_path: Path) -> None:
    async with client_for(webapp.WebApp(DEMO_BOOK, tmp_path / "no-dist")) as client:
        response = await client.get("/docs/foundations/kinematics-and-balance")
    assert response.status_code == 200
    assert "The chat panel is not built yet" in response.text
    assert "<script" not in response.text


async def test_an_unknown_page_is_a_404_page_and_a_trailing_slash_redirects(tmp_path: Path) -> None:
    async with client_for(webapp.WebApp(DEMO_BOOK, fake_dist(tmp_path))) as client:
        missing = await client.get("/docs/no/<b>such</b>")
        slash = await client.get("/docs/intro/")
    assert missing.status_code == 404 and "Page not found" in missing.text
    assert "<code>/docs/no/&lt;b&gt;such&lt;/b&gt;</code>" in missing.text  # the path is escaped where it is shown
    assert slash.status_code == 308 and slash.headers["location"] == "/docs/intro"


async def test_the_panel_config_cannot_break_out_of_its_script_tag(tmp_path: Path) -> None:
    app = webapp.WebApp(DEMO_BOOK, fake_dist(tmp_path), api_base="https://x/</script><script>alert(1)</script>")
    async with client_for(app) as client:
        page = (await client.get("/")).text
    config = page.split('id="textbook-chat-config">', 1)[1].split("</script>", 1)[0]
    assert json.loads(config)["apiBase"] == "https://x/</script><script>alert(1)</script>"


def test_headings_get_docusaurus_ids_with_duplicates_numbered_and_explicit_ids_removed_from_the_text() -> None:
    out = webapp.render_markdown(
        "# Intro\n\n## Intro\n\n## Gazebo & Unity\n\n## Setup {#custom-id}\n\n## `rclpy.spin()`\n"
    )
    assert "<h1>Intro</h1>" in out
    assert '<h2 id="intro-1">Intro</h2>' in out
    assert '<h2 id="gazebo--unity">Gazebo &amp; Unity</h2>' in out
    assert '<h2 id="custom-id">Setup</h2>' in out
    assert '<h2 id="rclpyspin"><code>rclpy.spin()</code></h2>' in out


def test_admonitions_in_both_syntaxes_become_boxes_and_mdx_imports_disappear() -> None:
    source = (
        "---\ntitle: T\n---\nimport Admonition from '@theme/Admonition';\n\n"
        ":::warning Mind the gap\nKeep **clear**.\n:::\n\n"
        '<Admonition type="info" title="Xacro">\nUse macros.\n</Admonition>\n'
    )
    out = webapp.render_markdown(source)
    assert "import" not in out and "title: T" not in out
    assert '<div class="admonition admonition-warning" role="note"><p class="admonition-title">Mind the gap</p>' in out
    assert "<strong>clear</strong>" in out
    assert '<div class="admonition admonition-info" role="note"><p class="admonition-title">Xacro</p>' in out
    assert "<p>Use macros.</p>" in out


def test_code_fences_stay_verbatim_even_when_they_hold_imports_headings_or_tags() -> None:
    out = webapp.render_markdown("```python\nimport rclpy\n# not a heading\n<Tag/>\n:::\n```\n")
    assert "import rclpy\n# not a heading\n&lt;Tag/&gt;\n:::\n" in out
    assert "<h1" not in out


def test_html_and_jsx_tags_in_a_page_are_never_rendered_their_text_stays() -> None:
    out = webapp.render_markdown('Hello <span onclick="x()">there</span>, <script>alert(1)</script> and 1 <2')
    assert "<span" not in out and "onclick" not in out and "<script" not in out
    assert "Hello there" in out and "1 &lt;2" in out


def test_a_list_that_runs_round_a_code_fence_stays_one_list() -> None:
    out = webapp.render_markdown("1. Build:\n\n   ```bash\n   colcon build\n   ```\n\n2. Run it.\n")
    assert out.count("<ol>") == 1 and '<pre><code class="language-bash">colcon build' in out


def test_nested_admonitions_and_the_bracket_title_render_as_boxes_with_their_headings_ids() -> None:
    out = webapp.render_markdown("::::tip[Outer]\n### Inside\n:::danger\nHot.\n:::\n::::\n\n## Inside\n")
    assert '<div class="admonition admonition-tip" role="note"><p class="admonition-title">Outer</p>' in out
    assert '<h3 id="inside">Inside</h3>' in out and '<h2 id="inside-1">Inside</h2>' in out
    assert '<p class="admonition-title">Danger</p><p>Hot.</p>\n</div></div>' in out


def test_links_to_other_docs_files_point_at_their_urls() -> None:
    urls = {"02-ros2/02-services-and-actions.md": "/docs/ros2/services-and-actions"}
    out = webapp.render_markdown(
        "See [actions](./02-services-and-actions.md#goals) and [web](https://ros.org/x.md).",
        "02-ros2/01-nodes-and-topics.md",
        urls,
    )
    assert 'href="/docs/ros2/services-and-actions#goals"' in out
    assert 'href="https://ros.org/x.md"' in out


@pytest.mark.parametrize(
    ("path", "text"), [("/", "Who This Book Is For"), ("/docs/ros2/launch-urdf-tf2", "Xacro keeps legs symmetric")]
)
async def test_the_server_app_serves_the_demo_book_pages(path: str, text: str, settings: Settings) -> None:
    app = create_app(settings)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://book") as client:
        response = await client.get(path)
    assert response.status_code == 200
    assert text in response.text
