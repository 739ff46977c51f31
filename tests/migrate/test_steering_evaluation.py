"""An evaluation in the training loop whose result steers the training (``scheduler.step(val_loss)``
for ReduceLROnPlateau, an early stop, a patience counter) ran under apex's casts: it goes under an
autocast of its own, enabled as the loop's region, or the decay step and the stopping epoch can
move. Generated over how the evaluation is called and bound, how its result steers, and where it
stands in the loop; the negatives are results that only report."""
from __future__ import annotations

import itertools

import pytest

from migrate.api import migrate_source

from generated.inference_runs import printed_alike

# the imports and the evaluation both scripts share
HEAD = """import argparse

import torch
from apex import amp


def validate(model, batches):
    model.eval()
    with torch.no_grad():
        total = sum(float(torch.nn.functional.mse_loss(model(x), y)) for x, y in batches)
    model.train()
    print("out", "val", round(total / len(batches), 6))
    return total / len(batches), len(batches)


class Meter:
    def __init__(self):
        self.values = []

    def update(self, value):
        self.values.append(value)

    def last(self):
        return self.values[-1]
"""

SCRIPT = HEAD + """

def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=6)
    args = parser.parse_args(argv)
    meter = Meter()
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0, factor=0.5)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    batches = [(torch.randn(16, 8, device=device), torch.randn(16, 1, device=device)) for _ in range(4)]
    val_batches = [(torch.randn(16, 8, device=device), torch.randn(16, 1, device=device)) for _ in range(2)]
    best, bad = float("inf"), 0
    for epoch in range(args.epochs):
        for x, y in batches:
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            with amp.scale_loss(loss, optimizer) as scaled:
                scaled.backward()
            optimizer.step()
{evaluation}
        print("out", epoch, optimizer.param_groups[0]["lr"], round(float(model[0].weight.float().sum()), 5))


if __name__ == "__main__":
    main()
"""
# how the evaluation is called and what it binds: the line, and the name holding the loss
CALLS = {
    "pair": ("val_loss, _ = validate(model, val_batches)", "val_loss"),
    "indexed": ("val_loss = validate(model, val_batches)[0]", "val_loss"),
    "keyword": ("result = validate(model=model, batches=val_batches)", "result[0]"),
    "starred": ("val_loss, *rest = validate(model, val_batches)", "val_loss"),
}
# how the result steers the training
STEERS = {
    "plateau": "scheduler.step({loss})",
    "plateau keyword": "scheduler.step(metrics={loss})",
    "early stop": "if {loss} > 50:\n    break",
    "patience": "if {loss} < best:\n    best, bad = {loss}, 0\nelse:\n    bad += 1\nif bad > 3:\n    break\nscheduler.step(epoch)",
    "returning": "scheduler.step({loss})\nif {loss} < 1e-6:\n    return",
    "through an object": "meter.update({loss})\nscheduler.step(meter.last())",
}
# where the evaluation stands in the epoch loop
WHERE = {"loop body": "", "every other epoch": "if epoch % 2 == 0:\n"}


def _script(call="pair", steers="plateau", where="loop body") -> str:
    line, loss = CALLS[call]
    evaluation = line + "\n"
    if WHERE[where]:
        evaluation = WHERE[where] + "    " + line + "\n"
        if steers in ("plateau", "plateau keyword", "returning", "through an object"):
            evaluation += "    " + STEERS[steers].format(loss=loss).replace("\n", "\n    ") + "\n"
        else:
            evaluation = "val_loss = None\n" + evaluation + "if val_loss is not None:\n" + "".join(
                f"    {text}\n" for text in STEERS[steers].format(loss=loss).splitlines())
            if call == "keyword":
                evaluation = evaluation.replace("if val_loss is not None:", "if epoch % 2 == 0:")
    else:
        evaluation += STEERS[steers].format(loss=loss) + "\n"
    body = "".join(f"        {text}\n" for text in evaluation.splitlines())
    return SCRIPT.format(evaluation=body.rstrip("\n"))


VARIANTS = [(call, steers, where) for (call, steers), where in zip(itertools.product(CALLS, STEERS), itertools.cycle(WHERE))]


@pytest.mark.parametrize("call, steers, where", VARIANTS)
def test_an_evaluation_steering_the_training_runs_under_autocast(call, steers, where):
    source = _script(call, steers, where)
    compile(source, "train.py", "exec")
    new = migrate_source(source, "train.py").new_source
    assert "apex" not in new and "TODO(ampmigrate)" not in new, new
    evaluation = CALLS[call][0]
    head, _, tail = new.partition(evaluation)
    assert tail, new
    assert head.rstrip().endswith('with torch.autocast("cuda", dtype=torch.float16):'), new
    compile(new, "train.py", "exec")


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("variant", [VARIANTS[0], VARIANTS[7], VARIANTS[13]])
def test_the_migrated_script_decays_and_stops_as_apex_did(tmp_path, variant):
    """The original on ampshim and its rewrite print the same validation losses, learning rates
    and weights each epoch: the evaluation computes in the same precision, and the plateau decays
    at the same epochs."""
    expected = printed_alike(tmp_path, _script(*variant), "train.py", [])
    assert expected.count("\n") >= 1, expected


