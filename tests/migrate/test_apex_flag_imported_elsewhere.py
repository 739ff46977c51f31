"""An apex-availability flag another module imports stays set after the run.

Once the ``try: import apex / except ImportError: HAS_APEX = False`` guard goes, the flag is
always True: AMP018 folds its tests and, where the file itself no longer reads it, removes it.
Another module of the project may still import it (``from .engine import APEX_IMPORTED``,
``engine.HAS_APEX``); that module must still import, and see True. Generated projects vary the
flag's name, the guard, what the file does with apex behind the flag, and how the other module
reaches the flag; each is migrated, imported with apex blocked, and migrated again (no change).
"""
from __future__ import annotations

import importlib
import itertools
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from migrate import importers
from migrate.api import migrate_paths

pytest.importorskip("torch")

FLAGS = ["HAS_APEX", "APEX_IMPORTED", "apex_available", "APEX_IS_AVAILABLE", "_has_amp", "AMP_INSTALLED"]
GUARDS = {
    "import_error": "try:\n    from apex.parallel import DistributedDataParallel as DDP\n    {flag} = True\n"
                    "except ImportError:\n    {flag} = False\n",
    "bare": "try:\n    from apex.parallel import DistributedDataParallel as DDP\n    {flag} = True\n"
            "except:\n    print('install apex')\n    {flag} = False\n",
    "default_first": "{flag} = False\ntry:\n    from apex.parallel import DistributedDataParallel as DDP\n"
                     "    {flag} = True\nexcept ModuleNotFoundError:\n    pass\n",
}
USES = {
    "and": "\n\ndef wrap(model, use_apex):\n    if use_apex and {flag}:\n        model = DDP(model)\n    return model\n",
    "if_else": "\n\ndef wrap(model):\n    if {flag}:\n        return DDP(model)\n    else:\n        return model\n",
    "value_too": "\n\ndef wrap(model):\n    if {flag}:\n        model = DDP(model)\n    print('apex', {flag})\n    return model\n",
}
# How another module reaches the flag: {m} the exporter module, {pkg} its package.
IMPORTERS = [
    "from .{m} import {flag}\n\ngot = {flag}\n",
    "from {pkg}.{m} import {flag} as other\n\ngot = other\n",
    "from . import {m}\n\ngot = {m}.{flag}\n",
    "import {pkg}.{m} as module\n\ngot = module.{flag}\n",
    "from {pkg} import {m}\n\n\ndef read():\n    return {m}.{flag}\n\n\ngot = read()\n",
    "from .{m} import *\n\ngot = {flag}\n",
]
_packages = itertools.count()


def _import_fresh(root: Path, name: str):
    """``name`` imported from ``root`` with apex blocked; forgotten after."""
    saved = {key: sys.modules.pop(key) for key in list(sys.modules) if key == "apex" or key.startswith("apex.")}
    sys.modules["apex"] = None  # `import apex` raises ImportError
    sys.path.insert(0, str(root))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(root))
        top = name.split(".")[0]
        for key in [key for key in sys.modules if key == top or key.startswith(top + ".")]:
            del sys.modules[key]
        sys.modules.pop("apex", None)
        sys.modules.update(saved)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flag=st.sampled_from(FLAGS), guard=st.sampled_from(sorted(GUARDS)), use=st.sampled_from(sorted(USES)),
       importer=st.sampled_from(IMPORTERS), one_file_given=st.booleans())
def test_a_flag_another_module_imports_is_still_there_and_true(tmp_path_factory, flag, guard, use, importer, one_file_given):
    if "*" in importer and flag.startswith("_"):
        importer = IMPORTERS[0]  # a star import takes no private name: nothing of the flag's to keep
    root = tmp_path_factory.mktemp("project")
    (root / "setup.py").write_text("")
    package = f"flag_pkg_{next(_packages)}"
    (root / package).mkdir()
    (root / package / "__init__.py").write_text("")
    exporter = root / package / "engine.py"
    exporter.write_text("import torch\n" + GUARDS[guard].format(flag=flag) + USES[use].format(flag=flag))
    (root / package / "user.py").write_text(importer.format(m="engine", pkg=package, flag=flag))

    results = migrate_paths([exporter] if one_file_given else [root])
    assert not any(d.code.startswith("E") for result in results for d in result.diagnostics), results
    migrated = exporter.read_text()
    assert "from apex" not in migrated and "import apex" not in migrated, migrated
    assert _import_fresh(root, f"{package}.user").got is True, migrated
    # its own tests are folded all the same (a star import also takes `DDP`, which then stays
    # bound, to torch's class, inside the guard: the guard and the flag's two values stay too)
    if use != "value_too" and "*" not in importer:
        assert migrated.count(flag) == 1, migrated
    again = migrate_paths([root])
    assert exporter.read_text() == migrated, "a second run changed it again"
    assert not any(d.applied for result in again for d in result.diagnostics)


@pytest.mark.parametrize("flag", FLAGS)
def test_a_flag_no_other_module_imports_goes(tmp_path, flag):
    (tmp_path / "setup.py").write_text("")
    (tmp_path / "engine.py").write_text("import torch\n" + GUARDS["import_error"].format(flag=flag)
                                        + USES["and"].format(flag=flag))
    (tmp_path / "user.py").write_text("from engine import wrap\n")
    migrate_paths([tmp_path])
    migrated = (tmp_path / "engine.py").read_text()
    assert flag not in migrated and "apex" not in migrated.lower().replace("use_apex", ""), migrated


def test_flags_count_as_names_other_modules_may_import():
    text = "try:\n    import apex\n    HAS_APEX = True\nexcept ImportError:\n    HAS_APEX = False\nuse_fp16 = True\n"
    assert importers.apex_bound_names(text) == {"apex", "HAS_APEX"}
