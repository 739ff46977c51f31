"""An O3 inference model whose ``forward`` is never called becomes ``model.half()`` in a safe run.

A vocoder's inference script: ``model, _ = amp.initialize(model, [], opt_level="O3")``, then only
``model.infer(mel)`` and ``Denoiser(model)`` (which reads a weight's dtype and calls ``infer``).
apex cast the weights to float16 and replaced ``forward`` with one casting inputs and outputs;
with ``forward`` never reached, ``.half()`` runs the same, so the rewrite is safe. Generated
scripts vary how ``initialize`` is spelled and where it stands, and how the model is used; each
use that may reach ``forward`` (the model called, a method calling ``self(...)``, a method the
project does not define, the model handed on or kept) leaves the rewrite unsafe. Some are run on
ampshim (CUDA mapped to the CPU) against their rewrite: they print the same.
"""
from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import pytest

from generated.inference_runs import printed
from migrate.api import migrate_paths

MODEL = (
    "import torch\n\n\n"
    "class Vocoder(torch.nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.upsample = torch.nn.Linear(8, 8)\n"
    "        self.layers = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(2)])\n\n"
    "    def forward(self, x):\n"
    "        return self.upsample(x)\n\n"
    "    def infer(self, x):\n"
    "{infer}"
    "        for layer in self.layers:\n"
    "            x = torch.tanh(layer(x))\n"
    "        return self.finish(x)\n\n"
    "    def finish(self, x):\n"
    "        return x * 0.5\n"
)
INFER_BODIES = {"submodule": "        x = self.upsample(x)\n", "attribute": "        x = x @ self.upsample.weight.t()\n"}
DENOISER = (
    "import torch\n\n\n"
    "class Denoiser(torch.nn.Module):\n"
    "    def __init__(self, vocoder, strength=0.1):\n"
    "        super().__init__()\n"
    "        zeros = torch.zeros((1, 8), dtype=vocoder.upsample.weight.dtype, device=vocoder.upsample.weight.device)\n"
    "        with torch.no_grad():\n"
    "            self.register_buffer(\"bias\", vocoder.infer(zeros).float())\n"
    "        self.strength = strength\n\n"
    "    def forward(self, audio):\n"
    "        return audio.float() - self.strength * self.bias\n"
)
INITIALIZES = {
    "pair_empty_list": 'model, _ = amp.initialize(model, [], opt_level="O3")',
    "model_only": 'model = amp.initialize(model, opt_level="O3")',
    "keywords": 'model, _ = amp.initialize(models=model, optimizers=[], opt_level="O3", verbosity=0)',
}
# how the model is used after `initialize`, none reaching `forward`
# how the model is made: by a class of the project, or loaded, then by one of its own methods
MADE = {
    "class": "    model = Vocoder()\n",
    "loaded": "    torch.save({\"model\": Vocoder()}, \"vocoder.pt\")\n"
              "    model = torch.load(\"vocoder.pt\", weights_only=False)[\"model\"]\n    model = model.eval()\n",
}
USES = {
    "infer": "        y = model.infer(x)\n",
    "denoiser": "        denoiser = Denoiser(model)\n        y = denoiser(model.infer(x))\n",
    "denoiser_keyword": "        denoiser = Denoiser(vocoder=model, strength=0.2)\n        y = denoiser(model.infer(x))\n",
    "weight_dtype": "        x = x.to(model.upsample.weight.dtype)\n        y = model.infer(x)\n",
}


def _script(initialize: str, guarded: bool, uses: str, place: str, made: str = "class") -> str:
    setup = (f"    if fp16:\n        {INITIALIZES[initialize]}\n" if guarded else f"    {INITIALIZES[initialize]}\n")
    body = (
        "    torch.manual_seed(0)\n"
        + MADE[made] +
        "    model.cuda().eval()\n"
        + setup +
        "    x = torch.randn(2, 8).cuda()\n"
        "    x = x.half() if fp16 else x\n"
        "    with torch.no_grad():\n"
        + USES[uses] +
        '    print("out", y.dtype, [round(v, 3) for v in y.float().flatten().tolist()])\n'
    )
    head = "import torch\nfrom apex import amp\n\nfrom denoiser import Denoiser\nfrom vocoder import Vocoder\n\n"
    if place == "function":
        return head + "\ndef main(fp16=True):\n" + body + "\n\nif __name__ == \"__main__\":\n    main()\n"
    lines = "fp16 = True\n" + "".join(line[4:] + "\n" for line in body.splitlines())
    return head + lines


def _project(root: Path, script: str, infer: str = "submodule", model: str | None = None) -> Path:
    root.mkdir(parents=True)
    (root / "setup.py").write_text("")
    (root / "vocoder.py").write_text(model if model is not None else MODEL.format(infer=INFER_BODIES[infer]))
    (root / "denoiser.py").write_text(DENOISER)
    (root / "inference.py").write_text(script)
    return root


CASES = list(itertools.product(sorted(INITIALIZES), (True, False), sorted(USES), ("function", "module"), sorted(MADE)))


