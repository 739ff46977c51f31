"""Jupyter notebooks: their code cells as one Python text for the rules, and the fixed text back.

The code cells are joined in order, one boundary line between two cells, so that a rule sees
the notebook as the kernel runs it (``from apex import amp`` in the first cell,
``amp.initialize`` in the third). IPython syntax is left alone:

- a cell that starts with a cell magic (``%%capture``, ``%%bash``) is not Python: it is left out;
- a line magic or shell escape (``%time f()``, ``!pip install x``, ``files = !ls``, ``obj?``,
  ``pip install x`` with automagic) in a cell that does not parse as Python is swapped for a
  placeholder name before parsing and put back afterwards, at the indentation the fixes gave its
  line. One that continues on the next line (``!pip install \\``) leaves its cell out.

Positions are reported in the cell, as Ruff does: ``train.ipynb:cell 3:4:1``, the cell counted
among all the notebook's cells from 1, the row within the cell's source. A fixed notebook is
written back with the JSON layout it was read with (indentation, key order, escaping, final
newline), so that only the changed cells' sources differ; a notebook whose layout cannot be
reproduced exactly is reported and left as it is.
"""
from __future__ import annotations

import ast
import json
import re
from typing import NamedTuple

from migrate import quiet
from migrate.files import NOTEBOOK_SUFFIX
from migrate.types import Position

__all__ = ["Notebook", "NotebookError", "SUFFIX", "changed_cells", "searchable"]

SUFFIX = NOTEBOOK_SUFFIX
_BOUNDARY = "_ipynb_cell_boundary"  # a statement (comments can go with a statement a fix removes), no rule's word
_MAGIC = "_ipynb_magic_{}"
# IPython's line magics that run without their "%" when automagic is on (the default):
# "pip install x" in a cell is "%pip install x".
_AUTOMAGICS = frozenset(
    "alias alias_magic autoawait autocall automagic bookmark cd clear colors conda config cp dhist dirs "
    "doctest_mode env gui history killbgscripts ldir less load load_ext loadpy logoff logon logstart "
    "logstate logstop ls lsmagic lx macro magic man matplotlib mkdir more mv notebook page pastebin pdb "
    "pdef pdoc pfile pinfo pinfo2 pip popd pprint precision prun psearch psource pushd pwd pycat pylab "
    "qtconsole quickref recall rehashx reload_ext rep rerun reset reset_selective rm rmdir run save sc "
    "set_env store sx system tb time timeit unalias unload_ext who who_ls whos xdel xmode".split()
)
_MAGIC_LINE = re.compile(
    r"^[ \t]*(?:[%!?]|[\w.]+\?\??[ \t]*$|[\w.,() \t]+=[ \t]*[%!]"  # %magic, !shell, ?help, obj?, x = !ls
    rf"|(?:{'|'.join(sorted(_AUTOMAGICS))})(?:[ \t]+[^\s=(\[,:;]|[ \t]*$))"  # pip install x, cd .., ls -la
)
_PLACEHOLDER_LINE = re.compile(r"^([ \t]*)(" + _MAGIC.format(r"\d+") + r")[ \t]*$")


class NotebookError(ValueError):
    """The file is not a notebook this tool can read, or its fixes cannot be written back."""


class _Cell(NamedTuple):
    index: int  # among all the notebook's cells, from 0
    text: str  # the source, as joined by the kernel
    magics: tuple[str, ...]  # the placeholders standing for its IPython lines


