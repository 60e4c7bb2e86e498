"""The code in README.md and in every page under docs/ runs as the page shows it.

Each page's ```python blocks run in order, in one fresh Python process, as a
reader would paste them. A ```python block that is not meant to run (an
excerpt) says so in the Markdown, on the line before it, with the reason:
``<!-- not run: an excerpt of examples/jacobi_converge.py -->``; it must
still compile. A ```python block that needs what this machine may lack
says so the same way, with what it needs: ``<!-- needs: driver, torch -->``
(``driver``: the CUDA driver backend; ``collectives``: what ``ng.dist``
runs on, the simulator or nccl4py on the driver; any other name: a module
that must be importable); it runs where all of it is there, and elsewhere it is left out
of the page's run and only compiled, so later blocks must not depend on it.
Every other code block names a language that is not Python (```sh for
commands, ```text for output and diagrams), so no block is left unchecked
by accident.
"""

import dataclasses
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

import numbagraph as ng

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(str(p.relative_to(ROOT)) for p in [ROOT / "README.md", *DOCS.rglob("*.md")])
PYTHON = {"python", "py", "python3"}

# A page's snippets must finish well inside this on the simulator, which runs
# each GPU thread as a Python thread: size them in tens of threads.
SECONDS = 60

FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
MARKER = re.compile(r"<!--\s*not[ -]run\b")
NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(?P<reason>\S.*?)\s*-->\s*$")
NEEDS = re.compile(r"^\s*<!--\s*needs:\s*(?P<what>[\w.]+(\s*,\s*[\w.]+)*)\s*-->\s*$")


@dataclasses.dataclass
class Block:
    """A fenced code block: where its code starts in the page, its language,
    and, for Python, why it does not run (None: it runs)."""

    line: int
    language: str
    code: str
    not_run: str | None = None
    needs: tuple[str, ...] = ()

    @property
    def runs(self) -> bool:
        return self.language in PYTHON and self.not_run is None


def missing(needs: tuple[str, ...]) -> list[str]:
    """What of ``needs`` (a block's ``<!-- needs: ... -->``) this machine lacks."""
    return [name for name in needs if _lacks(name)]


def _lacks(name: str) -> bool:
    if name == "driver":
        return ng.backend() != "cuda"
    if name == "collectives":  # ng.dist: one simulated rank, or NCCL through nccl4py
        return ng.backend() == "cuda" and importlib.util.find_spec("nccl") is None
    return importlib.util.find_spec(name) is None


def parse(page: str) -> tuple[list[Block], list[str]]:
    """The page's code blocks, and what is wrong with how they are marked."""
    lines = (ROOT / page).read_text().splitlines()
    blocks: list[Block] = []
    problems: list[str] = []
    marker: tuple[int, str] | None = None
    needs: tuple[int, tuple[str, ...]] | None = None
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            found_needs = NEEDS.match(lines[i])
            if found_needs is not None:
                needs = (i + 1, tuple(n.strip() for n in found_needs["what"].split(",")))
            elif MARKER.search(lines[i]):
                found = NOT_RUN.match(lines[i])
                if found is None:
                    problems.append(f"{page}:{i + 1}: write the marker as "
                                    "`<!-- not run: why -->`, alone on its line")
                else:
                    marker = (i + 1, found["reason"])
            elif lines[i].strip():
                for pending, name in ((marker, "not run"), (needs, "needs: ...")):
                    if pending is not None:
                        problems.append(f"{page}:{pending[0]}: `<!-- {name} -->` must be "
                                        "right before the ```python block it marks")
                marker = needs = None
            i += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        closing = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        end = next((j for j in range(i + 1, len(lines)) if closing.match(lines[j])), None)
        if end is None:
            problems.append(f"{page}:{i + 1}: this code block is never closed")
            break
        code = "\n".join(line[indent:] if not line[:indent].strip() else line.lstrip()
                         for line in lines[i + 1:end]) + "\n"
        info = opening["info"].strip().split()
        language = info[0].strip("{}.").lower() if info else ""
        block = Block(i + 2, language, code)
        if not language:
            problems.append(f"{page}:{i + 1}: a code block without a language: write "
                            "```python (it runs), ```sh (commands) or ```text "
                            "(output, diagrams)")
        if marker is not None:
            if language in PYTHON:
                block.not_run = marker[1]
            else:
                problems.append(f"{page}:{marker[0]}: `<!-- not run -->` marks a "
                                f"```{language} block; only ```python blocks run")
            marker = None
        if needs is not None:
            if language in PYTHON:
                block.needs = needs[1]
            else:
                problems.append(f"{page}:{needs[0]}: `<!-- needs: ... -->` marks a "
                                f"```{language} block; only ```python blocks run")
            needs = None
        blocks.append(block)
        i = end + 1
    if marker is not None:
        problems.append(f"{page}:{marker[0]}: `<!-- not run -->` marks no block")
    if needs is not None:
        problems.append(f"{page}:{needs[0]}: `<!-- needs: ... -->` marks no block")
    return blocks, problems


