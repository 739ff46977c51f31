"""A checkpoint utility in another file, migrated with the training files that call it.

``utils.py`` saves ``amp.state_dict()`` beside the optimizer's state and loads it back with
``amp.load_state_dict``; ``train.py`` initializes apex, scales its losses and calls those helpers.
Where every call of the helpers comes from a file the run migrates, each call passes the
GradScaler (``scaler=scaler``) and the utility takes it as ``scaler=None``, with no doubt left:
both files are migrated in a safe run. Generated projects vary how the helpers are imported and
spelled, how they keep the state, where the training file calls them (beside ``initialize`` or
in a function it hands the scaler to) and how the opt level is given. Where a use is not seen
(a file outside the run, the helper handed on as a value, an import that may name another file,
a caller the run leaves on apex) the two stay as they were.
"""
from __future__ import annotations

import ast
import importlib.util
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from migrate.api import migrate_paths

torch = pytest.importorskip("torch")

# where the utility lives, how the training file imports it, and how it spells each helper ({f})
LAYOUTS = {
    "from_module": ("utils.py", "from utils import load_checkpoint, save_checkpoint\n", "{f}"),
    "module": ("utils.py", "import utils\n", "utils.{f}"),
    "aliased": ("utils.py", "from utils import load_checkpoint as load_ckpt, save_checkpoint as save_ckpt\n",
                "{short}"),
    "package": ("tools/checkpoint.py", "from tools.checkpoint import load_checkpoint, save_checkpoint\n", "{f}"),
    "package_module": ("tools/checkpoint.py", "import tools.checkpoint as ckpt\n", "ckpt.{f}"),
    "from_package": ("tools/checkpoint.py", "from tools import checkpoint\n", "checkpoint.{f}"),
}
SAVES = {
    "subscript": '    if config.opt_level != "O0":\n        state["amp"] = amp.state_dict()\n',
    "plain": '    state["amp"] = amp.state_dict()\n',
    "if_exp": '    state["amp"] = amp.state_dict() if config.opt_level != "O0" else None\n',
}
LOADS = {
    "guarded": '    if "amp" in checkpoint and config.opt_level != "O0":\n        amp.load_state_dict(checkpoint["amp"])\n',
    "plain": '    if checkpoint.get("amp"):\n        amp.load_state_dict(checkpoint["amp"])\n',
}
IMPORTS = {
    "try": "try:\n    from apex import amp\nexcept ImportError:\n    amp = None\n",
    "plain": "from apex import amp\n",
}
# where the training file calls the helpers: beside `initialize` in main(), or in functions main() hands the scaler to
CALLS_IN = ("main", "functions")
LEVELS = {"constant": 'opt_level="O1"', "config": "opt_level=config.opt_level"}


def _utility(save: str, load: str, imports: str) -> str:
    return (
        "import torch\n\n" + imports + "\n\n"
        "def load_checkpoint(config, model, optimizer):\n"
        '    checkpoint = torch.load(config.resume, map_location="cpu")\n'
        '    model.load_state_dict(checkpoint["model"])\n'
        '    optimizer.load_state_dict(checkpoint["optimizer"])\n'
        + LOADS[load] +
        '    return checkpoint["epoch"] + 1\n\n\n'
        "def save_checkpoint(config, epoch, model, optimizer, path):\n"
        '    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}\n'
        + SAVES[save] +
        "    torch.save(state, path)\n"
    )


