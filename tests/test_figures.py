"""The figures the README and the benchmarks page quote are the bench's own:
each block of figures holds exactly what ``numbagraph.bench.figures``
renders from the ``results.json`` it names, and the sections that quote
them hold no other figure. A run of the bench renders the blocks again;
a suite the run did not hold reads "not measured in this run".
"""

import json
import re
from pathlib import Path

import pytest

from conftest import ON_SIMULATOR
from numbagraph.bench import SUITES, figures, loop, streams
from numbagraph.bench.__main__ import main
from numbagraph.bench.report import format_value

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGE = ROOT / "docs" / "benchmarks" / "README.md"
RESULTS = ROOT / "docs" / "benchmarks" / "results.json"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]

# A measured figure: a number with a unit of time, rate, size or ratio, or
# any number with a decimal point.
FIGURE = re.compile(r"\d[\d.,]*\s*(µs|us\b|ms\b|ns\b|×|x\b|%|[KMGT]i?B\b|[KMGT]B/s"
                    r"|MHz|GHz)|\d+\.\d+")


def _section(path: Path, heading: str) -> tuple[int, int]:
    """The lines (0-based, end exclusive) of the ``## heading`` section."""
    lines = path.read_text().splitlines()
    start = lines.index(f"## {heading}")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
               len(lines))
    return start, end


def _quotes_in(path: Path, heading: str) -> list[figures.Quote]:
    start, end = _section(path, heading)
    return [q for q in figures.quotes(path) if start < q.start <= q.end < end]


def _figures_outside_quotes(path: Path, heading: str) -> list[str]:
    start, end = _section(path, heading)
    inside = {i for q in figures.quotes(path) for i in range(q.start - 1, q.end + 1)}
    lines = path.read_text().splitlines()
    return [f"{path.name}:{i + 1}: {lines[i].strip()}" for i in range(start, end)
            if i not in inside and FIGURE.search(lines[i])]


def _doc(suites: dict, **environment) -> dict:
    return {"environment": {"numbagraph_backend": "cuda", "gpu": {"name": "GPU"},
                            **environment},
            "config": {"quick": False, "simulated": False, "trials": 3},
            "suites": suites, "targets": []}


def _suite(*rows, unjudged=None) -> dict:
    return {"rows": [{"case": c, "peer": p, "value": v, "unit": u} for c, p, v, u in rows],
            "unjudged": unjudged}


def _item(text: str, title: str) -> str:
    line = next(line for line in text.splitlines() if line.startswith(f"- **{title}**"))
    return line.split(":", 1)[1].strip()


def test_readme_how_fast_is_the_headline_of_the_committed_results():
    (quote,) = _quotes_in(README, "How fast")
    assert quote.kind == "headline figures"
    assert quote.source == RESULTS.resolve()
    assert quote.text == figures.render_quote(quote)


def test_benchmarks_page_current_results_are_the_committed_results():
    (quote,) = _quotes_in(PAGE, "Current results")
    assert quote.kind == "current results"
    assert quote.source == RESULTS.resolve()
    assert quote.text == figures.render_quote(quote)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_block_of_figures_is_what_its_results_render(page):
    for quote in figures.quotes(page):
        assert quote.source.is_file(), f"{page}:{quote.start}: {quote.source} is missing"
        assert quote.text == figures.render_quote(quote), (
            f"{page}:{quote.start}: the figures differ from {quote.source}; run "
            "python -m numbagraph.bench --out docs/benchmarks, or render them again "
            "with numbagraph.bench.figures.rewrite_quotes")


@pytest.mark.parametrize("path, heading", [(README, "How fast"), (PAGE, "Current results")])
def test_no_figure_is_quoted_beside_the_generated_one(path, heading):
    assert _figures_outside_quotes(path, heading) == []


def test_the_benchmarks_page_keeps_earlier_runs_in_one_history_section():
    headings = [line for line in PAGE.read_text().splitlines() if line.startswith("## ")]
    assert headings[-1] == "## History (earlier runs)"
    assert headings.index("## Current results") == len(headings) - 2


