"""AMP107's fix, on generated variants that are then run: the scaler's state is saved beside the
optimizer's exactly where a GradScaler is certain to exist at the save, and the fixed script
still runs and writes it; elsewhere the finding stays, with no fix.
"""
from __future__ import annotations

import textwrap

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from migrate.engine import run_rules
from migrate.rules import all_rules

RULES = all_rules()

# Where the scaler is made, as seen from the function that writes the checkpoint.
SAFE_PLACES = ("local", "module", "global_statement", "init", "annotated_parameter")
UNSAFE_PLACES = ("branch", "parameter", "other_function", "reset_elsewhere")


def _script(place: str, dict_form: str, saver: str, quote: str, extra: int) -> str:
    own = place == "init"
    model, optimizer, scaler = ("self.model", "self.optimizer", "self.scaler") if own else ("model", "optimizer", "scaler")
    entries = [(f"{quote}model{quote}", f"{model}.state_dict()"), (f"{quote}optimizer{quote}", f"{optimizer}.state_dict()")]
    entries += [(f"{quote}epoch_{i}{quote}", str(i)) for i in range(extra)]
    if dict_form == "multiline":
        state = "{\n" + "".join(f"    {k}: {v},\n" for k, v in entries) + "}"
    else:
        state = "{" + ", ".join(f"{k}: {v}" for k, v in entries) + "}"
    call = "torch.save" if saver == "torch.save" else "save_checkpoint"
    save = (f"state = {state}\n{call}(state, path)\n" if dict_form == "named" else f"{call}({state}, path)\n")
    make = 'scaler = torch.amp.GradScaler("cpu")'
    loop = (f"for x in batches:\n"
            f"    {scaler}.scale({model}(x).sum()).backward()\n"
            f"    {scaler}.step({optimizer})\n"
            f"    {scaler}.update()\n")
    head = ("import torch\n\n\n"
            "def save_checkpoint(state, path):\n    torch.save(state, path)\n\n\n")
    if own:
        return head + (
            "class Trainer:\n"
            "    def __init__(self, model, optimizer):\n"
            "        self.model, self.optimizer = model, optimizer\n"
            "        self.scaler = torch.amp.GradScaler(\"cpu\")\n\n"
            "    def fit(self, batches, path):\n"
            + textwrap.indent(loop + save, " " * 8)
            + "\n\ndef run(model, optimizer, batches, path):\n    Trainer(model, optimizer).fit(batches, path)\n")
    body = {
        "local": make + "\n" + loop,
        "module": loop,
        "global_statement": "global scaler\n" + make + "\n" + loop,
        "branch": "if len(batches) > 0:\n    " + make + "\n" + loop,
        "parameter": loop,
        "annotated_parameter": loop,
        "other_function": make + "\n" + loop + "keep(model, optimizer, path)\n",
        "reset_elsewhere": loop,
    }[place]
    parameters = "model, optimizer, batches, path" + {
        "parameter": ", scaler", "annotated_parameter": ", scaler: torch.amp.GradScaler"}.get(place, "")
    text = head + (make + "\n\n\n" if place in ("module", "global_statement", "reset_elsewhere") else "")
    if place == "reset_elsewhere":  # never called here, but the name may be None at the save
        text += "def reset():\n    global scaler\n    scaler = None\n\n\n"
    if place == "other_function":
        text += "def keep(model, optimizer, path):\n" + textwrap.indent(save, "    ") + "\n\n"
        return text + f"def run({parameters}):\n" + textwrap.indent(body, "    ")
    text += f"def run({parameters}):\n" + textwrap.indent(body + save, "    ")
    if place in ("parameter", "annotated_parameter"):
        text += "\n\n_run = run\n\n\ndef run(model, optimizer, batches, path):\n" \
                "    _run(model, optimizer, batches, path, torch.amp.GradScaler(\"cpu\"))\n"
    return text


def _saved_by(source: str, path) -> dict:
    namespace: dict = {}
    exec(compile(source, "generated.py", "exec"), namespace)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    namespace["run"](model, optimizer, [torch.randn(4, 3) for _ in range(2)], str(path))
    return torch.load(path, weights_only=True)


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(place=st.sampled_from(SAFE_PLACES + UNSAFE_PLACES),
       dict_form=st.sampled_from(("inline", "multiline", "named")),
       saver=st.sampled_from(("torch.save", "save_checkpoint")),
       quote=st.sampled_from(("'", '"')), extra=st.integers(0, 3))
def test_the_scaler_is_saved_where_it_surely_exists_and_the_script_still_runs(
        tmp_path, place, dict_form, saver, quote, extra):
    source = _script(place, dict_form, saver, quote, extra)
    result = run_rules(source, "generated.py", RULES)
    assert result.error is None, result.error
    found = [d for d in result.diagnostics if d.code == "AMP107"]
    assert found, f"AMP107 missed:\n{source}"
    fixed = place in SAFE_PLACES and dict_form != "named"
    assert found[0].applied == fixed, source
    assert (result.source != source) == fixed
    if fixed:
        # the fix saves the state; the message says that loading it is still the user's to add
        assert "loading it is left to you" in found[0].fix.message, found[0].fix.message
        limit = max(88, *(len(line) for line in source.splitlines()))
        assert all(len(line) <= limit for line in result.source.splitlines()), result.source
        assert run_rules(result.source, "generated.py", RULES).source == result.source
    saved = _saved_by(result.source, tmp_path / "checkpoint.pt")
    assert ("scaler" in saved) == fixed
    if fixed:
        assert saved["scaler"]["scale"] == torch.amp.GradScaler("cpu").state_dict()["scale"]
        assert set(saved) - {"scaler"} == set(_saved_by(source, tmp_path / "before.pt"))