def _training(layout: str, calls_in: str, level: str) -> str:
    _, imported, spelled = LAYOUTS[layout]
    load = spelled.format(f="load_checkpoint", short="load_ckpt")
    save = spelled.format(f="save_checkpoint", short="save_ckpt")
    resume = f"        start = {load}(config, model, optimizer)\n"
    keep = f'        {save}(config, epoch, model, optimizer, config.path)\n'
    text = (
        "import argparse\n\nimport torch\nfrom apex import amp\n\n" + imported + "\n\n"
        "def train_one_epoch(model, optimizer, batches):\n"
        "    for x, y in batches:\n"
        "        loss = torch.nn.functional.mse_loss(model(x), y)\n"
        "        optimizer.zero_grad()\n"
        "        with amp.scale_loss(loss, optimizer) as scaled_loss:\n"
        "            scaled_loss.backward()\n"
        "        optimizer.step()\n\n\n"
    )
    if calls_in == "functions":
        text += ("def resume(config, model, optimizer):\n    start = 0\n    if config.resume:\n" + resume.replace("    ", "", 1)
                 .replace("start", "    start", 1) + "    return start\n\n\n"
                 "def keep(config, epoch, model, optimizer):\n" + keep.replace("    ", "", 1) + "\n\n")
        resume_call, keep_call = "    start = resume(config, model, optimizer)\n", "        keep(config, epoch, model, optimizer)\n"
    else:
        resume_call, keep_call = "    start = 0\n    if config.resume:\n" + resume, keep
    text += (
        "def main(config):\n"
        "    torch.manual_seed(0)\n"
        '    device = "cuda"\n'
        "    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)\n"
        f"    model, optimizer = amp.initialize(model, optimizer, {LEVELS[level]}, loss_scale=128.0)\n"
        + resume_call +
        "    batches = [(torch.randn(4, 8, device=device), torch.randn(4, 1, device=device)) for _ in range(4)]\n"
        "    for epoch in range(start, config.epochs):\n"
        "        train_one_epoch(model, optimizer, batches)\n"
        + keep_call +
        "    config.resume = config.path  # resumed from the last checkpoint, and trained on\n"
        + resume_call +
        "    train_one_epoch(model, optimizer, batches)\n"
        "\n\nif __name__ == \"__main__\":\n"
        "    parser = argparse.ArgumentParser()\n"
        '    parser.add_argument("--opt-level", default="O1")\n'
        '    parser.add_argument("--resume", default="")\n'
        '    parser.add_argument("--path", default=__file__ + ".pt")\n'
        '    parser.add_argument("--epochs", type=int, default=3)\n'
        '    parser.add_argument("--steps", type=int, default=12)\n'
        "    main(parser.parse_args())\n"
    )
    return text


def _project(root: Path, layout: str, save: str, load: str, imports: str, calls_in: str, level: str) -> Path:
    where = LAYOUTS[layout][0]
    (root / "setup.py").parent.mkdir(parents=True, exist_ok=True)
    (root / "setup.py").write_text("")
    if "/" in where:
        (root / "tools").mkdir()
        (root / "tools" / "__init__.py").write_text("")
    (root / where).write_text(_utility(save, load, IMPORTS[imports]))
    (root / "train.py").write_text(_training(layout, calls_in, level))
    return root


def _apex_left(text: str) -> bool:
    """Whether ``text`` imports apex, or reads a name ``amp``."""
    nodes = list(ast.walk(ast.parse(text)))
    return (any(isinstance(node, (ast.Import, ast.ImportFrom)) and "apex" in ast.unparse(node) for node in nodes)
            or any(isinstance(node, ast.Name) and node.id == "amp" for node in nodes))


def _helper_calls(text: str) -> list[ast.Call]:
    return [node for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Call)
            and ast.unparse(node.func).split(".")[-1] in ("load_checkpoint", "save_checkpoint", "load_ckpt", "save_ckpt")]


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Config:
    opt_level, epochs = "O1", 1

    def __init__(self, resume: str) -> None:
        self.resume = resume


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          phases=[Phase.explicit, Phase.generate])  # each example migrates a project: no time to shrink
@given(layout=st.sampled_from(sorted(LAYOUTS)), save=st.sampled_from(sorted(SAVES)), load=st.sampled_from(sorted(LOADS)),
       imports=st.sampled_from(sorted(IMPORTS)), calls_in=st.sampled_from(CALLS_IN), level=st.sampled_from(sorted(LEVELS)))
def test_the_utility_and_its_callers_are_migrated_together(tmp_path_factory, layout, save, load, imports, calls_in, level):
    root = _project(tmp_path_factory.mktemp("project"), layout, save, load, imports, calls_in, level)
    utility_path = root / LAYOUTS[layout][0]
    results = migrate_paths([root])
    assert not any(d.code.startswith("E") for result in results for d in result.diagnostics), results
    training, utility = (root / "train.py").read_text(), utility_path.read_text()
    assert not _apex_left(training) and not _apex_left(utility), training + utility
    assert "TODO(ampmigrate)" not in training + utility, training + utility
    calls = _helper_calls(training)
    assert len(calls) == (2 if calls_in == "functions" else 3) and all(any(k.arg == "scaler" for k in call.keywords) for call in calls), training
    assert "def load_checkpoint(config, model, optimizer, scaler=None):" in utility, utility
    assert not any(result.changed for result in migrate_paths([root])), "a second run changed it again"

    # the utility, run: the GradScaler's state is saved, and an old apex checkpoint loads into it
    helpers = _load(utility_path, f"utility_{root.name}")
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    path = root / "saved.pt"
    helpers.save_checkpoint(_Config(""), 0, model, optimizer, path, scaler=scaler)
    assert torch.load(path)["amp"]["scale"] == 256.0
    old = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 4,
           "amp": {"loss_scaler0": {"loss_scale": 512.0, "unskipped": 7}}}
    torch.save(old, path)
    assert helpers.load_checkpoint(_Config(str(path)), model, optimizer, scaler=scaler) == 5
    assert scaler.get_scale() == 512.0