def run_snippets(page: str, blocks: list[Block], env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run ``blocks`` in order in a fresh Python process; tracebacks name
    the page and its line."""
    runner = (
        "import json, sys, traceback\n"
        "job = json.load(sys.stdin)\n"
        "namespace = {'__name__': '__main__'}\n"
        "for n, (line, code) in enumerate(job['blocks'], 1):\n"
        "    try:\n"
        "        exec(compile('\\n' * (line - 1) + code, job['page'], 'exec'), namespace)\n"
        "    except BaseException:\n"
        "        print(f\"{job['page']}: snippet {n} of {len(job['blocks'])}, at line \"\n"
        "              f\"{line}, failed:\", file=sys.stderr)\n"
        "        traceback.print_exc()\n"
        "        sys.exit(3)\n"
    )
    job = {"page": page, "blocks": [(b.line, b.code) for b in blocks]}
    try:
        return subprocess.run([sys.executable, "-c", runner], input=json.dumps(job), env=env,
                              cwd=ROOT, capture_output=True, text=True, timeout=SECONDS)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{page}: its snippets did not finish in {SECONDS} s; size them for the "
                    "simulator, which runs each GPU thread as a Python thread", pytrace=False)


def environment(**variables: str) -> dict[str, str]:
    """This process's environment without the variables that choose a
    backend (importing numbagraph sets NUMBA_ENABLE_CUDASIM here), plus
    ``variables``."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBAGRAPH_BACKEND", "NUMBA_ENABLE_CUDASIM")}
    env.update(variables)
    return env


def succeeded(done: subprocess.CompletedProcess, what: str) -> None:
    """Fail with the child's own report (page, snippet, line, traceback)."""
    if done.returncode != 0:
        pytest.fail(f"{what}, exit status {done.returncode}:\n{done.stderr[-6000:]}",
                    pytrace=False)


@pytest.mark.parametrize("page", PAGES)
def test_code_blocks_are_marked_and_excerpts_compile(page):
    blocks, problems = parse(page)
    assert not problems, "\n".join(problems)
    for block in blocks:
        if block.language in PYTHON and (not block.runs or missing(block.needs)):
            compile("\n" * (block.line - 1) + block.code, page, "exec")


RUNNABLE = [page for page in PAGES if any(b.runs for b in parse(page)[0])]


@pytest.mark.parametrize("page", RUNNABLE)
def test_snippets_run_in_a_fresh_process(page):
    blocks = [b for b in parse(page)[0] if b.runs and not missing(b.needs)]
    done = run_snippets(page, blocks, environment(NUMBAGRAPH_BACKEND=ng.backend()))
    succeeded(done, f"{page}, on the {ng.backend()} backend")


IMPORTS_NUMBAGRAPH = re.compile(r"(import numbagraph\b|from numbagraph[ .])")
IMPORTS_NUMBA = re.compile(r"(import numba\b|from numba[ .])")


def _readme_first() -> Block:
    return next(b for b in parse("README.md")[0] if b.runs)