@pytest.mark.parametrize(("initialize", "guarded", "uses", "place", "made"), CASES)
def test_a_model_never_called_is_halved_in_a_safe_run(tmp_path, initialize, guarded, uses, place, made):
    root = _project(tmp_path / "p", _script(initialize, guarded, uses, place, made))
    migrate_paths([root])
    text = (root / "inference.py").read_text()
    assert "apex" not in text and "amp." not in text, text
    assert "model = model.half()\n" in text and "TODO(ampmigrate)" not in text, text


@pytest.mark.parametrize(("initialize", "uses", "infer", "made"), [("pair_empty_list", "denoiser", "submodule", "loaded"),
                                                                   ("model_only", "weight_dtype", "attribute", "class"),
                                                                   ("keywords", "denoiser_keyword", "submodule", "class")])
def test_the_halved_model_prints_what_apex_o3_printed(tmp_path, initialize, uses, infer, made):
    # ampshim on the CPU runs float16 as bfloat16: the inputs take the weights' type, not `.half()`
    script = _script(initialize, True, uses, "function", made).replace("x.half() if fp16 else x", "x.to(model.upsample.weight.dtype)")
    original = _project(tmp_path / "original", script, infer)
    migrated = tmp_path / "migrated"
    shutil.copytree(original, migrated)
    migrate_paths([migrated])
    text = (migrated / "inference.py").read_text()
    assert "apex" not in text and "model = model.half()\n" in text, text
    # ampshim on the CPU casts apex O3's float16 to bfloat16: the rewrite's `.half()` is given the same type there
    (migrated / "inference.py").write_text(text.replace("model = model.half()\n", "model = model.to(torch.bfloat16)\n"))
    expected = printed(original / "inference.py")
    assert expected.startswith("out torch."), expected
    assert printed(migrated / "inference.py") == expected


_SCRIPT = _script("pair_empty_list", True, "infer", "function")
_FORWARD_IN_INFER = MODEL.format(infer=INFER_BODIES["submodule"]).replace("        return self.finish(x)", "        return self(x)")
# each reaches (or may reach) the model's forward, which apex's O3 cast and `.half()` does not
REACHING = {
    "called": (_SCRIPT.replace("y = model.infer(x)", "y = model(x)"), None),
    "forward": (_SCRIPT.replace("y = model.infer(x)", "y = model.forward(x)"), None),
    "infer_calls_self": (_SCRIPT, _FORWARD_IN_INFER),
    "infer_calls_forward": (_SCRIPT, _FORWARD_IN_INFER.replace("return self(x)", "return self.forward(x)")),
    "method_not_in_project": (_SCRIPT.replace("model.infer(x)", "model.generate(x)"), None),
    "handed_to_unknown": (_SCRIPT.replace("        y = model.infer(x)\n", "        torch.save(model, 'm.pt')\n        y = model.infer(x)\n"), None),
    "state_dict": (_SCRIPT.replace("        y = model.infer(x)\n", "        torch.save(model.state_dict(), 'm.pt')\n        y = model.infer(x)\n"), None),
    "aliased": (_SCRIPT.replace("        y = model.infer(x)\n", "        net = model.eval()\n        y = net(x)\n"), None),
    "nested_function": (_SCRIPT.replace("        y = model.infer(x)\n", "        run = lambda v: model(v)\n        y = model.infer(x)\n"), None),
    "returned": (_SCRIPT.replace('    print("out"', '    return model\n    print("out"'), None),
    "keep_batchnorm": (_SCRIPT.replace('opt_level="O3")', 'opt_level="O3", keep_batchnorm_fp32=True)'), None),
    "in_a_loop": (_SCRIPT.replace("    if fp16:\n        model, _ = amp.initialize(model, [], opt_level=\"O3\")\n",
                                  "    for _ in range(1):\n        model, _ = amp.initialize(model, [], opt_level=\"O3\")\n"), None),
    "another_package_model": (_SCRIPT.replace("    model = Vocoder()\n", "    model = torch.hub.load('org/repo', 'vocoder')\n"), None),
    "parameter_model": (_SCRIPT.replace("def main(fp16=True):\n    torch.manual_seed(0)\n    model = Vocoder()\n",
                                        "def main(model, fp16=True):\n    torch.manual_seed(0)\n")
                        .replace("    main()\n", "    main(Vocoder())\n"), None),
    "denoiser_calls_it": (_SCRIPT.replace("y = model.infer(x)", "y = Denoiser(model)(model.infer(x))"), "calls"),
}


@pytest.mark.parametrize("case", sorted(REACHING))
def test_a_model_whose_forward_may_run_keeps_the_rewrite_unsafe(tmp_path, case):
    script, model = REACHING[case]
    assert script != _SCRIPT or model is not None, case
    root = _project(tmp_path / "p", script, model=model if model not in (None, "calls") else None)
    if model == "calls":
        (root / "denoiser.py").write_text(DENOISER.replace("vocoder.infer(zeros)", "vocoder(zeros)"))
    migrate_paths([root])
    assert (root / "inference.py").read_text() == script  # the safe run leaves it
    migrate_paths([root], unsafe_fixes=True)
    text = (root / "inference.py").read_text()
    assert "from apex" in text or "TODO(ampmigrate)" in text, text
