"""Which file an import names, relative or absolute."""
from __future__ import annotations

from pathlib import Path

import pytest

from migrate.module_paths import find_on_disk, is_module

_ROOT = Path("/project")
_IMPORTER = _ROOT / "pkg" / "engine" / "train.py"


@pytest.mark.parametrize(("path", "level", "parts", "named"), [
    (_ROOT / "pkg" / "utils" / "misc.py", 2, ["utils", "misc"], True),  # from ..utils import misc
    (_ROOT / "pkg" / "utils" / "misc" / "__init__.py", 2, ["utils", "misc"], True),
    (_ROOT / "pkg" / "engine" / "utils" / "misc.py", 2, ["utils", "misc"], False),  # one level too deep
    (_ROOT / "pkg" / "engine" / "helpers.py", 1, ["helpers"], True),  # from .helpers import x
    (_ROOT / "pkg" / "utils" / "misc.py", 0, ["pkg", "utils", "misc"], True),  # import pkg.utils.misc
    (Path("/elsewhere/src/pkg/utils/misc.py"), 0, ["pkg", "utils", "misc"], True),  # wherever the root is
    (_ROOT / "pkg" / "utils" / "other_misc.py", 0, ["utils", "misc"], False),
    (_ROOT / "misc.py", 9, ["misc"], False),  # above the root
    (_ROOT / "misc.py", 0, [], False),
])
def test_is_module(path, level, parts, named):
    assert is_module(path, _IMPORTER, level, parts) is named


def test_find_on_disk_looks_in_the_folders_above_and_stops(tmp_path):
    (tmp_path / "pkg" / "utils").mkdir(parents=True)
    (tmp_path / "pkg" / "engine").mkdir()
    misc = tmp_path / "pkg" / "utils" / "misc.py"
    misc.write_text("")
    importer = tmp_path / "pkg" / "engine" / "train.py"
    assert find_on_disk(importer, 0, ["pkg", "utils", "misc"], folders_up=8) == misc
    assert find_on_disk(importer, 2, ["utils", "misc"], folders_up=8) == misc
    assert find_on_disk(importer, 0, ["pkg", "utils", "misc"], folders_up=1) is None  # the root is two up
    assert find_on_disk(importer, 0, ["pkg", "utils", "nothing"], folders_up=8) is None
