"""``--add-noqa``: every current finding gets its directive, and the next check is clean."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from migrate.noqa import add_directives

LOOP = textwrap.dedent("""\
    import torch


    def train(model, optimizer, loader, scaler):
        for x in loader:
            with torch.autocast("cuda"):
                loss = model(x)
            scaler.scale(loss).backward()  # the step
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            print(loss.item())  # noqa: E501
        message = f\"\"\"done
        {loss.item()}\"\"\"
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, "last.pt")
    """)


def _ampmigrate(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "migrate", *args], cwd=cwd, capture_output=True, text=True)


@pytest.mark.parametrize(("select", "count"), [("AMP1", 3), ("AMP100,AMP101", 2)])
def test_added_directives_silence_every_finding_and_nothing_else_changes(tmp_path, select, count):
    (tmp_path / "train.py").write_text(LOOP)
    before = _ampmigrate("--check", "--select", select, "--output-format", "json", "train.py", cwd=tmp_path)
    assert before.returncode == 1
    added = _ampmigrate("--add-noqa", "--select", select, "train.py", cwd=tmp_path)
    assert added.returncode == 0, added.stderr
    assert f"Added {count} noqa directives to 1 file." in added.stderr
    after = (tmp_path / "train.py").read_text()
    assert "clip_grad_norm_(model.parameters(), 1.0)  # noqa: AMP101" in after
    assert "print(loss.item())  # noqa: E501, AMP100" in after  # added to the directive there
    # only comments were added: the code is the same
    assert [line.split("  # noqa")[0] for line in after.splitlines()] == [line.split("  # noqa")[0] for line in LOOP.splitlines()]
    again = _ampmigrate("--check", "--select", select, "train.py", cwd=tmp_path)
    assert again.returncode == 0, again.stdout
    # a second run adds nothing
    assert "Added 0 noqa directives to 0 files." in _ampmigrate("--add-noqa", "--select", select, "train.py", cwd=tmp_path).stderr


def test_add_noqa_refuses_a_diff_and_standard_input(tmp_path):
    (tmp_path / "train.py").write_text(LOOP)
    for args in (("--add-noqa", "--diff", "train.py"), ("--add-noqa", "-")):
        result = _ampmigrate(*args, cwd=tmp_path)
        assert result.returncode == 2 and "--add-noqa" in result.stderr
    assert (tmp_path / "train.py").read_text() == LOOP


@pytest.mark.parametrize(("line", "expected"), [
    ("x = a.item()", "x = a.item()  # noqa: AMP100"),
    ("x = a.item()  # why", "x = a.item()  # noqa: AMP100 # why"),
    ("x = a.item()  # noqa: E501", "x = a.item()  # noqa: E501, AMP100"),
    ("x = a.item()  # noqa", "x = a.item()  # noqa"),
    ("x = a.item()  # noqa: AMP100", "x = a.item()  # noqa: AMP100"),
    ("x = '#' + a.item()", "x = '#' + a.item()  # noqa: AMP100"),
    ("x = a.item()\r", "x = a.item()  # noqa: AMP100\r"),
])
def test_a_directive_joins_what_the_line_has(line, expected):
    assert add_directives(line + "\ny = 1\n", [(1, "AMP100")])[0] == expected + "\ny = 1\n"


def test_a_finding_in_a_multiline_string_or_continuation_gets_its_directive_where_noqa_reads_it():
    text = 'w = """\nmulti""" + d.item()\nv = f(e) + \\\n    g.item()\n'
    new, added = add_directives(text, [(1, "AMP100"), (3, "AMP100")])
    assert added == 2
    assert new == 'w = """\nmulti""" + d.item()  # noqa: AMP100\nv = f(e) + \\\n    g.item()  # noqa: AMP100\n'
