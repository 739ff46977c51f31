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
    _assert_the_halved_model_prints_what_apex_printed(tmp_path, _project(tmp_path / "original", script, infer), "model")


def _assert_the_halved_model_prints_what_apex_printed(tmp_path: Path, original: Path, model: str) -> None:
    migrated = tmp_path / "migrated"
    shutil.copytree(original, migrated)
    migrate_paths([migrated])
    text = (migrated / "inference.py").read_text()
    assert "apex" not in text and f"{model} = {model}.half()\n" in text, text
    # ampshim on the CPU casts apex O3's float16 to bfloat16: the rewrite's `.half()` is given the same type there
    (migrated / "inference.py").write_text(text.replace(f"{model} = {model}.half()\n", f"{model} = {model}.to(torch.bfloat16)\n"))
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


# the model kept on an instance (`self.vocoder`), cast in one method and used in others
CLASS_SCRIPT = (
    "import torch\nfrom apex import amp\n\nfrom denoiser import Denoiser\nfrom vocoder import Vocoder\n\n\n"
    "class Synthesizer:\n"
    "    def __init__({me}, fp16=True):\n"
    "        {me}.fp16 = fp16\n"
    "{setup_call}"
    "\n"
    "    def {setup}({me}):\n"
    "        torch.manual_seed(0)\n"
    "{made}"
    "        {me}.{attr}.cuda().eval()\n"
    "{initialize}"
    "\n"
    "    def synthesize({me}, x):\n"
    "        x = x.half() if {me}.fp16 else x\n"
    "        with torch.no_grad():\n"
    "{uses}"
    "        return y\n"
    "{extra}"
    "\n\n"
    "def main():\n"
    "    synthesizer = Synthesizer()\n"
    "    y = synthesizer.synthesize(torch.randn(2, 8).cuda())\n"
    '    print("out", y.dtype, [round(v, 3) for v in y.float().flatten().tolist()])\n'
    "{main_extra}"
    "\n\nif __name__ == \"__main__\":\n    main()\n"
)
CLASS_MADE = {
    "class": "        {me}.{attr} = Vocoder()\n",
    "loaded": "        torch.save({{\"model\": Vocoder()}}, \"vocoder.pt\")\n"
              "        {me}.{attr} = torch.load(\"vocoder.pt\", weights_only=False)[\"model\"]\n"
              "        {me}.{attr} = {me}.{attr}.eval()\n",
}


def _class_script(attr: str, me: str, guarded: bool, uses: str, setup: str, made: str, extra: str = "", main_extra: str = "") -> str:
    initialize = INITIALIZES["pair_empty_list"].replace("model", f"{me}.{attr}")
    initialize = f"        if {me}.fp16:\n            {initialize}\n" if guarded else f"        {initialize}\n"
    use = "".join("    " + line.replace("model", f"{me}.{attr}") + "\n" for line in USES[uses].splitlines())
    return CLASS_SCRIPT.format(
        me=me, attr=attr, setup="__init__" if setup == "init" else "load",
        setup_call="" if setup == "init" else f"        {me}.load()\n",
        made=CLASS_MADE[made].format(me=me, attr=attr), initialize=initialize, uses=use, extra=extra, main_extra=main_extra,
    ).replace("    def __init__({me}, fp16=True):\n        {me}.fp16 = fp16\n\n    def __init__({me}):\n".format(me=me),
              "    def __init__({me}, fp16=True):\n        {me}.fp16 = fp16\n".format(me=me))


CLASS_CASES = list(itertools.product(("vocoder", "waveglow"), ("self", "this"), (True, False), sorted(USES), ("init", "load"), sorted(MADE)))


@pytest.mark.parametrize(("attr", "me", "guarded", "uses", "setup", "made"), CLASS_CASES)
def test_an_instance_model_never_called_is_halved_in_a_safe_run(tmp_path, attr, me, guarded, uses, setup, made):
    script = _class_script(attr, me, guarded, uses, setup, made)
    compile(script, "inference.py", "exec")
    root = _project(tmp_path / "p", script)
    migrate_paths([root])
    text = (root / "inference.py").read_text()
    assert "apex" not in text and "amp." not in text, text
    assert f"{me}.{attr} = {me}.{attr}.half()\n" in text and "TODO(ampmigrate)" not in text, text


@pytest.mark.parametrize(("uses", "setup", "made"), [("denoiser", "init", "loaded"), ("weight_dtype", "load", "class")])
def test_the_halved_instance_model_prints_what_apex_o3_printed(tmp_path, uses, setup, made):
    script = _class_script("vocoder", "self", True, uses, setup, made).replace(
        "x.half() if self.fp16 else x", "x.to(self.vocoder.upsample.weight.dtype)")
    _assert_the_halved_model_prints_what_apex_printed(tmp_path, _project(tmp_path / "original", script), "self.vocoder")


_CLASS = _class_script("vocoder", "self", True, "infer", "init", "class")
_OTHER_FILE = "from inference import Synthesizer\n\n\ndef run(x):\n    return Synthesizer().vocoder(x)\n"
# each reaches (or may reach) the instance model's forward, or reads it where it cannot be followed
INSTANCE_REACHING = {
    "called": (_CLASS.replace("y = self.vocoder.infer(x)", "y = self.vocoder(x)"), None),
    "called_in_another_method": (_class_script("vocoder", "self", True, "infer", "init", "class",
                                               extra="\n    def raw(self, x):\n        return self.vocoder(x)\n"), None),
    "called_from_outside": (_class_script("vocoder", "self", True, "infer", "init", "class",
                                          main_extra="    print(synthesizer.vocoder(torch.randn(2, 8).cuda()).dtype)\n"), None),
    "read_in_another_file": (_CLASS, _OTHER_FILE),
    "aliased": (_CLASS.replace("        y = self.vocoder.infer(x)\n", "        self.net = self.vocoder\n        y = self.net(x)\n"), None),
    "by_name": (_CLASS.replace("y = self.vocoder.infer(x)", 'y = getattr(self, "vocoder")(x)'), None),
    "nested_function": (_CLASS.replace("        y = self.vocoder.infer(x)\n", "        run = lambda v: self.vocoder(v)\n        y = run(x)\n"), None),
    "another_instance": (_class_script("vocoder", "self", True, "infer", "init", "class",
                                       extra="\n    def compare(self, other, x):\n        return other.vocoder(x)\n"), None),
    "subclass": (_CLASS.replace("\n\ndef main():", "\n\nclass Raw(Synthesizer):\n    def raw(self, x):\n        return self.vocoder(x)\n\n\ndef main():"), None),
    "another_package_model": (_CLASS.replace("self.vocoder = Vocoder()", "self.vocoder = torch.hub.load('org/repo', 'vocoder')"), None),
    "state_dict": (_CLASS.replace("        return y\n", "        torch.save(self.vocoder.state_dict(), 'm.pt')\n        return y\n"), None),
}


@pytest.mark.parametrize("case", sorted(INSTANCE_REACHING))
def test_an_instance_model_whose_forward_may_run_keeps_the_rewrite_unsafe(tmp_path, case):
    script, other = INSTANCE_REACHING[case]
    assert script != _CLASS or other is not None, case
    compile(script, "inference.py", "exec")
    root = _project(tmp_path / "p", script)
    if other is not None:
        (root / "server.py").write_text(other)
    migrate_paths([root])
    assert (root / "inference.py").read_text() == script  # the safe run leaves it
    migrate_paths([root], unsafe_fixes=True)
    text = (root / "inference.py").read_text()
    assert "from apex" in text or "TODO(ampmigrate)" in text, text
