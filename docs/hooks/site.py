"""mkdocs hooks of the documentation site (mkdocs.yml lists them).

The home page is the repository's README.md, with its links made relative
to docs/. Each example script, examples/<name>.py, becomes a page,
examples/<name>.md (and examples/index.md lists them): how to run it, what
it printed in the latest benchmark run that recorded it (the ``apps`` suite
keeps each example's output in docs/benchmarks/*.json; the build runs no
example), and its source. A link from a page to an example script leads to
its page, and one to the folder examples/ to their list. The site holds
only docs/, so a link to another file of the repository outside docs/
becomes its link text. A link to a file that exists nowhere is left as
written, for mkdocs to report.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import pathlib
import posixpath
import re
import subprocess

from mkdocs.structure.files import File

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
EXAMPLES = ROOT / "examples"
BENCHMARKS = DOCS / "benchmarks"

# A markdown link or image, [text](target), its text over one line or more;
# or a code span, which holds no link (`kernel[grid, block](...)`). Fenced
# code is skipped.
LINK = re.compile(r"(?P<code>(?P<ticks>`+)(?:(?!\n\s*\n).)+?(?<!`)(?P=ticks)(?!`))"
                  r"|(?P<bang>!?)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)\)", re.S)
FENCE = re.compile(r"(^(`{3,}).*?^\2)", re.M | re.S)
# What the apps suite records of an example: a header line, then its stdout.
RECORDED = re.compile(r"\Aexamples/(?P<name>\w+)\.py \(exit (?P<rc>-?\d+), [^)]*\):\n")
# A command in a docstring's "Run" paragraph.
COMMAND = re.compile(r"^\s*(?:Run:\s*)?(?P<command>(?:python|torchrun|mpirun)\s.*?)(?:\s{2,}\(.*\))?\s*$")


def _relative(target: str) -> bool:
    return not re.match(r"[a-z][a-z0-9+.-]*:|#|/", target)


def _outside_prose(text: str, replace) -> str:
    """``text`` with ``replace(match, text, target)`` applied to each link
    outside code (``bang`` is ``"!"`` for an image)."""

    def each(match: re.Match) -> str:
        if match["code"] is not None:
            return match.group(0)
        return replace(match, match["bang"], match["text"], match["target"])

    parts = FENCE.split(text)
    # re.split yields, per fence, the whole block and its backticks.
    out, i = [], 0
    while i < len(parts):
        out.append(LINK.sub(each, parts[i]))
        if i + 1 < len(parts):
            out.append(parts[i + 1])
        i += 3
    return "".join(out)


def _home(readme: str) -> str:
    """README.md as a page of docs/: links into docs/ lose the prefix; other
    links to the repository climb out of docs/."""

    def relink(match: re.Match, bang: str, text: str, target: str) -> str:
        if not _relative(target):
            return match.group(0)
        target = target[len("docs/"):] if target.startswith("docs/") else "../" + target
        return f"{bang}[{text}]({target})"

    return _outside_prose(readme, relink)


@dataclasses.dataclass
class Recorded:
    """An example's output as a benchmark run recorded it."""

    output: str
    results: pathlib.Path        # the run's JSON in docs/benchmarks
    environment: dict


