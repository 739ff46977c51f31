"""A file that initializes apex amp and scales its own losses, beside a module it imports (or that
imports it) which scales a loss too with apex's ``amp.scale_loss`` (an adversarial attack's
gradient step on the training optimizer). Where that module stays on apex, removing the file's
``amp.initialize`` would make apex raise "Amp state has not been initialized" there: the file is
left alone, in either mode, and says where; rewritten once nothing linked keeps apex."""
from __future__ import annotations

from pathlib import Path

import pytest

from migrate import api, files
from migrate.scale_kept import scaled_elsewhere

TRAIN = """\
import torch
from apex import amp

{import_line}


def main(model, opt, loader, check):
    model, opt = amp.initialize(model, opt, opt_level="O1")
    for epoch, (x, y) in enumerate(loader):
        if check and epoch:
            perturbation(model, x, y, opt)
        with amp.scale_loss(torch.nn.functional.cross_entropy(model(x), y), opt) as scaled:
            scaled.backward()
        opt.step()
        opt.zero_grad()
"""
ATTACKS = """\
import torch
from apex import amp


def perturbation(model, x, y, opt):
    delta = torch.zeros_like(x, requires_grad=True)
    loss = torch.nn.functional.cross_entropy(model(x + delta), y)
    with amp.scale_loss(loss, opt) as scaled:
        scaled.backward()
    return delta.grad.sign()


def evaluate(model, x, y, opt):
    return perturbation(model, x, y, opt).abs().mean()


def clamp(x, low, high):
    return torch.max(torch.min(x, high), low)
"""
IMPORTS = {"from_import": "from attacks import perturbation", "package_relative": "from .attacks import perturbation",
           "a_caller_of_it": "from attacks import clamp, evaluate as perturbation", "the_module": "import attacks"}


def _project(tmp_path, import_line: str, linked: bool = True):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    package = tmp_path / "pkg" if "from ." in import_line else tmp_path
    package.mkdir(exist_ok=True)
    if package != tmp_path:
        (package / "__init__.py").write_text("")
    body = TRAIN.format(import_line=import_line if linked else "from torch import nn")
    if not linked:
        body = body.replace("            perturbation(model, x, y, opt)\n", "            print(epoch)\n")
    (package / "train.py").write_text(body)
    (package / "attacks.py").write_text(ATTACKS)
    return package / "train.py"


@pytest.mark.parametrize("import_form", sorted(IMPORTS))
@pytest.mark.parametrize("given", ["the_project", "train_only"])
@pytest.mark.parametrize("unsafe_fixes", [False, True])
def test_initialize_stays_where_a_linked_module_keeps_apex_scale_loss(tmp_path, import_form, given, unsafe_fixes):
    train = _project(tmp_path, IMPORTS[import_form])
    paths = [str(train)] if given == "train_only" else [str(tmp_path)]
    [result] = [r for r in api.migrate_paths(paths, write=False, unsafe_fixes=unsafe_fixes) if r.filename.endswith("train.py")]
    assert result.new_source == train.read_text()
    said = " ".join(d.message for d in result.diagnostics)
    assert "attacks.py:8 stays on apex amp" in said, said


def test_a_name_imported_that_scales_nothing_is_no_link(tmp_path):
    """``from attacks import clamp``: nothing imported reaches the module's ``amp.scale_loss``."""
    train = _project(tmp_path, "from attacks import clamp")
    train.write_text(train.read_text().replace("perturbation(model, x, y, opt)", "clamp(x, x, x)"))
    [result] = [r for r in api.migrate_paths([str(tmp_path)], write=False, unsafe_fixes=True) if r.filename.endswith("train.py")]
    assert "amp.initialize" not in result.new_source, result.new_source


def test_a_module_that_is_not_linked_leaves_the_file_to_its_own_plan(tmp_path):
    train = _project(tmp_path, "", linked=False)
    [result] = [r for r in api.migrate_paths([str(tmp_path)], write=False, unsafe_fixes=True) if r.filename.endswith("train.py")]
    assert "amp.initialize" not in result.new_source and "GradScaler" in result.new_source, result.new_source
    assert scaled_elsewhere({train: train.read_text()}, {}, {}, unsafe_fixes=True) == {}


