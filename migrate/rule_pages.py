"""One Markdown page per code in ``docs/rules``, and an index: rendered from ``explain.documentation``
so a page says what ``--explain`` says, and checked by the tests so it cannot go stale.

    python -m migrate.rule_pages [--check] [DIR]

writes the pages into DIR (``docs/rules``), touching only those whose text changed; ``--check``
writes nothing and exits 1 naming each page that is stale, missing or extra (a page for no code).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from migrate.explain import PAGES, Documentation, all_codes, default_in_words, documentation, page_path

__all__ = ["PAGES", "check_pages", "expected_pages", "main", "page_path", "render_index", "render_page", "write_pages"]

INDEX = "index.md"
_FOOTER = "<!-- Generated from the rules by python -m migrate.rule_pages: edit the rule, not this page. -->"
_CODE_SPAN = re.compile(r"(``.+?``|`[^`]+`)", re.DOTALL)  # reST's ``code`` or Markdown's `code`
_INLINE_MARKUP = re.compile(r"[\\*\[\]]|(?<!\w)_|_(?!\w)")  # an "_" inside a word is no emphasis
# what would open a heading, a quote or a list at the start of a line of a paragraph
_BLOCK_START = re.compile(r"^([ \t]*)(#|>|[-+](?= )|\d+(?=[.)] ))", re.MULTILINE)
_DEFAULT_IN_INDEX = {"on": "on", "off": "opt-in", "always": "always"}


def render_page(code: str) -> str:
    """The Markdown page of ``code``: the same sections and examples as ``explain(code)``."""
    doc = documentation(code)
    lines = [f"# {doc.code}: {doc.name}", "", _status_line(doc), ""]
    for section in doc.sections:
        if section.heading:
            lines += [f"## {section.heading.rstrip(':')}", ""]
        lines += [_markdown(section.body), ""]
    if doc.example is not None:
        lines += ["## Example", "", *_code_block(doc.example), ""]
        if doc.fixed is not None:
            needs = " (with `--unsafe-fixes`)" if doc.fix_needs_unsafe else ""
            lines += [f"Becomes{needs}:", "", *_code_block(doc.fixed), ""]
    if doc.valid is not None:
        lines += ["## Valid", "", *_code_block(doc.valid), ""]
    if doc.frameworks:
        lines += ["## In each framework", ""]
    for note in doc.frameworks:
        lines += [f"### {note.framework}", "", _markdown(note.how), ""]
        for label, codes in (("Reported:", note.reported), ("Left alone:", note.left_alone)):
            for code in codes:
                lines += [label, "", *_code_block(code), ""]
    return "\n".join([*lines, _FOOTER]) + "\n"


def render_index() -> str:
    """A table of every code: its page, name, default, fix safety and what the fix does."""
    lines = [
        "# Rules",
        "",
        "Every code ampmigrate reports, with its page: the text `ampmigrate --explain CODE` prints.",
        "An opt-in rule runs only when `--select` names it: its code, a prefix under which every rule",
        "is opt-in (`AMP02`), or `ALL`.",
        "",
        "| Code | Name | Default | Fix safety | What the fix does |",
        "|---|---|---|---|---|",
    ]
    for code in all_codes():
        doc = documentation(code)
        cells = [f"[{code}]({code}.md)", doc.name, _DEFAULT_IN_INDEX[doc.default], doc.fix_safety.value,
                 _markdown(doc.fix or "(reports only)")]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join([*lines, "", _FOOTER]) + "\n"


def expected_pages() -> dict[str, str]:
    """File name -> text, for every page the folder must hold."""
    return {**{f"{code}.md": render_page(code) for code in all_codes()}, INDEX: render_index()}


def check_pages(folder: Path) -> list[str]:
    """``"stale: <path>"``, ``"missing: <path>"`` or ``"extra: <path>"`` for each page that differs
    from what would be written; empty when all are fresh."""
    folder = Path(folder)
    expected = expected_pages()
    problems = []
    for name, text in expected.items():
        path = folder / name
        if not path.is_file():
            problems.append(f"missing: {path.as_posix()}")
        elif path.read_bytes() != text.encode("utf-8"):
            problems.append(f"stale: {path.as_posix()}")
    problems += [f"extra: {path.as_posix()}" for path in _extra_pages(folder)]
    return problems


def write_pages(folder: Path) -> list[Path]:
    """Write every page whose text changed (each atomically), and return those written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in expected_pages().items():
        path = folder / name
        if not path.is_file() or path.read_bytes() != text.encode("utf-8"):
            _write_atomically(path, text)
            written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m migrate.rule_pages",
                                     description="Write (or, with --check, check) one Markdown page per code.")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a page is stale, missing or extra")
    parser.add_argument("folder", nargs="?", default=PAGES, metavar="DIR", help=f"the pages' folder (default: {PAGES})")
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    if args.check:
        problems = check_pages(folder)
        print("\n".join(problems) if problems else f"{folder.as_posix()}: all pages are fresh")
        if problems:
            extra = " and delete the extra pages" if any(p.startswith("extra:") for p in problems) else ""
            print(f"to fix: python -m migrate.rule_pages {folder.as_posix()}{extra}", file=sys.stderr)
        return 1 if problems else 0
    written = write_pages(folder)
    print(f"{folder.as_posix()}: wrote {len(written)} of {len(_page_names())} pages")
    extra = _extra_pages(folder)
    for path in extra:
        print(f"extra: {path.as_posix()} (a page for no code: delete it)")
    return 1 if extra else 0