def _committed(path: pathlib.Path) -> float:
    """When ``path`` was last committed; a file git does not know (written
    since) counts as newest, and without git its modification time is used."""
    try:
        done = subprocess.run(["git", "log", "-1", "--format=%ct", "--", path.name],
                              cwd=path.parent, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return path.stat().st_mtime
    if done.returncode != 0:
        return path.stat().st_mtime
    return float(done.stdout.strip() or "inf")


def _recorded() -> dict[str, Recorded]:
    """Each example's output in the newest benchmark run that recorded it
    (exit status 0)."""
    found: dict[str, Recorded] = {}
    for results in sorted(BENCHMARKS.glob("*.json"), key=lambda p: (_committed(p), p.name)):
        data = json.loads(results.read_text())
        apps = data.get("suites", {}).get("apps") or {}
        for note in apps.get("notes", []):
            header = RECORDED.match(note)
            if header is not None and header["rc"] == "0":
                found[header["name"]] = Recorded(note[header.end():].rstrip("\n"), results,
                                                 data.get("environment", {}))
    return found


def _fence(text: str, info: str) -> str:
    """``text`` in a fenced block longer than any run of backticks in it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{info}\n{text.rstrip()}\n{ticks}\n"


def _machine(environment: dict) -> str:
    gpu = environment.get("gpu") or {}
    name = gpu.get("name") or "a GPU"
    details = [f"driver {gpu['driver_version']}" if gpu.get("driver_version") else "",
               f"CUDA {gpu['cuda_driver_api']}" if gpu.get("cuda_driver_api") else ""]
    details = [d for d in details if d]
    return f"{name} ({', '.join(details)})" if details else name


@dataclasses.dataclass
class Example:
    name: str
    source: str

    @property
    def script(self) -> str:
        return f"examples/{self.name}.py"

    @property
    def page(self) -> str:
        return f"examples/{self.name}.md"

    @property
    def docstring(self) -> str:
        return ast.get_docstring(ast.parse(self.source)) or ""

    @property
    def summary(self) -> str:
        return self.docstring.split("\n\n")[0].replace("\n", " ").strip() or self.script

    def commands(self) -> list[str]:
        found = [m["command"] for line in self.docstring.splitlines()
                 if (m := COMMAND.match(line)) and self.script in line]
        return found or [f"python {self.script}"]

    def markdown(self, recorded: Recorded | None) -> str:
        lines = [f"# `{self.script}`", "", self.summary, "", "## Run it", "",
                 "From the repository root, in the environment of the "
                 "[install](../getting-started.md#install) (`source .venv/bin/activate`):", "",
                 _fence("\n".join(self.commands()), "sh"), "",
                 "It checks its own results and says whether they match. Without a "
                 "GPU it runs on Numba's CUDA simulator, at sizes small enough for "
                 "it; times it prints there measure Python, not a GPU.", "",
                 "## What it printed", ""]
        if recorded is None:
            lines += ["No benchmark run has recorded its output yet: run it as above "
                      "to see what it prints.", ""]
        else:
            page = recorded.results.with_suffix(".md")
            shown = page if page.exists() else recorded.results
            link = posixpath.relpath(shown.relative_to(DOCS).as_posix(), "examples")
            lines += [f"On one {_machine(recorded.environment)}, run by the `apps` suite of "
                      f"`python -m numbagraph.bench`, which runs each example in a process "
                      f"of its own ([that run's results]({link})):", "",
                      _fence(recorded.output, "text"), ""]
        lines += ["## Source", "", _fence(self.source, f' title="{self.script}" linenums="1"')]
        return "\n".join(lines)


def _nav_pages(nav) -> list[str]:
    """The pages of a nav configuration, in its order."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in _nav_pages(value)]
    if isinstance(nav, list):
        return [page for item in nav for page in _nav_pages(item)]
    return []


def _examples(nav) -> list[Example]:
    """Every example, in the order of the site's navigation (those it does
    not list last, for mkdocs to report)."""
    order = {page: i for i, page in enumerate(_nav_pages(nav))}
    examples = [Example(p.stem, p.read_text()) for p in sorted(EXAMPLES.glob("*.py"))]
    return sorted(examples, key=lambda e: order.get(e.page, len(order)))


def _index(examples: list[Example], recorded: dict[str, Recorded]) -> str:
    lines = ["# Examples", "",
             "Whole programs that use numbagraph, each checking its own results. "
             "Each page shows how to run the example, what it printed on a GPU "
             "where a benchmark run recorded it, and its source. They run without "
             "a GPU too, on Numba's CUDA simulator at small sizes, and the test "
             "suite runs them there.", "",
             "| example | what it does | output recorded on a GPU |", "|---|---|---|"]
    for example in examples:
        lines.append(f"| [`{example.name}.py`]({example.name}.md) | {example.summary} | "
                     f"{'yes' if example.name in recorded else 'no'} |")
    return "\n".join(lines) + "\n"


def on_files(files, config):
    files.append(File.generated(config, "index.md", content=_home((ROOT / "README.md").read_text())))
    examples, recorded = _examples(config["nav"]), _recorded()
    files.append(File.generated(config, "examples/index.md", content=_index(examples, recorded)))
    for example in examples:
        files.append(File.generated(config, example.page,
                                    content=example.markdown(recorded.get(example.name))))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    here = (DOCS / page.file.src_uri).parent

    def unlink(match: re.Match, bang: str, text: str, target: str) -> str:
        if bang or not _relative(target):
            return match.group(0)
        path = (here / target.split("#")[0]).resolve()
        if path.is_relative_to(DOCS) or not path.exists():
            return match.group(0)
        if path == EXAMPLES:
            example = "examples/index.md"
        elif path.parent == EXAMPLES and path.suffix == ".py":
            example = f"examples/{path.stem}.md"
        else:
            return text
        return f"[{text}]({posixpath.relpath(example, posixpath.dirname(page.file.src_uri) or '.')})"

    return _outside_prose(markdown, unlink)
