"""Jupyter notebooks: linted and migrated cell by cell, their JSON otherwise byte-identical."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from migrate.api import discover, migrate_paths, migrate_source
from migrate.cli import main

IMPORTS = ["import torch\n", "from torch import nn\n", "from apex import amp"]
SETUP = [
    "model = nn.Linear(16, 4).cuda()\n",
    "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n",
    "criterion = nn.CrossEntropyLoss()\n",
    "model, optimizer = amp.initialize(model, optimizer, opt_level=\"O1\")",
]
LOOP = [
    "%matplotlib inline\n",
    "for x, y in loader:\n",
    "    optimizer.zero_grad()\n",
    "    loss = criterion(model(x), y)\n",
    "    with amp.scale_loss(loss, optimizer) as scaled_loss:\n",
    "        scaled_loss.backward()\n",
    "    optimizer.step()\n",
]
MAGICS = ["!pip install apex\n", "files = !ls\n", "%load_ext autoreload\n", "amp?"]
CELL_MAGIC = ["%%capture\n", "from apex import amp\n", "amp.initialize(model)"]


def _code(source, count=None) -> dict:
    return {"cell_type": "code", "execution_count": count, "metadata": {}, "outputs": [], "source": source}


def _notebook(*cells, language="python") -> dict:
    return {
        "cells": [{"cell_type": "markdown", "metadata": {}, "source": ["# Training \u2014 caf\u00e9"]}, *cells],
        "metadata": {"language_info": {"name": language}, "kernelspec": {"name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


APEX_NOTEBOOK = _notebook(_code(IMPORTS, 1), _code(MAGICS, 2), _code(SETUP, 3), _code(CELL_MAGIC, 4), _code(LOOP, 5))


def _write(path, document, **layout) -> str:
    text = json.dumps(document, **{"indent": 1, "ensure_ascii": False, **layout}) + ("\n" if layout.get("indent", 1) != 2 else "")
    path.write_text(text, encoding="utf-8")
    return text


def _sources(text: str) -> list:
    return [cell["source"] for cell in json.loads(text)["cells"]]


@pytest.mark.parametrize(
    "layout",
    [dict(), dict(indent=2, ensure_ascii=True), dict(indent=4, sort_keys=True), dict(indent=None)],
    ids=["jupyter", "indent2-ascii-no-newline", "indent4-sorted", "one-line"],
)
def test_an_apex_notebook_is_migrated_cell_by_cell_and_only_its_code_changes(tmp_path, layout):
    path = tmp_path / "train.ipynb"
    before = _write(path, APEX_NOTEBOOK, **layout)
    [result] = migrate_paths([path])
    after = path.read_text(encoding="utf-8")
    assert result.error is None and result.changed
    sources = _sources(after)
    assert sources[1] == ["import torch\n", "from torch import nn"]  # the import went from its cell
    assert sources[3][-1] == 'scaler = torch.amp.GradScaler("cuda")'
    assert sources[5][0] == "%matplotlib inline\n" and "    scaler.scale(loss).backward()\n" in sources[5]
    assert sources[2] == MAGICS and sources[4] == CELL_MAGIC  # magics and the cell-magic cell as they were
    # everything but the changed sources is byte for byte what it was: the same layout, written again
    expected = json.loads(before)
    for index, source in enumerate(sources):
        expected["cells"][index]["source"] = source
    assert after == json.dumps(expected, **{"indent": 1, "ensure_ascii": False, **layout}) + (
        "\n" if before.endswith("\n") else ""
    )
    assert migrate_paths([path])[0].changed is False  # a second run changes nothing


def test_findings_are_placed_in_their_cell(tmp_path):
    path = tmp_path / "train.ipynb"
    _write(path, APEX_NOTEBOOK)
    [result] = migrate_paths([path], write=False, fix=False)
    where = {(d.code, d.location.cell, d.location.row, d.location.column) for d in result.diagnostics}
    assert ("AMP002", 4, 4, 1) in where  # amp.initialize: cell 4 of the notebook (a markdown cell first), row 4
    assert ("AMP003", 6, 5, 5) in where  # the with amp.scale_loss line of the loop cell
    output = CliRunner().invoke(main, ["--check", str(path)]).output
    assert f"{path}:cell 4:4:1: AMP002" in output


def test_a_cell_magic_cell_is_left_out_and_line_magics_are_kept(tmp_path):
    document = _notebook(_code(CELL_MAGIC), _code(MAGICS), _code(["import torch\n", "%time scaler = torch.cuda.amp.GradScaler()"]))
    text = json.dumps(document, indent=1)
    result = migrate_source(text, "nb.ipynb", select=["AMP0"], fix=False)
    assert result.error is None and result.diagnostics == ()  # the apex code in the %%capture cell is not Python
    result = migrate_source(
        json.dumps(_notebook(_code(["import torch\n", "!nvidia-smi\n", "scaler = torch.cuda.amp.GradScaler()"]))),
        "nb.ipynb", select=["AMP02"],
    )
    assert [(d.code, d.location.cell, d.location.row) for d in result.diagnostics] == [("AMP021", 2, 3)]
    assert _sources(result.new_source)[1] == ["import torch\n", "!nvidia-smi\n", 'scaler = torch.amp.GradScaler("cuda")']


def test_automagic_lines_are_kept_and_the_rest_of_their_cell_is_checked():
    cell = ["pip install -q torch\n", "cd ..\n", "ls -la\n", "import torch\n", "scaler = torch.cuda.amp.GradScaler()"]
    result = migrate_source(json.dumps(_notebook(_code(cell))), "nb.ipynb", select=["AMP02"])
    assert result.error is None, result.error
    assert _sources(result.new_source)[1] == [*cell[:4], 'scaler = torch.amp.GradScaler("cuda")']
    # a cell that parses as Python is read as Python, whatever its first word
    plain = ["time = 3\n", "run = time + 1"]
    assert migrate_source(json.dumps(_notebook(_code(plain))), "nb.ipynb").error is None


def test_a_magic_inside_a_block_keeps_the_indentation_the_fix_gives_it(tmp_path):
    loop = ["for x, y in loader:\n", "    %time loss = criterion(model(x), y)\n", "    loss = criterion(model(x), y)\n",
            "    with amp.scale_loss(loss, optimizer) as scaled_loss:\n", "        scaled_loss.backward()\n", "    optimizer.step()"]
    result = migrate_source(json.dumps(_notebook(_code(IMPORTS), _code(SETUP), _code(loop)), indent=1), "nb.ipynb")
    assert result.error is None, result.error
    cell = "".join(_sources(result.new_source)[3])
    assert "%time loss = criterion(model(x), y)\n" in cell and "_ampmigrate" not in cell
    compile(cell.replace("%time ", ""), "<cell>", "exec")


def test_noqa_and_skip_file_work_in_cells():
    scaler = ["import torch\n", "scaler = torch.cuda.amp.GradScaler()  # noqa: AMP021"]
    result = migrate_source(json.dumps(_notebook(_code(scaler))), "nb.ipynb", select=["AMP02"])
    assert result.diagnostics == () and not result.changed
    skip = ["# ampmigrate: skip-file\n", "import torch\n", "scaler = torch.cuda.amp.GradScaler()"]
    assert migrate_source(json.dumps(_notebook(_code(skip))), "nb.ipynb", select=["AMP02"]).diagnostics == ()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{not json "from apex import amp"', "not a notebook: the JSON does not parse"),
        ('{"worksheets": [{"cells": ["from apex import amp"]}]}', "no list of 'cells'"),
        ('{"cells": [{"cell_type": "code", "source": 3}, "apex"]}', "source of cell 1 is neither text nor a list of lines"),
    ],
)
def test_a_file_that_is_not_a_notebook_is_an_error_and_left_alone(tmp_path, text, message):
    # (like a .py file, one holding no word a rule looks for is skipped unread: these hold "apex")
    path = tmp_path / "broken.ipynb"
    path.write_text(text)
    result = CliRunner().invoke(main, [str(path)])
    assert result.exit_code == 2 and message in result.output
    assert path.read_text() == text


def test_a_syntax_error_in_a_cell_is_reported_in_that_cell(tmp_path):
    document = _notebook(_code(["from apex import amp\n"]), _code(["x = (\n"]))  # a notebook worth checking
    result = migrate_source(json.dumps(document), "nb.ipynb")
    assert result.error is not None
    assert result.diagnostics[0].location.cell == 3


def test_a_layout_that_cannot_be_written_back_exactly_is_reported_and_left_alone(tmp_path):
    path = tmp_path / "odd.ipynb"
    text = json.dumps(APEX_NOTEBOOK, indent=1).replace('"cells": [', '"cells":   [')
    path.write_text(text)
    [result] = migrate_paths([path])
    assert result.error is not None and "JSON layout" in result.error
    assert path.read_text() == text
    assert any(d.code == "AMP002" and not d.applied for d in result.diagnostics)  # still linted


def test_a_notebook_in_another_language_is_not_checked():
    document = _notebook(_code(["from apex import amp\n"]), language="R")
    assert migrate_source(json.dumps(document), "nb.ipynb").diagnostics == ()


def test_a_notebook_whose_code_holds_no_trigger_word_is_not_parsed(monkeypatch):
    # its outputs say `amp`, which lets it past the search of the whole file; its code, joined
    # with the cell boundaries and magic placeholders, holds no word a rule looks for
    document = _notebook(_code(["import os\n", "%load_ext autoreload\n"]), _code(["print(os.getcwd())\n"]))
    document["cells"][1]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["use_amp: True\n"]}]
    import migrate.engine

    def never(*args, **kwargs):
        raise AssertionError("parsed")

    monkeypatch.setattr(migrate.engine, "run_rules", never)
    result = migrate_source(json.dumps(document), "nb.ipynb")
    assert result.diagnostics == () and result.error is None


def test_a_folder_search_finds_notebooks_but_not_their_checkpoints(tmp_path):
    (tmp_path / ".ipynb_checkpoints").mkdir()
    for path in (tmp_path / "train.ipynb", tmp_path / ".ipynb_checkpoints" / "train-checkpoint.ipynb"):
        _write(path, APEX_NOTEBOOK)
    assert discover([tmp_path]) == [tmp_path / "train.ipynb"]


def test_a_word_at_the_start_of_a_line_of_a_one_string_source_is_found(tmp_path):
    from migrate.prefilter import may_apply

    cell = "import torch\nscaler = (torch.cuda.amp.\nGradScaler())"  # in the JSON: "...\\nGradScaler())"
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(_notebook(_code(cell))))
    assert not may_apply(path.read_text(), ("GradScaler",))  # the escape hides the word from a plain search
    [result] = migrate_paths([path], select=["AMP021"], write=False)
    assert [(d.code, d.location.cell, d.location.row) for d in result.diagnostics] == [("AMP021", 2, 2)]


def test_diff_shows_each_changed_cell_source_labelled_with_its_cell(tmp_path):
    path = tmp_path / "train.ipynb"
    before = _write(path, APEX_NOTEBOOK)
    result = CliRunner().invoke(main, ["--diff", str(path)])
    assert path.read_text(encoding="utf-8") == before  # --diff writes nothing
    out = result.stdout
    # the cells that change, numbered as findings number them (cell 1 is markdown); not the JSON
    headers = [line for line in out.splitlines() if line.startswith(("---", "+++"))]
    assert headers == [f"{sign} {path}:cell {n}" for n in (2, 4, 6) for sign in ("---", "+++")]
    assert '"source"' not in out and "cell_type" not in out
    cell_4 = out.split(f"+++ {path}:cell 4\n")[1].split("---")[0]
    assert cell_4.splitlines() == [
        "@@ -1,4 +1,4 @@",
        " model = nn.Linear(16, 4).cuda()",
        " optimizer = torch.optim.SGD(model.parameters(), lr=0.1)",
        " criterion = nn.CrossEntropyLoss()",
        '-model, optimizer = amp.initialize(model, optimizer, opt_level="O1")',
        '+scaler = torch.amp.GradScaler("cuda")',
    ]
    assert "%matplotlib inline" in out and "No newline" not in out  # a cell's unended last line is no change
    # the findings name the same cells
    check = CliRunner().invoke(main, ["--check", str(path)]).output
    assert f"{path}:cell 4:4:1: AMP002" in check


def test_github_and_sarif_output_name_the_cell_of_a_notebook_finding(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "train.ipynb", APEX_NOTEBOOK)
    github = CliRunner().invoke(main, ["--check", "--output-format", "github", "train.ipynb"]).stdout
    assert "title=AMP002 in cell 4%2C line 4::" in github
    sarif = json.loads(CliRunner().invoke(main, ["--check", "--output-format", "sarif", "train.ipynb"]).stdout)
    results = sarif["runs"][0]["results"]
    assert results and all(r["locations"][0]["logicalLocations"][0]["name"].startswith("cell ") for r in results)
    assert any(r["ruleId"] == "AMP002" and r["message"]["text"].startswith("cell 4, line 4: ") for r in results)


def test_diff_passes_over_what_is_not_a_cell(tmp_path):
    document = _notebook(_code(IMPORTS), _code(SETUP), _code(LOOP))
    document["cells"].insert(1, "a stray string among the cells")
    path = tmp_path / "odd.ipynb"
    _write(path, document)
    result = CliRunner().invoke(main, ["--diff", str(path)])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert [line for line in result.stdout.splitlines() if line.startswith("+++")] == [
        f"+++ {path}:cell {n}" for n in (3, 4, 5)
    ]
