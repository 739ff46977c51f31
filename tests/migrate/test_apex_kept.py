"""AMP006 where the project keeps real apex O1: apex never turns native autocast on, so a cast
decorator rewritten to cast "where autocast is on" casts nothing, and a float32-only kernel gets
apex's fp16 outputs. The rewrite is safe only where every ``amp.initialize`` of the project is
migrated (safely, in the same run) or absent; else it is unsafe, and its marker names the file.
AMP007 and AMP008 go the same way: while real apex O1 stays, it casts through its registry, and its
patched functions cast inside a disabled ``torch.autocast``, so both are then only reported."""
from __future__ import annotations

import pytest

from migrate import api
from migrate.apex_kept import kept_elsewhere

OPS = {  # the three forms AMP006 rewrites
    "call_form": "from apex import amp\n\n\ndef _kernel(x):\n    return x\n\n\npool = amp.float_function(_kernel)\n",
    "plain_function": "from apex import amp\n\n\n@amp.float_function\ndef pool(x):\n    return x\n",
    "autograd_forward": (
        "import torch\nfrom apex import amp\n\n\nclass Pool(torch.autograd.Function):\n    @staticmethod\n"
        "    @amp.float_function\n    def forward(ctx, x):\n        return x\n"
    ),
}
# the registry and the disabled region: the rule, the file, and what the rule does where no apex stays
REGISTRY_AND_REGION = {
    "registry": ("AMP007", "import torch\nfrom apex import amp\n\namp.register_half_function(torch, 'einsum')\n\n\n"
                 "def pool(x):\n    return torch.einsum('ij,ij->i', x, x)\n", "unsafe"),
    "disabled_region": ("AMP008", "from apex import amp\n\n\ndef pool(x):\n    with amp.disable_casts():\n"
                        "        return x.float().sum()\n", "safe"),
}
TRAIN = """\
import torch
from apex import amp

from ops import pool


def train(model, optimizer, loader):
    model, optimizer = amp.initialize(model, optimizer, opt_level="{level}")
    for x in loader:
        loss = pool(model(x)).mean()
        with amp.scale_loss(loss, optimizer) as scaled:
            scaled.backward()
        optimizer.step()
"""
SETUP = """\
from apex import amp

from engine import run


def main(model, optimizer, loader):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    run(model, optimizer, loader)
"""
ENGINE = """\
from apex import amp

from ops import pool


def run(model, optimizer, loader):
    for x in loader:
        loss = pool(model(x)).mean()
        with amp.scale_loss(loss, optimizer) as scaled:
            scaled.backward()
        optimizer.step()
"""
TEST_NET = """\
from apex import amp

from ops import pool


def evaluate(model, loader, fp16):
    amp_handle = amp.init(enabled=fp16)
    for x in loader:
        print(pool(model(x)))
"""
CASES = {  # what the project holds beside ops.py, what the run is given, and whether ops.py's rewrite is safe
    "no_initialize_elsewhere": (None, "the_project", True),
    "o1_migrated_in_the_same_run": ("O1", "the_project", True),
    "o1_on_disk_not_in_the_run": ("O1", "ops_only", False),
    "o2_left_on_apex_by_a_safe_run": ("O2", "the_project", False),
    "o1_halves_in_two_files_migrated_as_a_pair": ("pair", "the_project", True),
    "o1_initialize_half_alone_on_disk": ("pair", "ops_only", False),
    "run_time_opt_level_migrated_with_a_guard": ("{level}", "the_project", True),
    # the legacy handle switched apex's casts on as `initialize` did; a safe run leaves it where
    # its function (never called in its file) may not be the script's last act
    "legacy_init_left_by_a_safe_run": ("init", "the_project", False),
}
KEPT_AT = {"pair": "train.py:7", "init": "test_net.py:7"}


def _project(tmp_path, form: str, level: str | None):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "ops.py").write_text(OPS[form] if form in OPS else REGISTRY_AND_REGION[form][1])
    if level == "init":
        (tmp_path / "test_net.py").write_text(TEST_NET)
    elif level == "pair":
        (tmp_path / "train.py").write_text(SETUP)
        (tmp_path / "engine.py").write_text(ENGINE)
    elif level is not None:
        text = TRAIN.replace('"{level}"', "cfg.level") if level == "{level}" else TRAIN.replace("{level}", level)
        (tmp_path / "train.py").write_text(text)
    return tmp_path / "ops.py"


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("form", sorted(OPS))
def test_a_cast_decorator_is_safe_only_where_no_apex_initialize_stays(tmp_path, form, case):
    level, given, safe = CASES[case]
    ops = _project(tmp_path, form, level)
    paths = [str(ops)] if given == "ops_only" else [str(tmp_path)]
    [result] = [r for r in api.migrate_paths(paths, write=False) if r.filename.endswith("ops.py")]
    [finding] = [d for d in result.diagnostics if d.code == "AMP006"]
    assert finding.fix is not None
    assert (finding.fix.applicability.value == "safe") == safe, finding.fix.why_unsafe
    assert ("from apex" not in result.new_source) == safe  # a safe run makes only the safe rewrite
    if not safe:
        assert KEPT_AT.get(level, "train.py:8") in finding.fix.why_unsafe
        # --unsafe-fixes rewrites an O2 `initialize` of the run too: then nothing stays, and the
        # marker says so only where the file keeping it is not in the run
        [unsafe] = [r for r in api.migrate_paths(paths, write=False, unsafe_fixes=True) if r.filename.endswith("ops.py")]
        marked = "# TODO(ampmigrate): review, this rewrite is unsafe: apex's" in unsafe.new_source
        assert marked == (given == "ops_only"), unsafe.new_source  # the unused handle is rewritten too, marked there


