"""The snippets in docs/ run as written."""

import pathlib
import re

import pytest

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
PAGES = ["capture.md", "conditionals.md", "troubleshooting.md", "ops.md"]


@pytest.mark.parametrize("page", PAGES)
def test_snippets_run(page):
    text = (DOCS / page).read_text()
    namespace: dict = {}
    for block in re.findall(r"```python\n(.*?)```", text, re.S):
        exec(compile(block, f"{page}", "exec"), namespace)


def test_example_replay_loop_runs(capsys):
    import runpy

    runpy.run_path(str(DOCS.parent / "examples" / "replay_loop.py"), run_name="__main__")
    assert "results match" in capsys.readouterr().out


def test_example_jacobi_converge_runs(capsys):
    import runpy

    runpy.run_path(str(DOCS.parent / "examples" / "jacobi_converge.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "converged in" in out
    assert "same answer, bit for bit" in out


def test_example_decode_loop_runs(capsys):
    import runpy

    # Without a GPU the example picks tiny sizes for the simulator.
    runpy.run_path(str(DOCS.parent / "examples" / "decode_loop.py"), run_name="__main__")
    assert "logits match the NumPy reference for every token" in capsys.readouterr().out
