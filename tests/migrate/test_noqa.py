"""``# noqa`` and ``# ampmigrate: skip-file``: what a user suppresses stays unreported and unfixed."""
from __future__ import annotations

import pytest

from migrate.api import migrate_source
from migrate import noqa, quiet
from migrate.noqa import Directives, skips_file

SCALER = "import torch\nscaler = torch.cuda.amp.GradScaler(){comment}\n"
FIXED = 'import torch\nscaler = torch.amp.GradScaler("cuda"){comment}\n'
RULES = ["AMP02", "AMP800"]  # the deprecated spellings (opt-in) and unused-noqa


def _run(source: str, **options):
    return migrate_source(source, "train.py", select=options.pop("select", RULES), **options)


def _codes(result) -> list[str]:
    return [d.code for d in result.diagnostics]


@pytest.mark.parametrize(
    "comment",
    ["  # noqa: AMP021", "  # noqa:AMP021", "  # NOQA: AMP021", "  # noqa: AMP020, AMP021", "  # noqa: E501 AMP021", "  # noqa"],
)
def test_a_directive_on_the_line_suppresses_the_finding_and_its_fix(comment):
    source = SCALER.format(comment=comment)
    result = _run(source)
    assert "AMP021" not in _codes(result)
    assert result.new_source.startswith(source.split("\n")[0]) and "torch.cuda.amp.GradScaler()" in result.new_source


@pytest.mark.parametrize("comment", ["  # noqa: AMP020", "  # noqa: E501", "  # noqa-ish", "  # not noqa: AMP021 really"])
def test_a_directive_for_other_codes_suppresses_nothing(comment):
    result = _run(SCALER.format(comment=comment), select=["AMP02"])
    assert _codes(result) == ["AMP021"]
    assert result.new_source == FIXED.format(comment=comment)


def test_the_line_of_a_multi_line_statement_is_where_it_starts():
    on_first = "import torch\nscaler = torch.cuda.amp.GradScaler(  # noqa: AMP021\n    init_scale=1024,\n)\n"
    assert _codes(_run(on_first)) == []
    on_last = "import torch\nscaler = torch.cuda.amp.GradScaler(\n    init_scale=1024,\n)  # noqa: AMP021\n"
    result = _run(on_last)
    # as in Ruff: the directive is on a line where nothing is reported, so it is unused, and the fix is made
    assert sorted(_codes(result)) == ["AMP021", "AMP800"]
    assert result.new_source == 'import torch\nscaler = torch.amp.GradScaler(\n    "cuda", init_scale=1024,\n)\n'


def test_a_backslash_continued_statement_takes_its_directive_on_the_last_line():
    source = "import torch\nscaler = torch.cuda.amp.GradScaler() if \\\n    True else None  # noqa: AMP021\n"
    assert _codes(_run(source)) == []


def test_lines_of_a_multi_line_string_and_continuations_map_to_the_directive_line():
    directives = Directives('x = """\none\ntwo\n"""  # noqa: AMP001\ny = 1 + \\\n    2 + \\\n    3  # noqa\nz = 3  # noqa: AMP002\n')
    assert sorted(directives.by_row) == [4, 7, 8]
    assert [directives.suppresses(row, "AMP001") for row in (1, 2, 3, 4)] == [True] * 4
    assert [directives.suppresses(row, "AMP009") for row in (5, 6, 7)] == [True] * 3  # bare: any code
    assert not directives.suppresses(8, "AMP001") and directives.suppresses(8, "AMP002")


def test_a_string_continued_with_a_backslash_takes_the_directive_on_the_last_line():
    directives = Directives('x = """\none\n""" + \\\n    y  # noqa: AMP001\n')
    assert [directives.suppresses(row, "AMP001") for row in (1, 2, 3, 4)] == [True] * 4


def test_a_directive_inside_a_string_is_no_directive():
    directives = Directives('text = "# noqa: AMP021"\nother = 1\n')
    assert not directives


LARGE_SHAPES = (
    'x = """\none\ntwo\n"""  # noqa: AMP001\ny = 1 + \\\n    2 + \\\n    3  # noqa\n',
    'text = "# noqa: AMP021"\nother = 1\n',
    '@decorator  # noqa: AMP010\ndef f(\n    a,  # noqa: AMP011\n):\n    return """\n    # noqa: AMP012\n    """  # noqa\n',
    "# a comment line between statements  # noqa: AMP013\n\nclass A:\n    x = 1; y = 2  # noqa: AMP014\n",
    "z = [\n    1,\n    2,\n]  # NOQA:AMP015\n",
)


