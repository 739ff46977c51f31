"""The rule pages in docs/rules: fresh, one per code, saying what ``--explain`` says, and the
``--check`` that keeps them so."""
from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path

import pytest

from migrate.explain import explain, list_rules
from migrate.rule_pages import check_pages, main, page_path, write_pages

REPO = Path(__file__).resolve().parents[2]
PAGES = REPO / "docs" / "rules"
CODES = [line.split()[0] for line in list_rules().splitlines()[1:]]
_EXAMPLE_LABELS = ("Example", "Becomes", "Valid")
_FRAMEWORKS = "In each framework"


def test_the_repositorys_pages_are_fresh():
    problems = check_pages(PAGES)
    assert problems == [], "run `python -m migrate.rule_pages`:\n" + "\n".join(problems)


def test_every_listed_code_has_a_page_and_a_line_in_the_index():
    assert "AMP100" in CODES and "AMP900" in CODES and "AMP901" in CODES
    index = (PAGES / "index.md").read_text()
    for code in CODES:
        assert (PAGES / f"{code}.md").is_file(), code
        assert (REPO / page_path(code)).is_file(), code  # what the JSON output's "url" names
        assert f"| [{code}]({code}.md) |" in index, code


def test_page_path_is_relative_to_the_repository():
    assert page_path("amp100") == "docs/rules/AMP100.md"


@pytest.mark.parametrize("code", CODES)
def test_a_page_says_what_explain_says(code):
    page = (PAGES / f"{code}.md").read_text()
    said = explain(code)
    assert page.startswith(f"# {code}: ")
    assert _page_sections(page) == _explained_sections(said)
    assert _page_examples(page) == _explained_examples(said)
    assert _page_frameworks(page) == _explained_frameworks(said)
    assert ("(with `--unsafe-fixes`)" in page) == ("(with --unsafe-fixes)" in said)


@pytest.mark.parametrize("name", [*CODES, "index"])
def test_a_page_links_only_to_the_other_pages(name):
    """Relative links between the pages, no path of this machine: what ``mkdocs build --strict`` accepts."""
    text = (PAGES / f"{name}.md").read_text()
    assert str(REPO) not in text and "](/" not in text and "](http" not in text
    for target in re.findall(r"\]\(([^)]+)\)", text):
        assert (PAGES / target).is_file(), target


def test_check_reports_each_stale_missing_and_extra_page(tmp_path, capsys):
    write_pages(tmp_path)
    assert check_pages(tmp_path) == [] and main(["--check", str(tmp_path)]) == 0
    stale, missing, extra = tmp_path / "AMP100.md", tmp_path / "AMP020.md", tmp_path / "AMP999.md"
    stale.write_text(stale.read_text().replace("## Why is this bad?", "## Why"))
    missing.unlink()
    extra.write_text("# AMP999\n")
    capsys.readouterr()
    assert main(["--check", str(tmp_path)]) == 1
    printed = capsys.readouterr().out.splitlines()
    assert sorted(printed) == sorted(
        [f"stale: {stale.as_posix()}", f"missing: {missing.as_posix()}", f"extra: {extra.as_posix()}"]
    )
    assert not (tmp_path / "AMP020.md").exists() and "## Why\n" in stale.read_text()  # --check writes nothing


def test_writing_twice_changes_nothing_the_second_time(tmp_path):
    assert len(write_pages(tmp_path)) == len(CODES) + 1  # and the index
    before = {path.name: (path.stat().st_ino, path.stat().st_mtime_ns) for path in tmp_path.iterdir()}
    assert write_pages(tmp_path) == []
    assert {path.name: (path.stat().st_ino, path.stat().st_mtime_ns) for path in tmp_path.iterdir()} == before


def test_writing_replaces_only_the_stale_page_and_leaves_no_temporary_file(tmp_path):
    write_pages(tmp_path)
    stale = tmp_path / "AMP101.md"
    stale.write_text("old\n")
    os.chmod(stale, 0o640)
    assert write_pages(tmp_path) == [stale]
    assert check_pages(tmp_path) == []
    assert stale.stat().st_mode & 0o777 == 0o640  # the page keeps its mode
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted([*(f"{code}.md" for code in CODES), "index.md"])