def _base(root: Path) -> Path:
    return _project(root, "from_module", "subscript", "guarded", "try", "main", "constant")


def _unchanged(root: Path, given=None) -> None:
    before = {path: path.read_text() for path in root.rglob("*.py")}
    migrate_paths(given or [root])
    after = {path: path.read_text() for path in root.rglob("*.py")}
    assert after == before


_EVALUATE = "from utils import load_checkpoint\n\n\ndef run(config, model, optimizer):\n    return load_checkpoint(config, model, optimizer)\n"


def test_a_caller_on_apex_outside_the_run_keeps_both_as_they_were(tmp_path):
    root = _base(tmp_path / "p")
    (root / "evaluate.py").write_text("from apex import amp\n" + _EVALUATE + "\n\nSTATE = amp.state_dict\n")
    _unchanged(root, [root / "train.py", root / "utils.py"])


# a script that never ran with apex's state: there apex's lines raised (no loss scaler before
# `amp.initialize`) or did not run, as they do not with no scaler passed
NEVER_ON_APEX = {
    "plain": _EVALUATE,
    "apex_in_comments": "# from apex import amp  (mixed precision was dropped here)\n" + _EVALUATE,
}


@pytest.mark.parametrize("text", sorted(NEVER_ON_APEX))
@pytest.mark.parametrize("in_run", [True, False])
def test_a_script_that_never_ran_on_apex_calls_the_migrated_utility_as_before(tmp_path, text, in_run):
    root = _base(tmp_path / "p")
    (root / "evaluate.py").write_text(NEVER_ON_APEX[text])
    migrate_paths([root] if in_run else [root / "train.py", root / "utils.py"])
    assert (root / "evaluate.py").read_text() == NEVER_ON_APEX[text]
    training, utility = (root / "train.py").read_text(), (root / "utils.py").read_text()
    assert not _apex_left(training) and not _apex_left(utility), training + utility
    assert "scaler=None" in utility and "TODO(ampmigrate)" not in training + utility, utility


def test_a_script_the_training_file_imports_keeps_both_as_they_were(tmp_path):
    root = _base(tmp_path / "p")  # it may run after `amp.initialize`, in the training file's process
    (root / "evaluate.py").write_text(_EVALUATE)
    (root / "train.py").write_text("import evaluate\n" + (root / "train.py").read_text())
    _unchanged(root)


@pytest.mark.parametrize("use", ["HOOKS = [save_checkpoint]\n", "callback = save_checkpoint\n",
                                 "def later(**kwargs):\n    return save_checkpoint(scaler=None, **kwargs)\n"])
def test_a_helper_used_otherwise_than_called_keeps_both_as_they_were(tmp_path, use):
    root = _base(tmp_path / "p")
    (root / "train.py").write_text((root / "train.py").read_text() + "\n\n" + use)
    _unchanged(root)


def test_a_caller_the_run_leaves_on_apex_keeps_the_utility_on_apex(tmp_path):
    root = _base(tmp_path / "p")
    text = (root / "train.py").read_text().replace('opt_level="O1"', 'opt_level="O2"')
    (root / "train.py").write_text(text)
    _unchanged(root)


def test_a_caller_no_run_migrates_keeps_the_utility_on_apex_with_unsafe_fixes_too(tmp_path):
    root = _base(tmp_path / "p")  # a model cast to float16 by hand: the training file is not planned at all
    text = (root / "train.py").read_text().replace("    model, optimizer = amp.initialize", "    model = model.half()\n"
                                                   "    model, optimizer = amp.initialize")
    (root / "train.py").write_text(text)
    before = (root / "utils.py").read_text()
    results = migrate_paths([root], unsafe_fixes=True)
    assert (root / "utils.py").read_text() == before
    reasons = " ".join(d.message for r in results if r.filename.endswith("utils.py") for d in r.diagnostics)
    assert "its callers (train.py) stay on apex amp" in reasons, reasons


