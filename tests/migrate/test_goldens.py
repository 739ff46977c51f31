"""Golden cases: every ``fixtures/migrate/<case>.in.py`` rewritten must equal ``<case>.out.py``.

``<case>.unsafe.out.py``, when present, is the output with unsafe fixes; without it, unsafe fixes
must not change the output. Each output must compile, a second run must change nothing, and
every apex call left in it must be reported at its line. Negative controls have an ``.out.py``
equal to their ``.in.py``. Regenerate with ``pytest tests/migrate/test_goldens.py --update-goldens``
(or ``AMPMIGRATE_UPDATE_GOLDENS=1``) and review the diff.
"""
from __future__ import annotations

import os
from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider, QualifiedNameProvider, QualifiedNameSource

from migrate.api import migrate_source

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "migrate"
CASES = sorted(FIXTURES.glob("*.in.py"))


def _migrate(source: str, name: str, unsafe_fixes: bool):
    result = migrate_source(source, name, unsafe_fixes=unsafe_fixes)
    assert result.error is None, result.error
    return (result.new_source if result.new_source is not None else source), result.diagnostics


def _updating(request) -> bool:
    return bool(request.config.getoption("--update-goldens", default=False) or os.environ.get("AMPMIGRATE_UPDATE_GOLDENS"))


def _apex_call_lines(source: str) -> list[int]:
    """Lines of every call or decorator that still resolves to something in apex (or its kernels)."""
    lines: list[int] = []

    class _Calls(cst.CSTVisitor):
        METADATA_DEPENDENCIES = (QualifiedNameProvider, PositionProvider)

        def _from_apex(self, node: cst.CSTNode) -> bool:
            return any(
                q.source is QualifiedNameSource.IMPORT and q.name.split(".")[0] in ("apex", "amp_C", "apex_C")
                for q in self.get_metadata(QualifiedNameProvider, node, set())
            )

        def visit_Call(self, node: cst.Call) -> None:
            if self._from_apex(node.func):
                lines.append(self.get_metadata(PositionProvider, node).start.line)

        def visit_Decorator(self, node: cst.Decorator) -> None:
            if self._from_apex(node.decorator):
                lines.append(self.get_metadata(PositionProvider, node).start.line)

    MetadataWrapper(cst.parse_module(source)).visit(_Calls())
    return lines


@pytest.mark.parametrize("path", CASES, ids=[p.name[: -len(".in.py")] for p in CASES])
def test_golden(path: Path, request):
    name = path.name[: -len(".in.py")]
    source = path.read_text(encoding="utf-8")
    expected_path = path.with_name(f"{name}.out.py")
    unsafe_path = path.with_name(f"{name}.unsafe.out.py")
    output, diagnostics = _migrate(source, path.name, unsafe_fixes=False)
    unsafe_output = output
    if any(d.fix is not None and not d.applied for d in diagnostics):  # else unsafe fixes change nothing
        unsafe_output, _ = _migrate(source, path.name, unsafe_fixes=True)
    if _updating(request):
        expected_path.write_text(output, encoding="utf-8")
        if unsafe_output != output:
            unsafe_path.write_text(unsafe_output, encoding="utf-8")
        elif unsafe_path.exists():
            unsafe_path.unlink()
    assert output == expected_path.read_text(encoding="utf-8")
    expected_unsafe = unsafe_path.read_text(encoding="utf-8") if unsafe_path.exists() else output
    assert unsafe_output == expected_unsafe

    runs = [(False, output)] + ([(True, unsafe_output)] if unsafe_output != output else [])
    for unsafe_fixes, text in runs:
        compile(text, f"{name}.out.py", "exec", dont_inherit=True)
        again, diagnostics = _migrate(text, path.name, unsafe_fixes=unsafe_fixes)
        assert again == text, "a second run changed the output again"
        reported = [(d.location.row, d.end_location.row) for d in diagnostics]
        for line in _apex_call_lines(text):
            assert any(start <= line <= end for start, end in reported), f"apex call at line {line} left unreported"


def test_there_are_enough_golden_cases():
    assert len(CASES) >= 40