def test_a_suite_the_run_did_not_hold_is_not_measured():
    doc = json.loads(RESULTS.read_text())
    text = figures.headline(doc)
    for title, _, suite, _ in figures.ITEMS:
        if suite not in doc["suites"]:
            assert _item(text, title) == figures.NOT_MEASURED
    empty = figures.headline(_doc({}))
    assert all(_item(empty, title) == figures.NOT_MEASURED
               for title, *_ in figures.ITEMS)
    assert "not in this run: " + ", ".join(SUITES) in empty


def test_each_suite_has_a_headline_item():
    assert {suite for _, _, suite, _ in figures.ITEMS} == set(SUITES)


def test_the_headline_quotes_the_rows_of_its_run():
    doc = _doc({
        "loop": _suite((loop.STEP, "numbagraph", 3.25, "us/step"),
                       (loop.STEP, "C++", 3.5, "us/step"),
                       (loop.STEP, "PyTorch", 7.0, "us/step"),
                       (loop.STEP, loop.DEVICE_LOOP, 1.75, "us/step")),
        "streams": _suite((streams.FORK, streams.FORKED, 232.4, "us"),
                          (streams.FORK, streams.SEQUENTIAL, 463.0, "us")),
    })
    text = figures.headline(doc)
    assert _item(text, "Replay-loop step").startswith("3.25 µs, 0.93× C++")
    assert "0.46× PyTorch" in _item(text, "Replay-loop step")
    assert _item(text, "The same step looped by the GPU") == (
        "1.75 µs a step, 0.50× the C++ host loop (3.50)")
    assert "replay in 232 µs, 0.50× the same in sequence (463)" in _item(
        text, "Several streams in one graph")
    assert _item(text, "Replay") == figures.NOT_MEASURED


@pytest.mark.parametrize("name", ["results-devloop.json", "results-ops-quads.json",
                                  "results-ops-streams.json"])
def test_earlier_runs_render_their_suites(name):
    doc = json.loads((RESULTS.parent / name).read_text())
    text = figures.headline(doc)
    for title, _, suite, _ in figures.ITEMS:
        measured = _item(text, title) != figures.NOT_MEASURED
        assert measured == (suite in doc["suites"]), title
    if "loop" in doc["suites"]:
        device = next(r for r in doc["suites"]["loop"]["rows"]
                      if r["peer"] == loop.DEVICE_LOOP)
        assert format_value(device["value"]) in _item(text, "The same step looped by the GPU")


def test_a_rebinding_fitted_by_the_graphed_suite_is_quoted_as_recorded():
    doc = _doc({"graphed": _suite(("rebinding kernel nodes, fitted", "per node moved", 0.41,
                                   "us"),
                                  ("rebinding kernel nodes, fitted", "fixed part", 7.9, "us"))})
    assert _item(figures.headline(doc), "Graphed functions") == (
        "rebinding kernel nodes, per node moved 0.410, fixed part 7.90 µs")


def test_names_the_renderer_does_not_know_are_passed_over():
    doc = _doc({
        "replay": _suite(("10 nodes", "numbagraph", 1.0, "us/node"),
                         ("10 nodes", "a new peer", 2.0, "us/node"),
                         ("a new case", "numbagraph", 3.0, "us/node"),
                         ("100 nodes", "numbagraph", None, "us/node")),
        "a new suite": _suite(("case", "peer", 1.0, "us")),
        "eager": {"rows": [{"case": "tiny kernel"}, "not a row"]},
    })
    doc["targets"] = [{"target": "a new target", "verdict": "n/a", "why": "new"}]
    text = figures.headline(doc)
    assert _item(text, "Replay") == "a graph of 10 tiny kernels replays at 1.00 µs per node"
    assert _item(text, "Eager launch of the tiny kernel") == figures.NOT_MEASURED
    assert "Suites in this run: replay, a new suite, eager" in text
    assert "0 met, 0 missed, 1 not judged (new)" in text
    assert "a new target" in figures.current(doc)