# what only reports: the evaluation stays as it was, in float32
REPORTS = {
    "logged": "print('val', val_loss)",
    "best kept": "if val_loss < best:\n    best = val_loss\n    torch.save(model.state_dict(), 'best.pt')",
    "stepped without it": "scheduler.step(epoch)",
    # a module's function keeps nothing, though the loop leaves on a test reading that module
    "saved, a stop on the training loss": "torch.save(val_loss, 'val.pt')\nif not torch.isfinite(loss):\n    break",
    # a holder gives the value back through its attributes only: testing it for truth reads none
    "held, the holder tested": "meter.update(val_loss)\nif meter:\n    stop = not torch.isfinite(loss)\n    if stop:\n        break",
}


@pytest.mark.parametrize("report", sorted(REPORTS))
def test_an_evaluation_that_only_reports_stays_outside(report):
    source = SCRIPT.format(evaluation="".join(f"        {text}\n" for text in (
        "val_loss, _ = validate(model, val_batches)\n" + REPORTS[report]).splitlines()).rstrip("\n"))
    new = migrate_source(source, "train.py").new_source
    assert "apex" not in new, new
    head = new.partition("val_loss, _ = validate(model, val_batches)")[0]
    assert not head.rstrip().endswith("):") or "autocast" not in head.rstrip().splitlines()[-1], new


@pytest.mark.parametrize("call", ["total = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)",
                                  "total = norm_of(model.parameters(), p=2)", "total = norm_of(list(model.parameters()))"])
def test_a_call_given_what_a_method_of_the_model_returns_is_no_evaluation(call):
    """A clip of the model's parameters, its value steering a scheduler: no forward pass runs
    there, and nothing goes under autocast (a trainer's clip in its float32 branch did)."""
    source = SCRIPT.format(evaluation=f"        {call}\n        scheduler.step(total)")
    new = migrate_source(source, "train.py").new_source
    assert "from apex" not in new, new
    head = new.partition(call)[0]
    assert "autocast" not in head.rstrip().splitlines()[-1], new


def test_a_steering_call_that_trains_stays_outside():
    """A call reaching a backward pass is a training step of its own: inside an outer region its
    step would leave autocast's cached float16 weights stale for the passes after it."""
    source = _script().replace("    model.train()\n    print(", "    model.train()\n    model(batches[0][0]).sum().backward()\n    print(")
    assert source != _script()
    new = migrate_source(source, "train.py", unsafe_fixes=True).new_source  # its plain backward pass is unsafe
    head = new.partition(CALLS["pair"][0])[0]
    assert "from apex" not in new and "autocast" not in head.rstrip().splitlines()[-1], new


# the training step in a function of its own, the evaluation in the caller's epoch loop
HELPER_SCRIPT = HEAD + """

def train_one_epoch(model, optimizer, batches):
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled:
            scaled.backward()
        optimizer.step()


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--fp16", action="store_true")
    args = parser.parse_args(argv)
    meter = Meter()
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)).to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0, factor=0.5)
    net, optimizer = amp.initialize(net, optimizer, opt_level="O1"{enabled})
    batches = [(torch.randn(16, 8, device=device), torch.randn(16, 1, device=device)) for _ in range(4)]
    val_batches = [(torch.randn(16, 8, device=device), torch.randn(16, 1, device=device)) for _ in range(2)]
    best, bad = float("inf"), 0
    for epoch in range(args.epochs):
        train_one_epoch(net, optimizer, batches)
{evaluation}
        print("out", epoch, optimizer.param_groups[0]["lr"], round(float(net[0].weight.float().sum()), 5))


if __name__ == "__main__":
    main()
"""
# the region's enabled: always, or by the flag (the scaler handed to the training function)
HELPER_ENABLED = {"always": ("", ""), "flag": (", enabled=args.fp16", ", enabled=scaler.is_enabled()")}


def _helper_script(call="pair", steers="plateau", enabled="always") -> str:
    line, loss = CALLS[call]
    evaluation = (line + "\n" + STEERS[steers].format(loss=loss)).replace("model", "net")
    body = "".join(f"        {text}\n" for text in evaluation.splitlines())
    return HELPER_SCRIPT.format(enabled=HELPER_ENABLED[enabled][0], evaluation=body.rstrip("\n"))


HELPER_VARIANTS = [(call, steers, enabled) for (call, steers), enabled in zip(
    itertools.product(["pair", "keyword"], STEERS), itertools.cycle(HELPER_ENABLED))]


