"""The documentation site: built strictly, it asks no other site for anything; every page of
docs/ is in the nav (or excluded), and the README links only to what exists.

`.ci/run` builds the site (`mkdocs build --strict`) before pytest and names it in
DULY_BUILT_SITE; without it the first test that needs the site builds one.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest
from mkdocs.config import load_config

from engine import settings as variables
from tests.docs_examples import DOCS, REPO_ROOT, nav_pages

BUILD_TIMEOUT = 300  # seconds for mkdocs build
FETCHED_FILES = (".html", ".css", ".js")  # what a browser reads from the built site
# Hosts a page would fetch fonts, scripts or styles from.
OFF_SITE_HOSTS = re.compile(
    r"fonts\.googleapis\.com|fonts\.gstatic\.com|unpkg\.com|\bcdn[\w-]*\.[\w.-]+|jsdelivr"
)
OFF_SITE_URL = re.compile(r"^\s*(?:[a-z][\w+.-]*:)?//", re.IGNORECASE)  # http://, https://, //
CSS_URL = re.compile(r"""(?:url\(|@import)\s*['"]?\s*((?:[a-z][\w+.-]*:)?//[^'")\s]+)""", re.I)
# Material's bundle names two scripts it would load from unpkg, neither on this site: the
# polyfill only in a browser without ResizeObserver (every browser has had it since 2020),
# mermaid only on a page with a mermaid diagram (none has one: a test checks).
MATERIAL_LAZY_LOADS = {
    "https://unpkg.com/resize-observer-polyfill",
    "https://unpkg.com/mermaid@11/dist/mermaid.min.js",
}
MATERIAL_BUNDLE = re.compile(r"assets/javascripts/bundle\.[0-9a-f]+\.min\.js")
# Attributes whose URL a browser fetches as it renders the page (an <a href> it does not).
FETCHED_ATTRIBUTES = {
    ("script", "src"),
    ("link", "href"),
    ("img", "src"),
    ("img", "srcset"),
    ("source", "src"),
    ("source", "srcset"),
    ("iframe", "src"),
    ("video", "src"),
    ("audio", "src"),
    ("embed", "src"),
    ("object", "data"),
}
NOT_FETCHED_LINKS = {"canonical", "alternate", "prev", "next", "author", "license", "me"}
MARKDOWN_LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_LINK = re.compile(r"""\b(?:href|src)\s*=\s*["']([^"']+)["']""")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built site: DULY_BUILT_SITE's, else one built now, strictly."""
    given = variables.BUILT_SITE.read()
    if given:
        return Path(given)
    built = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(built)],
        cwd=REPO_ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}{done.stderr}"
    return built