def test_rewrite_renders_the_blocks_naming_the_results_and_nothing_else(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps(_doc({})))
    (tmp_path / "other.json").write_text(json.dumps(_doc({}, python="other")))
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\nBefore 1.5 µs.\n\n"
        "<!-- headline figures from results.json, written by the bench -->\nstale\n"
        "<!-- end of figures -->\n\nBetween.\n\n"
        "<!-- current results from other.json -->\nother\n<!-- end of figures -->\n"
        "After.\n")
    assert figures.rewrite_quotes(tmp_path / "results.json", [page]) == [page]
    text = page.read_text()
    assert text.startswith("# Page\n\nBefore 1.5 µs.\n\n<!-- headline figures from "
                           "results.json, written by the bench -->\n\n")
    assert "stale" not in text and "\nother\n" in text and text.endswith("After.\n")
    first, second = figures.quotes(page)
    assert first.text == figures.render_quote(first)
    assert second.text == "other"
    assert figures.rewrite_quotes(tmp_path / "nothing.json", [page]) == []


def test_a_block_left_open_is_refused(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- headline figures from results.json -->\n- 1 µs\n")
    with pytest.raises(ValueError, match="no '<!-- end of figures -->' line"):
        figures.quotes(page)


def _quoting_readme(folder: Path, results: str) -> Path:
    readme = folder / "README.md"
    readme.write_text(f"# Project\n\n<!-- headline figures from {results} -->\n"
                      "<!-- end of figures -->\n\n## Next\n")
    return readme


def test_a_run_renders_again_the_figures_that_quote_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    readme = _quoting_readme(tmp_path, "out/results.json")
    (tmp_path / "out").mkdir()
    elsewhere = _quoting_readme(tmp_path / "out", "../elsewhere.json")
    assert main(["--quick", "--suites", "capture", "--out", "out"]) == 0
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    (quote,) = figures.quotes(readme)
    assert quote.text == figures.headline(doc)
    assert "Suites in this run: capture;" in quote.text
    assert readme.read_text().endswith("<!-- end of figures -->\n\n## Next\n")
    assert "<!-- end of figures -->" in elsewhere.read_text()
    assert figures.quotes(elsewhere)[0].text == ""
    assert "### Headline figures" in (tmp_path / "out" / "results.md").read_text()


@pytest.mark.skipif(not ON_SIMULATOR, reason="only a simulator run is refused")
def test_a_simulator_run_names_the_figures_it_would_overwrite(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text(json.dumps(_doc({})))
    readme = _quoting_readme(tmp_path, "out/results.json")
    before = readme.read_text()
    with pytest.raises(SystemExit) as exc:
        main(["--quick", "--suites", "capture", "--out", "out"])
    assert exc.value.code == 2
    assert "and the figures README.md quote from them" in capsys.readouterr().err
    assert readme.read_text() == before


# The guide's pages quote measured figures in prose; each block of text that
# does names its run with a link into the benchmarks page (its current
# results, or the history section of an earlier run). reliability.md quotes
# the soak's runs, device-nodes.md its own probe.
GUIDE_PAGES = [p for p in sorted((ROOT / "docs").glob("*.md"))
               if p.name not in ("reliability.md", "device-nodes.md")]
# A measured time, rate or ratio (not a size, a percentage, nor `32×32`).
MEASURED = re.compile(r"\d[\d.,]*\s*(µs|ms\b|ns\b|×(?!\s*\d)|[KMGT]B/s|x faster)")


def _prose_blocks(text: str) -> list[tuple[int, str]]:
    """(first line, text) of each block of lines between blank lines, code
    blocks left out; a table is joined to the block that introduces it."""
    blocks: list[tuple[int, list[str]]] = []
    fenced, fresh = False, True
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced, fresh = not fenced, True
            continue
        if fenced or not line.strip():
            fresh = True
            continue
        if fresh and not (line.startswith("|") and blocks):
            blocks.append((number, []))
        blocks[-1][1].append(line)
        fresh = False
    return [(number, "\n".join(lines)) for number, lines in blocks]


@pytest.mark.parametrize("page", GUIDE_PAGES, ids=lambda p: p.name)
def test_figures_in_the_guide_name_their_benchmark_run(page):
    unnamed = [f"{page.name}:{number}: {block.splitlines()[0]}"
               for number, block in _prose_blocks(page.read_text())
               if MEASURED.search(block) and "benchmarks/README.md#" not in block]
    assert unnamed == []