def test_a_large_text_is_read_around_its_directives_as_it_is_read_whole(monkeypatch):
    filler = "".join(f'def f{i}(a, b):\n    """Adds.\n\n    Twice."""\n    return a + b  # {i}\n\n\n' for i in range(1500))
    text = "import torch\n" + filler.join(LARGE_SHAPES) + "done = True  # noqa: AMP016\n"
    read: list[str] = []
    real = noqa.tokenize.generate_tokens
    monkeypatch.setattr(noqa.tokenize, "generate_tokens", lambda readline: real(_recorded(readline, read)))

    with quiet.trees_kept():
        quiet.parse(text)  # as the run's cut of a large file into pieces does
        read.clear()
        around = Directives(text)
    around_read = sum(map(len, read))
    whole = Directives(text)  # no tree at hand

    assert len(whole.by_row) == 9
    assert _covering(around, text) == _covering(whole, text)  # each line's directive, if any
    assert around_read < len(text) // 50  # the statements around the directives only


def _covering(directives: Directives, text: str) -> dict[int, tuple]:
    """The directive that covers each row that has one."""
    found = {}
    for row in range(1, text.count("\n") + 2):
        directive = directives.by_row.get(directives._moved.get(row, row))
        if directive is not None:
            found[row] = (directive.row, directive.start, directive.comment_start, directive.end, directive.codes)
    return found


def _recorded(readline, read: list[str]):
    def reading() -> str:
        line = readline()
        read.append(line)
        return line
    return reading


def test_skip_file_leaves_the_whole_file_alone():
    source = "# ampmigrate: skip-file\n" + SCALER.format(comment="")
    result = _run(source)
    assert result.diagnostics == () and result.new_source == source
    assert skips_file("x = 1\n    # ampmigrate: skip-file  \n")
    assert not skips_file('x = "# ampmigrate: skip-file for now"\n')  # not a line of its own


def test_an_unused_directive_is_reported_and_removed():
    result = _run("import torch\nx = torch.ones(1)  # noqa: AMP021\n")
    assert _codes(result) == ["AMP800"]
    finding = result.diagnostics[0]
    assert (finding.location.row, finding.location.column, finding.end_location.column) == (2, 20, 34)
    assert "unused: AMP021" in finding.message and finding.fix.applicability == "safe"
    assert result.new_source == "import torch\nx = torch.ones(1)\n"


def test_only_the_unused_codes_of_a_list_are_removed():
    result = _run(SCALER.format(comment="  # noqa: AMP021, AMP020, E501"))
    assert _codes(result) == ["AMP800"] and "unused: AMP020" in result.diagnostics[0].message
    assert result.new_source == SCALER.format(comment="  # noqa: AMP021, E501")


def test_a_code_no_rule_has_is_reported_as_unknown():
    result = _run("x = 1  # noqa: AMP999\n")
    assert _codes(result) == ["AMP800"] and "unknown: AMP999" in result.diagnostics[0].message
    assert result.new_source == "x = 1\n"


@pytest.mark.parametrize(
    ("line", "fixed"),
    [
        ("x = 1  # type: ignore  # noqa: AMP021\n", "x = 1  # type: ignore\n"),
        ("    # noqa: AMP021 why\n", "    # why\n"),
        ("x = 1  # noqa: AMP021  # the old loader\n", "x = 1  # the old loader\n"),
    ],
)
def test_the_rest_of_the_comment_stays(line, fixed):
    head = "if True:\n    y = 0\n"
    assert _run(head + line.replace("x =", "    x =")).new_source == head + fixed.replace("x =", "    x =")


def test_directives_of_rules_that_did_not_run_bare_ones_and_other_tools_are_not_judged():
    source = "x = 1  # noqa: AMP021\ny = 2  # noqa\nz = 3  # noqa: F401\n"
    assert _run(source, select=["AMP001", "AMP800"]).diagnostics == ()
    assert _run(source, select=["AMP02"]).diagnostics == ()  # AMP800 not selected