def test_main_writes_the_pages_and_flags_an_extra_one(tmp_path, capsys):
    assert main([str(tmp_path)]) == 0
    assert f"wrote {len(CODES) + 1} of {len(CODES) + 1} pages" in capsys.readouterr().out
    (tmp_path / "AMP999.md").write_text("# gone\n")
    assert main([str(tmp_path)]) == 1
    assert "extra:" in capsys.readouterr().out and (tmp_path / "AMP999.md").exists()  # never deleted


def test_prose_is_markdown_not_rest():
    """``code`` becomes `code`, and prose that Markdown would read as markup is escaped."""
    page = (PAGES / "AMP005.md").read_text()
    assert "``" not in _prose(page) and "`amp.state_dict()`" in page
    assert r"2\*\*16" in page  # not the start of bold text


# What the terminal and the page say, each read back in its own syntax.


def _explained_sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) of each docstring section ``explain`` prints, up to its "Fix:" line."""
    docstring = text.split("\n\nFix: ", 1)[0].split("\n\n", 1)[1]
    parts = re.split(r"(?:^|\n\n)([A-Z][A-Za-z ]+[:?])\n", docstring)
    return [(heading.rstrip(":"), _words(body.replace("``", "`"))) for heading, body in zip(parts[1::2], parts[2::2])]


def _page_sections(page: str) -> list[tuple[str, str]]:
    parts = re.split(r"^## (.+)\n", _prose(page), flags=re.MULTILINE)
    return [(heading, _words(re.sub(r"\\(.)", r"\1", body)))
            for heading, body in zip(parts[1::2], parts[2::2]) if heading not in (*_EXAMPLE_LABELS, _FRAMEWORKS)]


def _page_frameworks(page: str) -> list[tuple[str, str]]:
    """(framework, how the rule applies) under the page's "In each framework"."""
    section = _prose(page).split(f"## {_FRAMEWORKS}\n", 1)[1] if f"## {_FRAMEWORKS}\n" in page else ""
    parts = re.split(r"^### (.+)\n", section, flags=re.MULTILINE)
    return [(name, _words(re.sub(r"\\(.)", r"\1", re.sub(r"^(Reported|Left alone):$", "", body, flags=re.MULTILINE))))
            for name, body in zip(parts[1::2], parts[2::2])]


def _explained_frameworks(text: str) -> list[tuple[str, str]]:
    """(framework, how the rule applies): the unindented lines after explain's "In each framework:"."""
    section = text.split(f"{_FRAMEWORKS}:\n\n", 1)[1] if f"{_FRAMEWORKS}:\n\n" in text else ""
    lines = [line for line in section.splitlines() if line and not line.startswith(" ")
             and line not in ("Reported:", "Left alone:")]
    return [(name, _words(how.replace("``", "`"))) for name, how in (line.split(": ", 1) for line in lines)]


def _explained_examples(text: str) -> list[str]:
    """The indented blocks after "Example:", "Becomes ...:" and "Valid:"."""
    blocks = re.findall(r"^(?:Example|Becomes[^\n]*|Valid|Reported|Left alone):\n\n((?:(?:    [^\n]*)?\n)+)", text, flags=re.MULTILINE)
    return [textwrap.dedent(block).strip("\n") for block in blocks]


def _page_examples(page: str) -> list[str]:
    return [block.strip("\n") for block in re.findall(r"^```python\n(.*?)\n```$", page, flags=re.MULTILINE | re.DOTALL)]


def _prose(page: str) -> str:
    """The page less its code blocks and the generator's comment."""
    return re.sub(r"^```python\n.*?\n```$|^<!--.*-->$", "", page, flags=re.MULTILINE | re.DOTALL)


def _words(text: str) -> str:
    return " ".join(text.split())
