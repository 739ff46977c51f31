"""A model handed to a function of another file that casts modules to float16 (``model.apply(
set_bn_eval)`` where ``set_bn_eval`` does ``m.eval().half()`` on each BatchNorm): their gradients
are float16, which apex O1 stepped and ``GradScaler.unscale_`` refuses. Not rewritten, even
unsafely: the first step would raise."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from migrate.api import migrate_paths

TRAIN = textwrap.dedent("""\
    import torch
    from apex import amp

    from {module} import {imported}


    def train(model, optimizer, batches):
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        {handed}
        for x, y in batches:
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
""")
CASTS = {
    "half": "def set_bn_eval(m):\n    if 'BatchNorm' in type(m).__name__:\n        m.eval().half()\n",
    "to float16": "import torch\n\n\ndef set_bn_eval(m):\n    if isinstance(m, torch.nn.BatchNorm2d):\n        m.to(torch.float16)\n",
    "to dtype": "import torch\n\n\ndef set_bn_eval(module):\n    for m in module.modules():\n        m.to(dtype=torch.half)\n",
}
HANDED = {"apply": "model.apply({name})", "called": "{name}(model)"}


def _project(root: Path, casts: str, handed: str, alias: bool, module: str = "utils.util") -> Path:
    (root / ".git").mkdir(parents=True)
    (root / "utils").mkdir()
    (root / "utils" / "__init__.py").write_text("")
    (root / "utils" / "util.py").write_text(casts)
    name = "bn_eval" if alias else "set_bn_eval"
    imported = "set_bn_eval as bn_eval" if alias else "set_bn_eval"
    train = TRAIN.format(module=module, imported=imported, handed=HANDED[handed].format(name=name))
    (root / "train.py").write_text(train)
    return root / "train.py"


@pytest.mark.parametrize("alias", [False, True])
@pytest.mark.parametrize("handed", sorted(HANDED))
@pytest.mark.parametrize("casts", sorted(CASTS))
def test_a_model_handed_to_a_function_casting_modules_to_half_is_not_rewritten(tmp_path, casts, handed, alias):
    train = _project(tmp_path, CASTS[casts], handed, alias)
    source = train.read_text()
    for unsafe in (False, True):
        [result] = [r for r in migrate_paths([train], write=False, unsafe_fixes=unsafe) if r.filename.endswith("train.py")]
        assert result.new_source in (None, source), result.new_source
        messages = " ".join(d.message for d in result.diagnostics if d.code == "AMP002")
        assert "casts modules to float16" in messages and "util.py:" in messages, messages


def test_a_function_that_casts_nothing_to_half_leaves_the_rewrite_alone(tmp_path):
    train = _project(tmp_path, "def set_bn_eval(m):\n    m.eval()\n", "apply", False)
    [result] = [r for r in migrate_paths([train], write=False) if r.filename.endswith("train.py")]
    assert result.new_source and "amp.initialize" not in result.new_source, result.new_source


TENSOR_CASTS = {  # functions of another file that cast tensors, not the module they are handed
    "forward output": "import torch\n\n\n@torch.no_grad()\ndef evaluate(model, batches):\n    scores = []\n"
                      "    for x in batches:\n        out = model(x)\n        scores.append(out.data.squeeze(1).half())\n    return scores\n",
    "made tensor": "import torch\n\n\ndef evaluate(model, batches):\n    total = torch.zeros(3).half()\n"
                   "    for x in batches:\n        total += model(x).sum()\n    return total\n",
    "weight of it": "def evaluate(model, batches):\n    w = model.weight\n    return w.half().sum()\n",
    "returned tensor": "import torch\n\n\ndef evaluate(model, batches):\n    return [model(x).to(dtype=torch.float16) for x in batches]\n",
}
MODULE_CASTS = {  # ... and functions that do cast it, however it is reached
    "alias": "def evaluate(model, batches):\n    net = model.module if hasattr(model, 'module') else model\n    net.half()\n",
    "lambda": "def evaluate(model, batches):\n    model.apply(lambda m: m.half())\n",
    "named modules": "def evaluate(model, batches):\n    for _, layer in model.named_modules():\n        layer.eval().half()\n",
    "chain": "def evaluate(model, batches):\n    model.cuda().eval().half()\n",
}


def _evaluating(root: Path, helper: str) -> Path:
    train = _project(root, helper, "called", False)
    train.write_text(train.read_text().replace("set_bn_eval", "evaluate").replace("evaluate(model)", "evaluate(model, [])"))
    return train


@pytest.mark.parametrize("helper", sorted(TENSOR_CASTS))
def test_a_function_casting_tensors_it_makes_is_no_module_cast(tmp_path, helper):
    train = _evaluating(tmp_path, TENSOR_CASTS[helper])
    [result] = [r for r in migrate_paths([train], write=False) if r.filename.endswith("train.py")]
    assert not any("casts modules to float16" in d.message for d in result.diagnostics), result.diagnostics
    assert result.new_source and "amp.initialize" not in result.new_source, result.new_source


@pytest.mark.parametrize("helper", sorted(MODULE_CASTS))
def test_a_function_casting_the_module_it_is_handed_is_one(tmp_path, helper):
    train = _evaluating(tmp_path, MODULE_CASTS[helper])
    [result] = [r for r in migrate_paths([train], write=False, unsafe_fixes=True) if r.filename.endswith("train.py")]
    assert result.new_source in (None, train.read_text()), result.new_source
    assert any("casts modules to float16" in d.message for d in result.diagnostics if d.code == "AMP002"), result.diagnostics
