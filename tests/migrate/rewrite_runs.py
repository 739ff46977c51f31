"""The compare run the slow migrate tests share: a script on ampshim against its safe rewrite."""
from __future__ import annotations

import shutil
from pathlib import Path

from migrate.api import migrate_paths, migrate_source


def compare_with_its_rewrite(folder: Path, script: str = "train.py", steps: int = 4):
    """Copy ``folder`` (the apex project, ``script`` in it) beside itself, migrate the copy in a
    safe run, and compare the two on the CPU: the ``compare`` result."""
    from ampshim.compare import Target, compare

    migrated = folder.parent / f"{folder.name}-migrated"
    shutil.copytree(folder, migrated)
    migrate_paths([migrated])
    return compare(Target(str(folder / script)), Target(str(migrated / script)), [], device="cpu",
                   steps=steps, parallel=True, timeout=600)


def reasons_left_on_apex(source: str, unsafe: bool) -> list[str]:
    """The reasons a run (``unsafe``: with unsafe fixes) gives for leaving ``source``, a
    ``train.py`` that compiles, unchanged on apex; the test fails where it changed the file."""
    compile(source, "train.py", "exec")
    result = migrate_source(source, "train.py", unsafe_fixes=unsafe)
    assert result.new_source == source
    return [finding.message for finding in result.diagnostics if "not rewritten" in finding.message]
