"""The legacy handle left unused in a script with nothing else of apex amp (a test script's
``amp_handle = amp.init(enabled=fp16)``, then the evaluation): apex's casts were on from there to
the end of the process, so the lines after it, to the end of ``main()``, go under autocast,
``enabled`` as the handle was. Safe where ``main()`` is the script's last act; unsafe, marked,
where code may run after it returns. Generated over the spellings of the handle, its
``enabled``, the apex import, the lines after it and how the script calls ``main()``; the
negatives are the shapes where apex's casts reach more than autocast would."""
from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from migrate.api import migrate_paths, migrate_source

from generated.inference_runs import printed_alike

SCRIPT = """import argparse
import sys

import torch
{import_line}


def inference(model, batches):
    with torch.no_grad():
        return [model(batch) for batch in batches]


def main({parameters}):
    parser = argparse.ArgumentParser()
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args({argv})
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).to(device)
    batches = [torch.randn(4, 8, device=device) for _ in range(3)]
{body}


{ending}"""
# apex's import, and the name the handle is reached through
IMPORTS = {
    "from apex": ("from apex import amp", "amp"),
    "import apex": ("import apex", "apex.amp"),
    "raising fallback": ('try:\n    from apex import amp\nexcept ImportError:\n    raise ImportError("Use APEX for mixed precision")', "amp"),
}
# what the handle is enabled by: the lines before it, and its arguments
ENABLED = {
    "always": ("", ""),
    "store_true": ("", "enabled=args.fp16"),
    "computed": ('use_mixed_precision = args.dtype == "float16"\n', "enabled=use_mixed_precision, verbose=False"),
    "positional": ("", 'args.fp16, loss_scale="dynamic"'),
    "comparison": ("", 'enabled=args.dtype == "float16", enable_caching=True'),
}
HANDLES = {"assigned": "amp_handle = {call}", "bare": "{call}"}
# the lines after the handle: what apex's casts reached
RESTS = {
    "helper": "outputs = inference(model, batches)\nprint('out', [str(o.dtype) for o in outputs], [round(float(o.float().sum()), 4) for o in outputs])",
    "loop": ("with torch.no_grad():\n    for batch in batches:\n        output = model(batch)\n"
             "        print('out', str(output.dtype), round(float(output.float().sum()), 4))"),
}
# where the handle stands: in main's body, or last in an arm that ends main
WHERE = {"body": "", "arm": "if not args.dtype.startswith('skip'):\n"}
# how the script calls main(): its parameters, what parse_args reads, and the script's last lines
ENDINGS = {
    "guarded call": ("", "", 'if __name__ == "__main__":\n    main()\n'),
    "sys.exit": ("", "", 'if __name__ == "__main__":\n    sys.exit(main())\n'),
    "bare call": ("", "", "main()\n"),
    "argv": ("argv=None", "argv", 'if __name__ == "__main__":\n    main(sys.argv[1:])\n'),
    # what follows computes nothing apex's casts reached
    "then idle lines": ("", "", 'if __name__ == "__main__":\n    main()\n    torch.cuda.empty_cache()\n    print("done")\n'),
}


def _script(imported="from apex", enabled="store_true", handle="assigned", rest="helper", where="body", ending="guarded call") -> str:
    import_line, amp = IMPORTS[imported]
    before, arguments = ENABLED[enabled]
    lines = before + HANDLES[handle].format(call=f"{amp}.init({arguments})") + "\n" + RESTS[rest] + "\n"
    if WHERE[where]:
        lines = WHERE[where] + "".join(f"    {line}\n" for line in lines.splitlines())
    parameters, argv, last = ENDINGS[ending]
    body = "".join(f"    {line}\n" if line else "\n" for line in lines.splitlines())
    return SCRIPT.format(import_line=import_line, parameters=parameters, argv=argv, body=body.rstrip("\n"), ending=last)


# every spelling of each feature, the features cycled against one another
VARIANTS = [
    (imported, enabled, handle, rest, where, ending)
    for (enabled, ending), imported, handle, rest, where in zip(
        itertools.product(ENABLED, ENDINGS), itertools.cycle(IMPORTS), itertools.cycle(HANDLES),
        itertools.cycle(RESTS), itertools.cycle([*WHERE, "body"]))
]


def _said(result) -> str:
    return " ".join(d.message + " " + (d.fix.message + " " + d.fix.why_unsafe if d.fix else "") for d in result.diagnostics)