@pytest.mark.parametrize("unsafe_fixes", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("form", sorted(REGISTRY_AND_REGION))
def test_the_registry_and_the_disabled_region_stay_where_apex_initialize_stays(tmp_path, form, case, unsafe_fixes):
    level, given, safe = CASES[case]
    code, _, where_none_stays = REGISTRY_AND_REGION[form]
    ops = _project(tmp_path, form, level)
    paths = [str(ops)] if given == "ops_only" else [str(tmp_path)]
    [result] = [r for r in api.migrate_paths(paths, write=False, unsafe_fixes=unsafe_fixes) if r.filename.endswith("ops.py")]
    [finding] = [d for d in result.diagnostics if d.code == code]
    # --unsafe-fixes rewrites an O2 `initialize` of the run too, and the unused handle of a function
    # the script may not end with (marked there)
    stays = not safe and not (unsafe_fixes and level in ("O2", "init") and given == "the_project")
    if stays:
        assert finding.fix is None, finding.fix
        assert KEPT_AT.get(level, "train.py:8") in finding.message, finding.message
        assert result.new_source is None or "amp." in result.new_source, result.new_source
    else:
        # the registration goes as safely as a safe run migrates the project's `initialize`: where
        # there is none, apex may start where no search looks; only --unsafe-fixes migrates an O2 one
        expected = "safe" if form == "registry" and level not in (None, "O2", "init") else where_none_stays
        assert finding.fix is not None, finding.message
        assert finding.fix.applicability.value == expected, finding.fix.why_unsafe
        applied = expected == "safe" or unsafe_fixes
        assert ("from apex" not in (result.new_source or "")) == applied, result.new_source


def test_only_files_using_the_decorators_are_told(tmp_path):
    _project(tmp_path, "call_form", "O2")
    texts = {path: path.read_text() for path in (tmp_path / "ops.py", tmp_path / "train.py")}
    assert kept_elsewhere(texts, {}, {}) == {tmp_path / "ops.py": ("train.py:8",)}


LAYOUTS = {  # where the file using apex's casts sits, beside a trainer that stays on apex (O2, a safe run)
    # no marker anywhere (an export, a copy): a folder with no `__init__.py`; the run holds the trainer
    "no_marker_own_folder": (None, "lib/layers/ops.py", "the_tree"),
    "no_marker_package": (None, "lib/layers/ops.py", "the_tree"),
    # a C++ extension's `setup.py` beside it, inside the repository: the trainer is the repository's
    "extension_setup_in_a_repository": (".git", "ext/ops.py", "ops_only"),
    "extension_setup_in_a_repository_whole": (".git", "ext/ops.py", "the_tree"),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("form", sorted(OPS) + sorted(REGISTRY_AND_REGION))
def test_the_trainer_is_found_where_no_marker_or_a_nested_one_bounds_the_project(tmp_path, form, layout):
    marker, where, given = LAYOUTS[layout]
    if marker:
        (tmp_path / marker).mkdir()
        (tmp_path / "ext").mkdir()
        (tmp_path / "ext" / "setup.py").write_text("from setuptools import setup\nsetup(name='ext')\n")
    ops = tmp_path / where
    ops.parent.mkdir(parents=True, exist_ok=True)
    if layout == "no_marker_package":
        for folder in (ops.parent, ops.parent.parent):
            (folder / "__init__.py").write_text("")
    ops.write_text(OPS[form] if form in OPS else REGISTRY_AND_REGION[form][1])
    (tmp_path / "train.py").write_text(TRAIN.replace("{level}", "O2"))
    paths = [str(ops)] if given == "ops_only" else [str(tmp_path)]
    [result] = [r for r in api.migrate_paths(paths, write=False) if r.filename.endswith("ops.py")]
    [finding] = [d for d in result.diagnostics if d.code in ("AMP006", "AMP007", "AMP008")]
    said = finding.message if finding.fix is None else finding.fix.why_unsafe
    assert finding.fix is None or finding.fix.applicability.value == "unsafe", finding
    assert "train.py:8" in said, said
    assert result.new_source is None or "amp." in result.new_source, result.new_source