def test_a_helper_of_the_same_name_in_another_file_is_not_taken_for_it(tmp_path):
    root = _base(tmp_path / "p")
    (root / "other").mkdir()
    (root / "other" / "utils.py").write_text("def save_checkpoint(*args):\n    return args\n")
    (root / "other" / "run.py").write_text("from utils import save_checkpoint\n\nsave_checkpoint(1)\n")
    results = migrate_paths([root])
    assert "save_checkpoint(1)\n" in (root / "other" / "run.py").read_text()
    assert not any(r.filename.endswith("run.py") and r.changed for r in results)


@pytest.mark.slow
@pytest.mark.parametrize("calls_in", CALLS_IN)
def test_a_project_migrated_with_its_utility_trains_and_resumes_the_same(tmp_path, calls_in):
    from ampshim.compare import SAME, Target, compare
    from ampshim.compare.report import as_text

    original = _project(tmp_path / "original", "module", "subscript", "guarded", "try", calls_in, "config")
    migrated = tmp_path / "migrated"
    shutil.copytree(original, migrated)
    migrate_paths([migrated])
    assert not _apex_left((migrated / "train.py").read_text()) and not _apex_left((migrated / "utils.py").read_text())
    result = compare(Target(str(original / "train.py")), Target(str(migrated / "train.py")), [], device="cpu",
                     steps=12, parallel=False, timeout=600)
    assert result.verdict == SAME, as_text(result)


# how the helper's parameters and a call's arguments are laid out: {items} holds them
LAYOUTS_OF_ITEMS = ["({items})", "(\n    {items}\n)", "(\n    {items},\n)", "({items},\n)"]


@pytest.mark.parametrize("layout", LAYOUTS_OF_ITEMS)
def test_the_new_parameter_and_argument_keep_the_layout_they_join(tmp_path, layout):
    root = _base(tmp_path / "p")
    utility = (root / "utils.py").read_text().replace(
        "def save_checkpoint(config, epoch, model, optimizer, path):",
        "def save_checkpoint" + layout.format(items="config, epoch, model, optimizer, path") + ":")
    (root / "utils.py").write_text(utility)
    call = layout.format(items="config, epoch, model, optimizer, config.path").replace("\n", "\n        ")
    training = (root / "train.py").read_text().replace("save_checkpoint(config, epoch, model, optimizer, config.path)",
                                                       "save_checkpoint" + call)
    (root / "train.py").write_text(training)
    migrate_paths([root])
    for name in ("utils.py", "train.py"):
        text = (root / name).read_text()
        compile(text, name, "exec")
        assert not any(line and not line.strip() for line in text.splitlines()), text  # no line of spaces only
        assert "\nscaler" not in text and "\n    scaler=None" not in text.replace("\n    scaler=None,\n)", ""), text
    assert "scaler=scaler" in (root / "train.py").read_text()


@pytest.mark.parametrize("unsafe", [False, True])
def test_a_caller_that_only_loads_apex_state_leaves_apex_in_one_run(tmp_path, unsafe):
    """The runner cannot pass a scaler to ``save_checkpoint`` (it has none) but leaves apex all
    the same (``resume`` only loads apex's state): after the run it never runs with apex's state,
    so the utility is rewritten in the same run as in the next one; a second run changes nothing."""
    root = tmp_path / "p"
    (root / "pkg").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "checkpoint.py").write_text(
        "import torch\n\n\ndef save_checkpoint(model, filename, save_apex_amp=False):\n"
        "    checkpoint = {'state_dict': model.state_dict()}\n    if save_apex_amp:\n        from apex import amp\n"
        "        checkpoint['amp'] = amp.state_dict()\n    torch.save(checkpoint, filename)\n")
    (root / "pkg" / "runner.py").write_text(
        "import torch\n\nfrom .checkpoint import save_checkpoint\n\n\nclass Runner:\n"
        "    def __init__(self, model, use_apex_amp=False):\n        self.model, self.use_apex_amp = model, use_apex_amp\n\n"
        "    def resume(self, filename):\n        checkpoint = torch.load(filename)\n"
        "        if 'amp' in checkpoint:\n            from apex import amp\n            amp.load_state_dict(checkpoint['amp'])\n\n"
        "    def save(self, filename):\n        save_checkpoint(self.model, filename, save_apex_amp=self.use_apex_amp)\n")
    migrate_paths([root], unsafe_fixes=unsafe)
    first = {path.name: path.read_text() for path in (root / "pkg").glob("*.py")}
    assert not any(result.changed for result in migrate_paths([root], unsafe_fixes=unsafe)), "not idempotent"
    assert ("from apex" in first["checkpoint.py"]) == (not unsafe), first["checkpoint.py"]