@pytest.mark.parametrize("call, steers, enabled", HELPER_VARIANTS)
def test_an_evaluation_in_the_loop_calling_the_training_function_runs_under_autocast(call, steers, enabled):
    source = _helper_script(call, steers, enabled)
    compile(source, "train.py", "exec")
    new = migrate_source(source, "train.py").new_source
    assert "apex" not in new and "TODO(ampmigrate)" not in new, new
    head, _, tail = new.partition(CALLS[call][0].replace("model", "net"))
    assert tail and head.rstrip().endswith(f'with torch.autocast("cuda", dtype=torch.float16{HELPER_ENABLED[enabled][1]}):'), new
    compile(new, "train.py", "exec")


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("variant", [HELPER_VARIANTS[0], HELPER_VARIANTS[3]])
@pytest.mark.parametrize("argv", [["--fp16"], []])
def test_the_migrated_helper_script_decays_as_apex_did(tmp_path, variant, argv):
    printed_alike(tmp_path, _helper_script(*variant), "train.py", argv)



TRAINER = """import torch
from apex import amp


class Trainer:
    def __init__(self, model, optimizer, batches, val_batches):
        self.model, self.optimizer = amp.initialize(model, optimizer, opt_level="O1")
        self.scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(self.optimizer, patience=0)
        self.batches, self.val_batches = batches, val_batches

    def evaluate(self):
        with torch.no_grad():
            return sum(float(self.model(x).sum()) for x in self.val_batches)

    def fit(self, epochs):
        for epoch in range(epochs):
            for x in self.batches:
                loss = self.model(x).sum()
                self.optimizer.zero_grad()
                with amp.scale_loss(loss, self.optimizer) as scaled:
                    scaled.backward()
                self.optimizer.step()
            val_loss = self.evaluate()
            self.scheduler.step(val_loss)
"""


def test_a_method_evaluating_the_model_it_holds_steers_too():
    new = migrate_source(TRAINER, "trainer.py").new_source
    assert "apex" not in new, new
    assert new.partition("val_loss = self.evaluate()")[0].rstrip().endswith('with torch.autocast("cuda", dtype=torch.float16):'), new


def test_a_script_s_own_epoch_loop_around_the_training_function_steers_too():
    """The epoch loop at module level (a script without main()): its names are the module's."""
    main = _helper_script().split("def main(argv=None):\n")[1].split("\n\nif __name__")[0]
    body = "".join(line[4:] + "\n" for line in main.splitlines()).replace("parser.parse_args(argv)", "parser.parse_args([])")
    source = _helper_script().split("def main(argv=None):")[0] + body
    compile(source, "train.py", "exec")
    new = migrate_source(source, "train.py").new_source
    assert "apex" not in new, new
    assert new.partition("val_loss, _ = validate(net, val_batches)")[0].rstrip().endswith('with torch.autocast("cuda", dtype=torch.float16):'), new


# the evaluation's own autocast, in an arm for the native mode the script also has
OWN_REGIONS = {
    "torch.cuda.amp": "with torch.cuda.amp.autocast():",
    "torch.autocast": 'with torch.autocast("cuda", dtype=torch.float16):',
    "imported": "with autocast(enabled=True):",
}


def _with_native_arm(source: str, region: str) -> str:
    native = ("def validate(model, batches, native=False):\n    model.eval()\n    with torch.no_grad():\n        if native:\n"
              f"            {region}\n                total = sum(float(torch.nn.functional.mse_loss(model(x), y)) for x, y in batches)\n"
              "        else:\n            total = sum(float(torch.nn.functional.mse_loss(model(x), y)) for x, y in batches)\n")
    plain = ("def validate(model, batches):\n    model.eval()\n    with torch.no_grad():\n"
             "        total = sum(float(torch.nn.functional.mse_loss(model(x), y)) for x, y in batches)\n")
    assert plain in source
    head = "from torch.cuda.amp import autocast\n" if region.startswith("with autocast") else ""
    return source.replace(plain, native).replace("from apex import amp\n", "from apex import amp\n" + head)


@pytest.mark.parametrize("region", sorted(OWN_REGIONS))
@pytest.mark.parametrize("steers", ["plateau", "early stop"])
def test_an_evaluation_with_its_own_region_in_a_native_arm_still_steers_under_autocast(region, steers):
    """``validate()`` holding ``with torch.cuda.amp.autocast():`` in the arm of a native mode the
    apex run never takes (an image-classification trainer's ``basic_validate``): on the apex way it
    computes in float32 unless the call goes under autocast, and its result decays the learning
    rate. Its own region updates no weight, so the outer region may hold it."""
    source = _with_native_arm(_script(steers=steers), OWN_REGIONS[region])
    compile(source, "train.py", "exec")
    new = migrate_source(source, "train.py").new_source
    assert "from apex" not in new and "TODO(ampmigrate)" not in new, new
    head, _, tail = new.partition(CALLS["pair"][0])
    assert tail and head.rstrip().endswith('with torch.autocast("cuda", dtype=torch.float16):'), new


@pytest.mark.filterwarnings("ignore")
def test_the_evaluation_with_a_native_arm_decays_as_apex_did(tmp_path):
    expected = printed_alike(tmp_path, _with_native_arm(_script(), OWN_REGIONS["torch.cuda.amp"]), "train.py", [])
    assert expected.count("\n") >= 1, expected