def _numba_imported_first(block: Block) -> Block:
    lines = block.code.splitlines()
    numba = next(line for line in lines if IMPORTS_NUMBA.match(line))
    lines.remove(numba)
    return Block(block.line, block.language, "\n".join([numba, *lines]) + "\n")


def test_readme_first_snippet_imports_numbagraph_before_numba():
    lines = _readme_first().code.splitlines()
    numbagraph = next(i for i, line in enumerate(lines) if IMPORTS_NUMBAGRAPH.match(line))
    numba = next(i for i, line in enumerate(lines) if IMPORTS_NUMBA.match(line))
    assert numbagraph < numba, "numbagraph picks the backend only if imported first"


def test_readme_first_snippet_runs_with_no_backend_chosen():
    done = run_snippets("README.md", [_readme_first()], environment())
    succeeded(done, "README.md's first snippet, with no backend chosen")
    assert done.stdout.strip(), "the README's first snippet prints its result"


def test_readme_first_snippet_with_numba_first_runs_or_says_what_to_do():
    chosen = subprocess.run([sys.executable, "-c", "import numbagraph as ng; print(ng.backend())"],
                            env=environment(), capture_output=True, text=True, cwd=ROOT)
    snippet = _numba_imported_first(_readme_first())
    done = run_snippets("README.md", [snippet], environment())
    if chosen.stdout.strip() == "cuda":  # numba's own choice, the driver, works here
        succeeded(done, "README.md's first snippet, numba.cuda imported first, on a GPU")
        return
    assert done.returncode != 0
    assert "ImportError: numba.cuda was imported before numbagraph" in done.stderr
    assert "import numbagraph before numba.cuda" in done.stderr
    assert "set NUMBA_ENABLE_CUDASIM=1" in done.stderr
    # The error's other way out works.
    done = run_snippets("README.md", [snippet], environment(NUMBA_ENABLE_CUDASIM="1"))
    succeeded(done, "README.md's first snippet, numba.cuda first, NUMBA_ENABLE_CUDASIM=1")


def _example_output(name: str, capsys) -> str:
    """What ``examples/<name>`` printed, run as a script in this process."""
    import runpy

    runpy.run_path(str(DOCS.parent / "examples" / name), run_name="__main__")
    return capsys.readouterr().out


def test_example_replay_loop_runs(capsys):
    out = _example_output("replay_loop.py", capsys)
    assert "results match" in out


def test_example_jacobi_converge_runs(capsys):
    out = _example_output("jacobi_converge.py", capsys)
    assert "converged in" in out
    assert "same answer, bit for bit" in out


def test_example_decode_loop_runs(capsys):
    # Without a GPU the example picks tiny sizes for the simulator.
    out = _example_output("decode_loop.py", capsys)
    assert "logits match the NumPy reference for every token" in out
    assert "its logits match the reference up to the end token" in out


def test_example_heat_to_t_end_runs(capsys):
    out = _example_output("heat_to_t_end.py", capsys)
    assert "all three match NumPy at t_end" in out


def test_example_step_with_temporaries_runs(capsys):
    out = _example_output("step_with_temporaries.py", capsys)
    assert "every replay matches the eager step" in out
    assert "StaleOutputError" in out


def test_example_rk4_pingpong_runs(capsys):
    out = _example_output("rk4_pingpong.py", capsys)
    assert "graphed: 2 captures (a graph per pair), then" in out
    assert "0 of them rebound" in out
    assert "graphed result matches eager bit for bit" in out


def test_example_watch_residual_runs(capsys):
    out = _example_output("watch_residual.py", capsys)
    assert "the callback saw every replay's residual, in order" in out
    assert "match NumPy" in out


def test_example_particles_runs(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["particles.py"])  # the example's defaults, not pytest's
    out = _example_output("particles.py", capsys)
    modes = re.findall(r"^ +\(([a-d])\) (.*)$", out, re.MULTILINE)
    assert [mode for mode, _ in modes] == ["a", "b", "c", "d"], out
    for mode, line in modes:
        assert "us/step  matches NumPy" in line, f"({mode}) {line}"