def _status_line(doc: Documentation) -> str:
    """The message, then what ``explain`` says of the fix and the default."""
    message = _markdown(doc.message.rstrip("."))
    return f"Message: {message}. Fix: {doc.fix_safety.value}. {default_in_words(doc.default)}"


def _page_names() -> set[str]:
    return {*(f"{code}.md" for code in all_codes()), INDEX}


def _extra_pages(folder: Path) -> list[Path]:
    """The Markdown files of ``folder`` that are the page of no code."""
    names = _page_names()
    return sorted(path for path in folder.glob("*.md") if path.name not in names) if folder.is_dir() else []


def _markdown(text: str) -> str:
    """Docstring prose as Markdown: ``code`` as `code`, and the rest escaped so that it reads as written."""
    parts = _CODE_SPAN.split(text)
    for i, part in enumerate(parts):
        if i % 2:
            parts[i] = _code_span(part[2:-2] if part.startswith("``") else part[1:-1])
        else:
            parts[i] = _escape(part, after_code=i > 0)
    return "".join(parts)


def _escape(prose: str, after_code: bool) -> str:
    """Backslash what Markdown would read as markup: emphasis, links, and what opens a block at the
    start of a line (not at the start of ``prose`` when it follows a code span on its line)."""
    def unblock(match: re.Match) -> str:
        indent, mark = match.groups()
        if after_code and match.start() == 0:
            return match.group(0)
        return indent + (mark + "\\" if mark[0].isdigit() else "\\" + mark)

    return _BLOCK_START.sub(unblock, _INLINE_MARKUP.sub(r"\\\g<0>", prose))


def _code_span(code: str) -> str:
    ticks = "`" * (max(map(len, re.findall("`+", code)), default=0) + 1)
    pad = " " if code.startswith("`") or code.endswith("`") else ""
    return f"{ticks}{pad}{code}{pad}{ticks}"


def _code_block(code: str) -> list[str]:
    fence = "`" * max(3, max(map(len, re.findall("`+", code)), default=0) + 1)
    return [f"{fence}python", code.rstrip("\n"), fence]


def _write_atomically(path: Path, text: str) -> None:
    """Write a temporary file beside ``path``, then rename it over: a reader never sees half a page."""
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="\n") as file:
            file.write(text)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


if __name__ == "__main__":
    sys.exit(main())
