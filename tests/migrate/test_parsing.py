"""A large module parsed in pieces is the tree libcst makes of it whole."""
from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from migrate.parsing import _parts, parse_module

REPO = Path(__file__).resolve().parents[2]

SHAPES = {
    "comments between statements": (
        "#!/usr/bin/env python\n# header\n\n\"\"\"Docstring.\"\"\"\n# leads import\nimport torch\n\n\n"
        "def train(model):\n    loss = model()\n    # inside, after the last statement\n\n# column 0, before the next\n\n"
        "    # indented, before the next\nclass Net:\n    pass\n        # deeper\n# end of file\n"
    ),
    "decorators and comments between them": (
        "import functools\n\n\n@functools.lru_cache()\n# between decorators\n@staticmethod\n"
        "def f():\n    return 1\n\n\nasync def g():\n    await f()\n"
    ),
    "statements sharing a line": "a = 1; b = 2\nc = 3; \\\n    d = 4\ne = 5; \\\nf = 6\nif a: b = 5\nelse: c = 6\n",
    "a string holding lines that look like statements": (
        'TEXT = """\ndef not_code():\n    pass\n"""\n\ndef real():\n    return TEXT\n\'\'\'\nclass Nope:\n\'\'\'\n'
    ),
    "windows line ends": "import torch\r\n\r\ndef f(x):\r\n    return x\r\n\r\n# c\r\ny = f(1)\r\n",
    "tabs": "import torch\n\n\ndef f(x):\n\tif x:\n\t\treturn x\n\n\nclass A:\n\tdef g(self):\n\t\tpass\n",
    "no final newline": "import torch\n\n\ndef f():\n    pass\n\nx = f()",
    "form feed and trailing blank lines": "import torch\n\x0c\ndef f():\n    pass\n\nx = 1\n\x0c\n\n\n",
    "a main guard and a continuation": (
        "import sys\n\nvalue = (1 +\n         2)\nother = \\\n    3\n\nif __name__ == '__main__':\n    sys.exit(value)\n"
    ),
    "two spaces, a piece without a block": "import torch\n\nx = 1\n\ndef f():\n  return x\n\ny = 2\n",
    "a line of spaces between statements": "import json\n\n    \n\t\nx = 1\n  # indented comment\ny = 2\n\nz = 3\n",
    "mixed line ends": "a = 1\r\nb = 2\n\ndef f():\n    pass\r\n",
    # the pieces disagree on the default indentation or line end: each would take its own
    "two spaces first, then four": "def f():\n  return 1\n\n\ndef g():\n    if f():\n      return 2\n",
    "four spaces first, then tabs": "def f():\n    return 1\n\n\nclass A:\n\tdef g(self):\n\t\tpass\n",
    "no block first, then two spaces and four": "x = 1\ny = 2\n\ndef f():\n  return x\n\ndef g():\n    return y\n",
    "the first block in an else clause": "if x: y = 1\nelse:\n   y = 2\n\ndef f():\n    return y\n",
    "the first block in an except clause": "try: import torch\nexcept ImportError:\n  torch = None\n\ndef f():\n    pass\n",
    "windows line ends first, then unix": "import torch\r\n\r\ndef f(x):\r\n    return x\r\n\ndef g():\n    return 1\n",
    "unix line ends first, then windows": "import torch\n\n# c\r\ndef f(x):\r\n  return x\r\n",
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_a_module_parsed_in_pieces_is_the_tree_and_text_of_the_whole(name):
    text = SHAPES[name]
    whole = cst.parse_module(text)
    pieced = parse_module(text, piece_size=1)  # a piece per top-level statement

    assert pieced.code == text
    assert pieced.deep_equals(whole)


def test_pieces_that_disagree_on_indentation_or_line_ends_are_not_parsed_again_whole(monkeypatch):
    parsed = []
    real = cst.parse_module
    monkeypatch.setattr("migrate.parsing.cst.parse_module", lambda text: parsed.append(text) or real(text))
    for name in ("two spaces first, then four", "four spaces first, then tabs", "windows line ends first, then unix"):
        text = SHAPES[name]
        parse_module(text, piece_size=1)

        assert text not in parsed, name


def test_the_shapes_are_really_cut_in_pieces():
    cut = {name: len(_parts(text, 1, None)) for name, text in SHAPES.items()}

    assert all(count > 1 for count in cut.values()), cut
    assert _parts(SHAPES["statements sharing a line"], 1, None) == [
        "a = 1; b = 2\n", "c = 3; \\\n    d = 4\n", "e = 5; \\\nf = 6\n", "if a: b = 5\nelse: c = 6\n"
    ]


def test_pieces_are_cut_only_once_they_reach_the_piece_size():
    text = "".join(f"def f{i}():\n    return {i}\n\n\n" for i in range(100))
    pieces = _parts(text, 1000, None)

    assert "".join(pieces) == text
    assert all(len(piece) >= 1000 for piece in pieces[:-1])
    assert len(pieces) == 3 and len(pieces[-1]) < 1000  # the last piece takes the remainder


def test_every_fixture_parses_the_same_in_pieces():
    paths = sorted((REPO / "fixtures").rglob("*.py"))
    assert len(paths) > 10
    for path in paths:
        text = path.read_text(encoding="utf-8")
        assert parse_module(text, piece_size=1).deep_equals(cst.parse_module(text)), path


def test_a_syntax_error_in_a_later_piece_is_reported_where_it_is_in_the_whole_file():
    text = "import torch\n\n\ndef f():\n    pass\n\n\ndef g(:\n    pass\n"
    with pytest.raises(cst.ParserSyntaxError) as whole:
        cst.parse_module(text)
    with pytest.raises(cst.ParserSyntaxError) as pieced:
        parse_module(text, piece_size=1)

    assert (pieced.value.editor_line, pieced.value.editor_column) == (whole.value.editor_line, whole.value.editor_column)
    assert pieced.value.editor_line > 5  # in the piece of g, not the first


def test_a_small_module_is_parsed_whole(monkeypatch):
    monkeypatch.setattr("migrate.parsing._parts", lambda *args: pytest.fail("a small module was cut"))

    assert parse_module(SHAPES["tabs"]).code == SHAPES["tabs"]


@pytest.mark.slow
def test_every_fixture_is_checked_and_fixed_the_same_when_parsed_in_pieces(monkeypatch):
    from migrate.engine import run_rules
    from migrate.rules import select_rules

    rules = tuple(select_rules(["ALL"]))
    paths = sorted((REPO / "fixtures" / "corpus").glob("*.py"))  # shapes of real training code

    def results() -> list:
        return [run_rules(path.read_text(encoding="utf-8"), str(path), rules, unsafe_fixes=True) for path in paths]

    monkeypatch.setattr("migrate.parsing.PIECE_SIZE", 10**9)
    whole = results()
    monkeypatch.setattr("migrate.parsing.PIECE_SIZE", 1)
    pieced = results()

    assert pieced == whole
    assert sum(len(result.diagnostics) for result in whole) > 100
