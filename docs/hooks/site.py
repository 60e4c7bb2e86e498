"""mkdocs hooks of the documentation site (mkdocs.yml lists them).

The home page is the repository's README.md, with its links made relative
to docs/. The site holds only docs/, so a link from a page to a file of the
repository outside docs/ (an example script) becomes its link text. A link
to a file that exists nowhere is left as written, for mkdocs to report.
"""

from __future__ import annotations

import pathlib
import re

from mkdocs.structure.files import File

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

# A markdown link or image: [text](target); fenced code is skipped.
LINK = re.compile(r"(!?)\[([^\]\n]*)\]\(([^)\s]+)\)")
FENCE = re.compile(r"(^```.*?^```)", re.M | re.S)


def _relative(target: str) -> bool:
    return not re.match(r"[a-z][a-z0-9+.-]*:|#|/", target)


def _outside_prose(text: str, replace) -> str:
    """``text`` with ``replace`` applied to each link outside fenced code."""
    parts = FENCE.split(text)
    return "".join(
        part if i % 2 else LINK.sub(replace, part) for i, part in enumerate(parts)
    )


def _home(readme: str) -> str:
    """README.md as a page of docs/: links into docs/ lose the prefix; other
    links to the repository climb out of docs/."""

    def relink(match: re.Match) -> str:
        bang, text, target = match.groups()
        if not _relative(target):
            return match.group(0)
        target = target[len("docs/"):] if target.startswith("docs/") else "../" + target
        return f"{bang}[{text}]({target})"

    return _outside_prose(readme, relink)


def on_files(files, config):
    files.append(File.generated(config, "index.md", content=_home((ROOT / "README.md").read_text())))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    here = (DOCS / page.file.src_uri).parent

    def unlink(match: re.Match) -> str:
        bang, text, target = match.groups()
        if bang or not _relative(target):
            return match.group(0)
        path = (here / target.split("#")[0]).resolve()
        if path.is_relative_to(DOCS) or not path.exists():
            return match.group(0)
        return text

    return _outside_prose(markdown, unlink)