@pytest.mark.parametrize("imported, enabled, handle, rest, where, ending", VARIANTS)
def test_the_lines_after_an_unused_handle_run_under_autocast(imported, enabled, handle, rest, where, ending):
    source = _script(imported, enabled, handle, rest, where, ending)
    result = migrate_source(source, "test_net.py")
    new = result.new_source
    assert "apex" not in new and ".init(" not in new, new
    assert "TODO(ampmigrate)" not in new and all(d.fix is None or not d.fix.why_unsafe for d in result.diagnostics), _said(result)
    expected = {"always": "", "store_true": ", enabled=args.fp16", "computed": ", enabled=use_mixed_precision",
                "positional": ", enabled=args.fp16", "comparison": ', enabled=args.dtype == "float16"'}[enabled]
    region = f'with torch.autocast("cuda", dtype=torch.float16{expected}):'
    assert region in new, new
    # the region holds every line after the handle, to the end of main
    after = new.split(region)[1].split("\n\n\n")[0]
    assert "print(" in after and ("inference(model, batches)" in after or "model(batch)" in after), new
    compile(new, "test_net.py", "exec")


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("variant", [VARIANTS[1], pytest.param(VARIANTS[6], marks=pytest.mark.slow),
                                     pytest.param(VARIANTS[11], marks=pytest.mark.slow)])
@pytest.mark.parametrize("argv", [["--fp16", "--dtype", "float16"], []])
def test_the_migrated_script_infers_as_apex_did(tmp_path, variant, argv):
    """The original on ampshim (apex's casts from the handle on) and its rewrite print the same
    outputs, in the same precision, with mixed precision on and off."""
    expected = printed_alike(tmp_path, _script(*variant), "test_net.py", argv)
    assert ("bfloat16" in expected) == (bool(argv) or variant[1] == "always"), expected


def _unsafe_only(source: str, reason: str) -> None:
    """A safe run leaves ``source`` as it is; ``--unsafe-fixes`` rewrites it with a marker saying ``reason``."""
    assert migrate_source(source, "test_net.py").new_source == source
    unsafe = migrate_source(source, "test_net.py", unsafe_fixes=True).new_source
    assert "torch.autocast(" in unsafe and "TODO(ampmigrate)" in unsafe and reason in re.sub(r"\s*\n\s*#\s*", " ", unsafe), unsafe


# main() is not the script's last act: apex's casts outlived it, autocast does not
OUTLIVED = {
    "called twice": lambda source: source.replace("    main()\n", "    main()\n    main()\n"),
    "called with more after": lambda source: source.replace("    main()\n", '    main()\n    evaluate_again()\n'),
    "called in a loop": lambda source: source.replace("    main()\n", "    for _ in range(2):\n        main()\n"),
    "handed to a launcher": lambda source: source.replace("    main()\n", "    launch(main)\n"),
    "never called": lambda source: source.replace('if __name__ == "__main__":\n    main()\n', ""),
    "a method": lambda source: _as_method(source),
}


def _as_method(source: str) -> str:
    """``main`` as a method of a class the script makes, then calls."""
    head, rest = source.split("def main(")
    main, ending = rest.split("\n\n\nif __name__")
    method = "".join(f"    {line}\n" if line else "\n" for line in ("def main(self" + (", " if not main.startswith(")") else "") + main).splitlines())
    return f"{head}class Tester:\n{method}\n\nif __name__{ending.replace('main()', 'Tester().main()')}"


@pytest.mark.parametrize("outlived", sorted(OUTLIVED))
def test_a_handle_whose_function_may_not_end_the_script_is_unsafe(outlived):
    source = OUTLIVED[outlived](_script())
    compile(source, "test_net.py", "exec")
    _unsafe_only(source, "this file does not show that nothing runs after it returns")


def test_a_function_another_file_imports_is_unsafe(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "test_net.py").write_text(_script())
    (tmp_path / "bench.py").write_text("from test_net import main\n\nmain()\nprint('again')\n")
    migrate_paths([tmp_path])
    assert "apex" in (tmp_path / "test_net.py").read_text()
    migrate_paths([tmp_path], unsafe_fixes=True)
    assert "TODO(ampmigrate)" in (tmp_path / "test_net.py").read_text()


