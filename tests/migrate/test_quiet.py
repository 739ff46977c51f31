"""Python's warnings about the user's code (read with ``ast`` or compiled to check fixes) are not printed."""
from __future__ import annotations

import ast
import gc
import os
import subprocess
import sys
import warnings

from migrate import quiet

# An apex O1 loop with what Python warns about: an invalid escape sequence (a SyntaxWarning from
# Python 3.12, a DeprecationWarning before) and `is not` with a literal (a SyntaxWarning when compiled).
LEGACY = '''from apex import amp
import re

model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
for x, y in loader:
    loss = model(x)
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
    if re.match("\\d+", y) is not "":
        print("matched")
'''


def test_parse_records_no_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet.parse(LEGACY)
        warnings.warn("still heard", UserWarning)  # the caller's filters are back once it returns
    assert [str(w.message) for w in caught] == ["still heard"]


def test_a_run_prints_no_warning_about_the_users_code(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(LEGACY)
    env = {**os.environ, "PYTHONWARNINGS": "default"}  # every warning shown, DeprecationWarning included
    for args in (["--check"], []):
        run = subprocess.run([sys.executable, "-m", "migrate", *args, str(script)], capture_output=True, text=True,
                             env=env, cwd=tmp_path)
        assert "Warning" not in run.stderr, run.stderr
    assert "scaler.scale(loss).backward()" in script.read_text()  # the fixes were written


def test_a_parse_runs_without_the_cycle_collector_and_gives_it_back():
    source = "table = [" + ", ".join(f"({i}, [{i}])" for i in range(20_000)) + "]\n"
    collections = []

    def record(phase, info):
        collections.append(phase)

    gc.callbacks.append(record)
    try:
        assert gc.isenabled()
        quiet.parse(source)
    finally:
        gc.callbacks.remove(record)

    # 100,000 nodes made: the collector ran 285 times while ast made them; once, at most, as it is given back
    assert collections.count("start") <= 1
    assert gc.isenabled()


def test_a_module_parsed_again_within_trees_kept_is_not_parsed_again(monkeypatch):
    calls = []
    real_parse = ast.parse
    monkeypatch.setattr(ast, "parse", lambda source, mode="exec": calls.append(source) or real_parse(source, mode=mode))

    with quiet.trees_kept():
        first = quiet.parse("x = 1\n")
        assert quiet.parse("x = 1\n") is first
        assert quiet.parse("y = 2\n") is not first  # another text: parsed, and kept in its place
        quiet.parse("y", mode="eval")  # an expression is never kept
        assert quiet.parse("y = 2\n") is not first
    assert quiet.parse("y = 2\n") is not quiet.parse("y = 2\n")  # outside: each parse its own tree
    assert calls == ["x = 1\n", "y = 2\n", "y", "y = 2\n", "y = 2\n"]