class Notebook:
    """A notebook's JSON text, its Python code cells and the Python text they make.

    ``python`` is None for a notebook in another language (there is nothing to check in it).
    """

    def __init__(self, text: str) -> None:
        self.text = text
        try:
            document = json.loads(text)
        except ValueError as error:
            raise NotebookError(f"not a notebook: the JSON does not parse ({error})") from error
        if not isinstance(document, dict) or not isinstance(document.get("cells"), list):
            raise NotebookError("not a notebook: no list of 'cells' (nbformat 4) in its JSON")
        self._cells: list[_Cell] = []
        self._magics: dict[str, str] = {}  # placeholder -> the magic line it stands for
        self.python = None if _other_language(document) else self._python(document["cells"])

    def _python(self, cells: list) -> str:
        parts = []
        for index, cell in enumerate(cells):
            if not isinstance(cell, dict) or cell.get("cell_type") != "code":
                continue
            source = cell.get("source", "")
            if not isinstance(source, (str, list)) or not all(isinstance(line, str) for line in source):
                raise NotebookError(
                    f"not a notebook: the source of cell {index + 1} is neither text nor a list of lines"
                )
            text = "".join(source)
            masked = self._masked(text)
            if masked is None:
                continue
            masked, magics = masked
            self._cells.append(_Cell(index, text, magics))
            parts.append(masked if masked.endswith("\n") else masked + "\n")  # each part ends a line
        return f"{_BOUNDARY}\n".join(parts)

    def _masked(self, text: str) -> tuple[str, tuple[str, ...]] | None:
        """The cell's text with its IPython lines swapped for placeholders, and those; None to leave the cell out."""
        if text.lstrip().startswith("%%"):
            return None
        if _parses(text):
            return text, ()
        lines = text.split("\n")
        placeholders = []
        for number, line in enumerate(lines):
            if _MAGIC_LINE.match(line):
                if line.rstrip().endswith("\\"):
                    return None
                placeholder = _MAGIC.format(len(self._magics))
                self._magics[placeholder] = line.lstrip(" \t")
                placeholders.append(placeholder)
                lines[number] = line[: len(line) - len(line.lstrip(" \t"))] + placeholder
        return "\n".join(lines), tuple(placeholders)

    def locate(self, python: str, position: Position) -> Position:
        """Where ``position`` in ``python`` (this notebook's Python text, or its fixed version) is in the notebook."""
        starts = _cell_starts(python)
        if not self._cells or len(starts) != len(self._cells):
            return position
        number = max((i for i, start in enumerate(starts) if start <= position.row), default=0)
        return Position(position.row - starts[number] + 1, position.column, cell=self._cells[number].index + 1)

    def rebuild(self, python: str) -> str:
        """The notebook's JSON text with the cells' sources from ``python`` (a fixed version of ``self.python``).

        Raises NotebookError when the fixes moved a cell boundary or a magic, or the notebook's
        JSON layout cannot be reproduced.
        """
        texts = _split_cells(python)
        if len(texts) != len(self._cells) or any(_BOUNDARY in text for text in texts):
            raise NotebookError("the fixes moved code across a cell boundary; the notebook was left unchanged")
        document = json.loads(self.text)
        for cell, text in zip(self._cells, texts):
            text = self._restored(text, cell)
            if not cell.text.endswith("\n"):
                text = text[:-1]  # the line end the joined text gave the cell
            if text == cell.text:
                continue
            source = document["cells"][cell.index]["source"]
            document["cells"][cell.index]["source"] = _lines(text) if isinstance(source, list) else text
        return _dumps_as(document, self.text)

    def _restored(self, text: str, cell: _Cell) -> str:
        """``text`` with its placeholders swapped back for the magic lines, at the indentation the fixes gave them."""
        found = []

        def put_back(match: re.Match) -> str:
            found.append(match.group(2))
            return match.group(1) + self._magics.get(match.group(2), match.group(2))

        restored = "\n".join(_PLACEHOLDER_LINE.sub(put_back, line) for line in text.split("\n"))
        if sorted(found) != sorted(cell.magics) or text.count(_MAGIC.format("")) != len(found):
            raise NotebookError("the fixes moved an IPython magic line; the notebook was left unchanged")
        return restored


def _split_cells(python: str) -> list[str]:
    """The cells' texts in a joined Python text, each ending with a line end."""
    texts, current = [], []
    for line in python.split("\n"):
        if line == _BOUNDARY:
            texts.append("\n".join(current) + "\n")
            current = []
        else:
            current.append(line)
    last = "\n".join(current)
    texts.append(last if last.endswith("\n") else last + "\n")
    return texts


def changed_cells(before: str, after: str) -> list[tuple[int, str, str]]:
    """The code cells whose source differs between two versions of a notebook's JSON text, as
    ``(number, old source, new source)``, numbered as positions are (from 1, among all cells)."""
    old_cells, new_cells = json.loads(before)["cells"], json.loads(after)["cells"]
    changed = []
    for index, (old, new) in enumerate(zip(old_cells, new_cells)):
        if not (isinstance(old, dict) and isinstance(new, dict)):
            continue  # not a cell: nothing was read from it, nothing changed in it
        old_source, new_source = "".join(old.get("source", "")), "".join(new.get("source", ""))
        if old.get("cell_type") == "code" and old_source != new_source:
            changed.append((index + 1, old_source, new_source))
    return changed


def searchable(text: str) -> str:
    """A notebook's JSON text with its line-end and tab escapes made characters again, for the
    word search before parsing: ``"\\nscaler"`` would hide the word ``scaler`` behind an ``n``."""
    return text.replace("\\n", "\n").replace("\\r", "\r").replace("\\t", "\t")


def _parses(text: str) -> bool:
    try:
        with quiet.warnings_off():
            compile(text, "<cell>", "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def _other_language(document: dict) -> bool:
    metadata = document.get("metadata")
    if not isinstance(metadata, dict):
        return False
    language = (metadata.get("language_info") or {}).get("name") or (metadata.get("kernelspec") or {}).get("language")
    return isinstance(language, str) and language.lower() != "python"


def _cell_starts(python: str) -> list[int]:
    """The first row of each cell in a joined Python text."""
    starts = [1]
    for row, line in enumerate(python.split("\n"), start=1):
        if line == _BOUNDARY:
            starts.append(row + 1)
    return starts


def _lines(text: str) -> list[str]:
    """A source as nbformat stores it: lines keeping their ``\\n``, the last one without."""
    lines = text.split("\n")
    return [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])


# The layouts notebook tools write: Jupyter (indent 1, no ASCII escaping), nbformat, VS Code, json.dump.
_LAYOUTS = [
    dict(indent=indent, ensure_ascii=ascii_only, separators=separators)
    for indent in (1, 2, 4, 3, "\t", None)
    for ascii_only in (False, True)
    for separators in ((",", ": "), (", ", ": "), (",", ":"))
    if indent is None or separators != (", ", ": ")
]


def _dumps_as(document: dict, original: str) -> str:
    """``document`` as JSON in the layout of ``original``."""
    newline = "\r\n" if "\r\n" in original else "\n"
    ending = newline if original.endswith(("\n", "\r")) else ""
    before = json.loads(original)
    for layout in _LAYOUTS:
        if json.dumps(before, **layout).replace("\n", newline) + ending == original:
            return json.dumps(document, **layout).replace("\n", newline) + ending
    raise NotebookError(
        "its JSON layout is not one ampmigrate can write back unchanged (only the fixed cells may differ); "
        "the notebook was left unchanged: save it from Jupyter, then run again"
    )