# A checkpoint utility beside the training script: it saves and loads apex's loss-scaler state and
# neither initializes nor scales. A safe run leaves it on apex (its rewrite waits for callers to
# pass their scaler), so the script's `initialize` stays too: apex fails in the utility without
# it (AttributeError with apex gone and `amp = None`).
CHECKPOINTS = """\
import torch
{apex_import}


def save_checkpoint(path, model, optimizer, opt_level):
    state = {{"model": model.state_dict(), "optimizer": optimizer.state_dict()}}
    if opt_level != "O0":
        {save}
    torch.save(state, path)


def load_checkpoint(path, model, optimizer):
    state = torch.load(path)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if "amp" in state:
        amp.load_state_dict(state["amp"])


def count_parameters(model):
    return sum(p.numel() for p in model.parameters())
"""
APEX_IMPORTS = {"plain": "from apex import amp", "guarded": "try:\n    from apex import amp\nexcept ImportError:\n    amp = None",
                "module": "import apex.amp as amp"}
SAVES = {"item": 'state["amp"] = amp.state_dict()', "update": "state.update(amp=amp.state_dict())"}
USES = {"from_import": ("from checkpoints import save_checkpoint", "save_checkpoint"),
        "the_module": ("import checkpoints", "checkpoints.save_checkpoint"),
        "renamed": ("from checkpoints import save_checkpoint as save", "save")}


def _with_checkpoints(tmp_path, use, apex_import="plain", save="item"):
    import_line, call = USES[use]
    train = _project(tmp_path, import_line, linked=False)
    train.write_text(train.read_text().replace("from torch import nn", import_line)
                     .replace("            print(epoch)\n", f'            {call}("last.pt", model, opt, "O1")\n'))
    (tmp_path / "checkpoints.py").write_text(CHECKPOINTS.format(apex_import=APEX_IMPORTS[apex_import], save=SAVES[save]))
    return train


@pytest.mark.parametrize("use", sorted(USES))
@pytest.mark.parametrize("apex_import, save", [("plain", "item"), ("guarded", "update"), ("module", "item")])
def test_initialize_stays_where_a_checkpoint_utility_keeps_apex_state(tmp_path, use, apex_import, save):
    train = _with_checkpoints(tmp_path, use, apex_import, save)
    results = {Path(r.filename).name: r for r in api.migrate_paths([str(tmp_path)], write=False)}
    assert results["train.py"].new_source == train.read_text()
    said = " ".join(d.message for d in results["train.py"].diagnostics)
    assert "`load_state_dict` at checkpoints.py:" in said and "stays on apex amp" in said, said
    # --unsafe-fixes rewrites the utility where it can (its state saved where a scaler is passed;
    # not `state.update(amp=...)`): the script's `initialize` goes only with it
    unsafe = {Path(r.filename).name: r for r in api.migrate_paths([str(tmp_path)], write=False, unsafe_fixes=True)}
    kept = "amp.state_dict" in unsafe["checkpoints.py"].new_source
    assert ("amp.initialize" in unsafe["train.py"].new_source) == kept
    assert kept == (save == "update")


def test_a_name_of_the_utility_that_keeps_no_state_is_no_link(tmp_path):
    train = _with_checkpoints(tmp_path, "from_import")
    train.write_text(train.read_text().replace("from checkpoints import save_checkpoint", "from checkpoints import count_parameters")
                     .replace('save_checkpoint("last.pt", model, opt, "O1")', "print(count_parameters(model))"))
    [result] = [r for r in api.migrate_paths([str(tmp_path)], write=False) if r.filename.endswith("train.py")]
    assert "amp.initialize" not in result.new_source, result.new_source


@pytest.mark.parametrize("layout", ["namespace_tasks", "packages"])
def test_a_tree_without_a_project_marker_is_the_project_its_dotted_imports_start_from(tmp_path, layout):
    """No ``.git``, ``pyproject.toml`` or ``setup.*`` (an export, a copy): the project is the folder
    ``from src.utils.checkpoints import ...`` starts from, not the script's own folder, so the
    utility keeping apex's state is seen (the script was migrated, and the utility's
    ``amp.state_dict()`` raised at the first save)."""
    train = _with_checkpoints(tmp_path, "from_import")
    (tmp_path / "pyproject.toml").unlink()
    tasks, utils = tmp_path / "src" / "tasks", tmp_path / "src" / "utils"
    tasks.mkdir(parents=True)
    utils.mkdir()
    for folder in ([tmp_path / "src", utils] if layout == "namespace_tasks" else [tmp_path / "src", utils, tasks]):
        (folder / "__init__.py").write_text("")
    (tmp_path / "checkpoints.py").rename(utils / "checkpoints.py")
    moved = tasks / "train.py"
    moved.write_text(train.read_text().replace("from checkpoints import", "from src.utils.checkpoints import"))
    train.unlink()
    assert files.project_root(moved) == tmp_path.resolve()
    for given in (tmp_path, moved):
        [result] = [r for r in api.migrate_paths([str(given)], write=False) if r.filename.endswith("train.py")]
        assert result.new_source == moved.read_text()
        assert "checkpoints.py:" in " ".join(d.message for d in result.diagnostics)