# apex's casts reached code that autocast would not cover as they did: left on apex, said by AMP009
KEPT = {
    "in a loop": lambda source: source.replace("    amp_handle = amp.init(enabled=args.fp16)\n",
                                               "    for _ in range(1):\n        amp_handle = amp.init(enabled=args.fp16)\n"),
    "in a try": lambda source: source.replace("    amp_handle = amp.init(enabled=args.fp16)\n",
                                              "    try:\n        amp_handle = amp.init(enabled=args.fp16)\n    except RuntimeError:\n        pass\n"),
    "at module level": lambda source: source.replace("    amp_handle = amp.init(enabled=args.fp16)\n", "").replace(
        "\n\ndef inference", "\namp_handle = amp.init()\n\n\ndef inference"),
    "allowing banned functions": lambda source: source.replace("amp.init(enabled=args.fp16)", "amp.init(enabled=args.fp16, allow_banned=True)"),
    "then training": lambda source: source.replace("    outputs = inference(model, batches)\n",
                                                   "    model(batches[0]).sum().backward()\n    outputs = inference(model, batches)\n"),
    "stepping after": lambda source: source.replace("    outputs = inference(model, batches)\n",
                                                    "    outputs = inference(model, batches)\n    scheduler.step()\n"),
    "defining after": lambda source: source.replace("    outputs = inference(model, batches)\n",
                                                    "    def show(x):\n        return x\n    outputs = inference(model, batches)\n"),
    "handle in use": lambda source: source.replace("    outputs = inference(model, batches)\n",
                                                   "    outputs = inference(model, batches)\n    print(amp_handle)\n"),
    "nothing after": lambda source: source.split("    outputs = inference")[0] + '\n\nif __name__ == "__main__":\n    main()\n',
    "two handles": lambda source: source.replace("    amp_handle = amp.init(enabled=args.fp16)\n",
                                                 "    amp_handle = amp.init(enabled=args.fp16)\n    other = amp.init(enabled=False)\n"),
}


@pytest.mark.parametrize("kept", sorted(KEPT))
@pytest.mark.parametrize("unsafe_fixes", [False, True])
def test_a_handle_whose_casts_autocast_cannot_cover_stays(kept, unsafe_fixes):
    source = KEPT[kept](_script())
    assert source != _script()
    compile(source, "test_net.py", "exec")
    result = migrate_source(source, "test_net.py", unsafe_fixes=unsafe_fixes)
    assert "torch.autocast(" not in result.new_source and "amp.init(" in result.new_source, result.new_source
    assert any(d.code == "AMP009" for d in result.diagnostics), _said(result)


DECORATED = """import torch
from apex import amp


@amp.float_function
def pool(x):
    return x.float().mean(dim=1)
"""


O2_TRAINING = """import torch
from apex import amp

from ops import pool


def main(model, optimizer, loader):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2")
    for x in loader:
        loss = pool(model(x)).sum()
        with amp.scale_loss(loss, optimizer) as scaled:
            scaled.backward()
        optimizer.step()
"""


@pytest.mark.parametrize("ending, training, safe", [("guarded call", None, True), ("called twice", None, False),
                                                    ("guarded call", O2_TRAINING, False)])
def test_cast_decorators_go_with_a_migrated_test_script(tmp_path, ending, training, safe):
    """maskrcnn-benchmark's layout: the decorators stayed on apex while the test script's handle
    did; where the handle's rewrite is safe, theirs is too. Where they stay on apex (an O2 training
    script keeps apex), the handle stays too: apex's decorators cast nothing under native autocast."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "ops.py").write_text(DECORATED)
    if training is not None:
        (tmp_path / "train.py").write_text(training)
    script = _script() if ending == "guarded call" else OUTLIVED[ending](_script())
    (tmp_path / "test_net.py").write_text(script)
    results = migrate_paths([tmp_path])
    assert ("from apex" not in (tmp_path / "ops.py").read_text()) is safe
    assert ("from apex" not in (tmp_path / "test_net.py").read_text()) is safe
    if training is not None:  # said at the handle; an unsafe run migrates the decorators with the O2 script
        said = _said(next(result for result in results if Path(result.filename).name == "test_net.py"))
        assert "apex's cast decorators stay on apex (ops.py:5: apex's `amp.initialize` stays at train.py:8)" in said, said
        migrate_paths([tmp_path], unsafe_fixes=True)
        assert all("from apex" not in (tmp_path / name).read_text() for name in ("ops.py", "train.py", "test_net.py"))


def test_a_model_cast_to_float16_keeps_the_handle():
    """apex's casts fed a float16 model float32 inputs: reported, as with `amp.initialize`."""
    source = _script().replace("    batches = [", "    model.half()\n    batches = [", 1)
    assert "model.half()" in source
    assert migrate_source(source, "test_net.py", unsafe_fixes=True).new_source == source