class FetchedUrls(HTMLParser):
    """The URLs a page's tags make a browser fetch, and the text of its inline styles and
    scripts, which are read like the site's CSS and JS files."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[tuple[str, str]] = []  # (tag, url)
        self.inline: list[str] = []
        self.mermaid = False
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if "mermaid" in (found.get("class") or "").split():
            self.mermaid = True
        rel = set((found.get("rel") or "").lower().split())
        for name, value in attrs:
            if (tag, name) not in FETCHED_ATTRIBUTES or not value:
                continue
            if tag == "link" and rel and rel <= NOT_FETCHED_LINKS:
                continue
            urls = value.split(",") if name == "srcset" else [value]  # "a.png 2x, b.png 1x"
            self.urls.extend((tag, url.split()[0]) for url in urls if url.strip())
        if found.get("style"):
            self.inline.append(found["style"] or "")
        self._in = tag if tag in ("script", "style") else None

    def handle_endtag(self, tag: str) -> None:
        self._in = None

    def handle_data(self, data: str) -> None:
        if self._in is not None:
            self.inline.append(data)


def off_site_references(site: Path) -> list[str]:
    """Each thing a built page, stylesheet or script would fetch from another site."""
    found: list[str] = []
    for path in sorted(site.rglob("*")):
        if path.suffix not in FETCHED_FILES:
            continue
        name = path.relative_to(site).as_posix()
        text = path.read_text(errors="replace")
        read_as_code = [text]
        if path.suffix == ".html":
            page = FetchedUrls()
            page.feed(text)
            found += [f"{name}: <{tag}> {url}" for tag, url in page.urls if OFF_SITE_URL.match(url)]
            found += [f"{name}: a mermaid diagram (its script comes from unpkg)"] * page.mermaid
            read_as_code = page.inline
        allowed = MATERIAL_LAZY_LOADS if MATERIAL_BUNDLE.fullmatch(name) else set()
        for code in read_as_code:
            found += [f"{name}: CSS fetches {url}" for url in CSS_URL.findall(code)]
            for allowed_url in allowed:
                code = code.replace(allowed_url, "")
            found += [f"{name}: names {m[0]}" for m in OFF_SITE_HOSTS.finditer(code)]
    return found


def test_the_built_site_fetches_nothing_from_another_site(site: Path) -> None:
    assert (site / "index.html").is_file()
    assert off_site_references(site) == []


def test_the_check_finds_what_it_looks_for(tmp_path: Path) -> None:
    """Each kind of off-site fetch, in a made-up site (so an empty report means something)."""
    (tmp_path / "assets").mkdir()
    (tmp_path / "index.html").write_text(
        '<html><head><link rel="stylesheet" href="https://cdn.example/x.css">'
        '<link rel="preconnect" href="https://fonts.gstatic.com">'
        '<link rel="canonical" href="https://duly.example/">'
        '<script src="//unpkg.com/lib.js"></script>'
        "<style>@import url('https://fonts.googleapis.com/css?family=Roboto');</style>"
        '</head><body><a href="https://unpkg.com/a-link-is-fine">a link</a>'
        '<p>Text may name fonts.gstatic.com.</p><div class="mermaid">graph</div>'
        '<script src="assets/local.js"></script></body></html>'
    )
    (tmp_path / "assets" / "local.js").write_text(
        'load("https://unpkg.com/resize-observer-polyfill");fetch("https://cdn.jsdelivr.net/x")'
    )
    (tmp_path / "assets" / "site.css").write_text("@font-face{src:url(https://x.example/f.woff2)}")
    assert off_site_references(tmp_path) == [
        "assets/local.js: names unpkg.com",
        "assets/local.js: names cdn.jsdelivr.net",
        "assets/site.css: CSS fetches https://x.example/f.woff2",
        "index.html: <link> https://cdn.example/x.css",
        "index.html: <link> https://fonts.gstatic.com",
        "index.html: <script> //unpkg.com/lib.js",
        "index.html: a mermaid diagram (its script comes from unpkg)",
        "index.html: CSS fetches https://fonts.googleapis.com/css?family=Roboto",
        "index.html: names fonts.googleapis.com",
    ]


def docs_pages() -> Iterator[str]:
    """Every Markdown page under docs/, relative to it."""
    for path in sorted(DOCS.rglob("*.md")):
        yield path.relative_to(DOCS).as_posix()


def test_every_page_of_docs_is_in_the_nav_or_excluded() -> None:
    config = load_config(str(REPO_ROOT / "mkdocs.yml"))
    listed = set(nav_pages(REPO_ROOT / "mkdocs.yml"))
    excluded, not_in_nav = config.exclude_docs, config.not_in_nav  # gitignore-like, or None
    left_out = [
        page
        for page in docs_pages()
        if page not in listed
        and not any(spec and spec.match_file(page) for spec in (excluded, not_in_nav))
    ]
    assert left_out == [], "add these pages to mkdocs.yml's nav, or exclude them"


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def github_anchors(headings: list[str]) -> set[str]:
    """The anchors of a page's headings; a repeated one gets `-1`, `-2`, ... as on GitHub."""
    found: set[str] = set()
    for heading in headings:
        anchor, count = github_anchor(heading), 0
        while (anchor if count == 0 else f"{anchor}-{count}") in found:
            count += 1
        found.add(anchor if count == 0 else f"{anchor}-{count}")
    return found


def test_readme_anchors_are_githubs() -> None:
    headings = ["Settings", "`duly init` and --wheel", "Missed firings, failed firings", "Settings"]
    assert github_anchors(headings) == {
        "settings",
        "duly-init-and---wheel",
        "missed-firings-failed-firings",
        "settings-1",
    }


def broken_links(readme: str, root: Path) -> list[str]:
    """The README's relative links to a file that does not exist or to a heading it lacks."""
    prose = re.sub(r"^```.*?^```", "", readme, flags=re.MULTILINE | re.DOTALL)
    anchors = github_anchors(re.findall(r"^#+\s+(.+)$", prose, re.MULTILINE))
    broken = []
    for target in MARKDOWN_LINK.findall(prose) + HTML_LINK.findall(prose):
        if re.match(r"^[a-z][\w+.-]*:", target, re.IGNORECASE):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        if not path and anchor not in anchors:
            broken.append(f"{target}: no heading of the README has that anchor")
        elif path and not (root / path).exists():
            broken.append(f"{target}: no such file")
    return broken


def test_the_readme_links_only_to_pages_that_exist() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    assert MARKDOWN_LINK.search(readme), "the README links to nothing: the check sees nothing"
    assert broken_links(readme, REPO_ROOT) == []


def test_the_link_check_finds_what_it_looks_for(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n")
    readme = (
        "# duly\n\n## Start here\n\nRead [the docs](docs/index.md), [the guide](docs/guide.md),\n"
        "[start](#start-here), [nowhere](#nowhere), [a site](https://example.com/x.md) and\n"
        '<img src="docs/shot.png">.\n\n```md\n[in code](docs/ignored.md)\n```\n'
    )
    assert broken_links(readme, tmp_path) == [
        "docs/guide.md: no such file",
        "#nowhere: no heading of the README has that anchor",
        "docs/shot.png: no such file",
    ]