TRAINLIB = """\
import torch
from apex import amp


def load_state(model, opt, use_amp=False):
    if use_amp:
        model, opt = amp.initialize(model, opt, opt_level="O1")
    return model, opt


def train(model, batches, opt, use_amp=False):
    for x, y in batches:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        if use_amp:
            with amp.scale_loss(loss, opt) as scaled:
                scaled.backward()
        else:
            loss.backward()
        opt.step()
        opt.zero_grad()


def count_parameters(model):
    return sum(p.numel() for p in model.parameters())
"""
TUNE = """\
import torch
{apex_import}
{import_line}


def main(model, opt, batches):
    model, opt = amp.initialize(model, opt, opt_level="O1")
    for _ in range(3):
        {call}(model, batches, opt, use_amp=True)
"""
TRAINERS = {"from_import": ("from trainlib import train", "train"), "the_module": ("import trainlib", "trainlib.train"),
            "renamed": ("from trainlib import train as run_epoch", "run_epoch"),
            "package_relative": ("from .trainlib import train", "train"), "star": ("from trainlib import *", "train")}


@pytest.mark.parametrize("use", sorted(TRAINERS))
@pytest.mark.parametrize("apex_import", ["plain", "guarded"])
def test_a_file_training_with_its_own_initialize_is_left_alone_where_another_initializes_for_it(tmp_path, use, apex_import):
    """``tune.py`` initializes apex for the model it builds, then calls ``trainlib.train``, which
    scales the loss; ``trainlib`` initializes for itself only in ``load_state``, which ``tune.py``
    never calls. Migrated, ``trainlib``'s GradScaler is never made on tune's runs (no loss scaling
    under apex's casts): both files are left alone, in either mode, and say where."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    import_line, call = TRAINERS[use]
    folder = tmp_path / "pkg" if use == "package_relative" else tmp_path
    folder.mkdir(exist_ok=True)
    (folder / "__init__.py").write_text("")
    (folder / "trainlib.py").write_text(TRAINLIB)
    tune = TUNE.format(apex_import=APEX_IMPORTS[apex_import], import_line=import_line, call=call)
    (folder / "tune.py").write_text(tune)
    line = tune[: tune.index("amp.initialize")].count("\n") + 1
    for unsafe_fixes in (False, True):
        results = {Path(r.filename).name: r for r in api.migrate_paths([str(tmp_path)], write=False, unsafe_fixes=unsafe_fixes)}
        assert not results["trainlib.py"].changed and not results["tune.py"].changed
        said = " ".join(d.message for d in results["trainlib.py"].diagnostics)
        assert "`amp.initialize` at " in said and f"tune.py:{line} sets apex up too" in said, said
        assert "trainlib.py:15" in " ".join(d.message for d in results["tune.py"].diagnostics)


@pytest.mark.parametrize("import_line", ["from trainlib import count_parameters", "from trainlib import *"])
def test_another_initializer_using_nothing_that_scales_is_no_link(tmp_path, import_line):
    """An inference script that initializes apex for its own model and takes only helpers (or
    everything, with a star) from the training module, calling none that scales a loss."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "trainlib.py").write_text(TRAINLIB)
    (tmp_path / "tune.py").write_text(TUNE.format(apex_import="from apex import amp", import_line=import_line,
                                                  call="print") + "    print(count_parameters(model))\n")
    results = {Path(r.filename).name: r for r in api.migrate_paths([str(tmp_path)], write=False)}
    assert results["trainlib.py"].changed, [d.message for d in results["trainlib.py"].diagnostics]


def test_without_a_marker_a_package_module_belongs_to_the_folder_above_its_package(tmp_path):
    """``src/loss.py`` with no dotted import of the project's own: the folder above the package
    (what ``from src.loss import ...`` starts from), the same project as ``src/models.py``, which
    imports ``src.layers``; a folder with a marker inside is a project of its own."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "__init__.py").write_text("")
    (src / "layers.py").write_text("import torch\n")
    (src / "loss.py").write_text("import torch.nn as nn\n")
    (src / "models.py").write_text("from src.layers import *\n")
    (tmp_path / "vendor").mkdir()
    (tmp_path / "vendor" / "setup.py").write_text("")
    (tmp_path / "vendor" / "lib.py").write_text("")
    root = tmp_path.resolve()
    assert files.project_root(src / "loss.py") == files.project_root(src / "models.py") == root
    assert files.in_project(src / "loss.py", root) and not files.in_project(tmp_path / "vendor" / "lib.py", root)