def test_a_directive_naming_amp800_is_never_reported_unused():
    assert _run("x = 1  # noqa: AMP800, AMP021\n").diagnostics == ()


def test_check_reports_without_removing():
    source = "x = 1  # noqa: AMP021\n"
    result = _run(source, fix=False)
    assert _codes(result) == ["AMP800"] and result.new_source == source


def test_a_plain_run_reports_an_unused_directive_in_a_file_without_amp_code():
    result = migrate_source("import os  # noqa: AMP001\n", "util.py")
    assert _codes(result) == ["AMP800"] and result.new_source == "import os\n"
    assert migrate_source("import os  # noqa: F401\n", "util.py").diagnostics == ()


def test_suppressing_one_part_of_the_apex_rewrite_leaves_the_whole_rewrite_undone():
    source = (
        "from apex import amp\n"
        "model, optimizer = amp.initialize(model, optimizer, opt_level='O1')  # noqa: AMP002\n"
        "for x, y in loader:\n"
        "    loss = criterion(model(x), y)\n"
        "    with amp.scale_loss(loss, optimizer) as scaled:\n"
        "        scaled.backward()\n"
        "    optimizer.step()\n"
    )
    result = migrate_source(source, "train.py")
    assert result.new_source == source  # no scaler.scale(...) without the scaler the suppressed fix makes
    assert "AMP003" in _codes(result) and all(d.fix is None for d in result.diagnostics)
    assert all("a `# noqa` suppresses another part of the same rewrite" in d.message for d in result.diagnostics)
    assert migrate_source(source.replace("  # noqa: AMP002", ""), "train.py").changed  # the rewrite, otherwise


def test_line_ends_and_form_feeds_are_kept_when_a_directive_is_removed():
    source = "import torch\r\n\x0c\r\nx = torch.ones(1)  # noqa: AMP021\r\ny = 2\r\n"
    assert _run(source).new_source == "import torch\r\n\x0c\r\nx = torch.ones(1)\r\ny = 2\r\n"


def test_the_command_line_exits_0_on_a_suppressed_finding_and_fixes_an_unused_directive(tmp_path):
    from click.testing import CliRunner

    from migrate.cli import main

    (tmp_path / "pyproject.toml").write_text('[tool.ampmigrate]\nextend-select = ["AMP02"]\n')
    path = tmp_path / "train.py"
    path.write_text(SCALER.format(comment="  # noqa: AMP021"))
    assert CliRunner().invoke(main, ["--check", str(path)]).exit_code == 0
    path.write_text("import torch\nx = torch.ones(1)  # noqa: AMP021, AMP001\n")
    result = CliRunner().invoke(main, ["--check", str(path)])
    assert result.exit_code == 1 and f"{path}:2:20: AMP800 Unused `noqa` directive (unused: AMP021, AMP001)" in result.output
    assert CliRunner().invoke(main, [str(path)]).exit_code == 1
    assert path.read_text() == "import torch\nx = torch.ones(1)\n"
    assert CliRunner().invoke(main, ["--check", str(path)]).exit_code == 0


def test_a_noqa_a_fix_writes_is_judged_by_the_rule_it_names_and_a_stale_one_still_goes():
    from migrate.api import migrate_source

    # the apex rewrite marks the clip it leaves on scaled gradients `# noqa: AMP101`; the original
    # text never gave AMP101 a reason to run (no "scaler" in it), the fixed text does
    source = (
        "import torch\nfrom apex import amp\n\n"
        'model, optimizer = amp.initialize(model, optimizer, opt_level="O1")\n'
        "for x in loader:\n"
        "    loss = model(x)  # noqa: AMP101\n"
        "    with amp.scale_loss(loss, optimizer) as scaled_loss:\n"
        "        scaled_loss.backward()\n"
        "        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
        "    optimizer.step()\n"
    )
    result = migrate_source(source, "train.py")
    assert "    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # noqa: AMP101" in result.new_source
    assert "loss = model(x)\n" in result.new_source  # the directive that suppressed nothing went
    assert [d.code for d in result.diagnostics if d.code == "AMP800"] == ["AMP800"]
    again = migrate_source(result.new_source, "train.py")
    assert again.diagnostics == () and again.new_source == result.new_source
