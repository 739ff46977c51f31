"""``enabled=`` takes only a bool (autocast raises on an ``int``), so a flag of unknown type is
written ``bool(args.fp16)``; an argparse switch (``action="store_true"``) the file never sets
otherwise is a bool already, and is written as it is. ``and`` joins tests without parentheses
around comparisons, as a person writes them."""
import pytest

from migrate.api import migrate_source

# the function a config-loading variant calls (it runs where the test runs the rewrite)
LOAD_CONFIG = "\n\ndef load_config(args):\n    return args\n"

SOURCE = '''\
import argparse

import torch
import torch.nn.functional as F
from apex import amp


def main():
    parser = argparse.ArgumentParser()
    {option}
    parser.add_argument("--fp16_opt_level", default="O1", choices=["O0", "O1"])
    args = parser.parse_args()
    {after}
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if args.fp16:
        model, optimizer = amp.initialize(model, optimizer, opt_level=args.fp16_opt_level)
    for _ in range(3):
        x = torch.randn(8, 4)
        loss = F.mse_loss(model(x), x)
        optimizer.zero_grad()
        if args.fp16:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        optimizer.step()
'''
SWITCHES = [
    'parser.add_argument("--fp16", action="store_true")',
    "parser.add_argument('--fp16', action='store_true', help='mixed precision')",
    'parser.add_argument("--fp16", action="store_true", default=False)',
    'parser.add_argument("-f", "--fp16", action="store_true")',
    'parser.add_argument("--half", dest="fp16", action="store_true")',
    'parser.add_argument("--fp16", action="store_false", default=True)',
]
NOT_KNOWN_BOOL = [
    ('parser.add_argument("--fp16", type=int, default=0)', ""),
    ('parser.add_argument("--fp16", action="store_true", default=0)', ""),
    ('parser.add_argument("--fp16", action="store_true")', 'args.fp16 = int(args.fp16)'),
    ('parser.add_argument("--amp", action="store_true")', ""),  # another option
    # the same name on another object: a config's `fp16` may be an int
    ('parser.add_argument("--fp16", action="store_true")', 'args = load_config(args)'),
]


def scaler_line(result) -> str:
    """The GradScaler's line, on one line however the rewrite laid it out."""
    text = result.new_source[result.new_source.index("scaler = torch.amp.GradScaler("):]
    call = text[:text.index(")\n") + 1]
    return " ".join(call.split()).replace("( ", "(").replace(", )", ")")


@pytest.mark.parametrize("option", SWITCHES)
def test_an_argparse_switch_is_a_bool_already(option):
    result = migrate_source(SOURCE.format(option=option, after=""), filename="train.py")
    assert result.error is None and "from apex" not in result.new_source, result.new_source
    assert scaler_line(result) == 'scaler = torch.amp.GradScaler("cuda", enabled=args.fp16 and args.fp16_opt_level != "O0")'
    assert "bool(" not in result.new_source


@pytest.mark.parametrize("option,after", NOT_KNOWN_BOOL)
def test_a_flag_of_another_type_is_made_a_bool(option, after):
    result = migrate_source(SOURCE.format(option=option, after=after), filename="train.py")
    assert result.error is None and "from apex" not in result.new_source, result.new_source
    assert scaler_line(result) == ('scaler = torch.amp.GradScaler("cuda", enabled=bool(args.fp16) '
                                   'and args.fp16_opt_level != "O0")')


@pytest.mark.parametrize("option,after", [(SWITCHES[0], ""), *NOT_KNOWN_BOOL[:3]])
@pytest.mark.parametrize("flag", ["", "--fp16"])
def test_the_rewrite_runs_with_the_flag_on_and_off(option, after, flag, tmp_path, monkeypatch):
    """autocast and GradScaler take what the rewrite hands them, with the flag given or not."""
    source = SOURCE.format(option=option, after=after).replace('"cuda"', '"cpu"')
    result = migrate_source(source, filename="train.py")
    rewritten = result.new_source.replace('"cuda"', '"cpu"').replace("torch.float16", "torch.bfloat16")
    path = tmp_path / "train.py"
    path.write_text(rewritten + LOAD_CONFIG + "\n\nmain()\n")
    given = ([flag, "1"] if "type=int" in option else [flag]) if flag else []
    monkeypatch.setattr("sys.argv", ["train.py", *given])
    exec(compile(path.read_text(), str(path), "exec"), {"__name__": "train"})


@pytest.mark.parametrize("parts,expected", [
    (['args.fp16', 'args.level != "O0"'], 'args.fp16 and args.level != "O0"'),
    (['not args.fp32', 'level in ("O1", "O2")'], 'not args.fp32 and level in ("O1", "O2")'),
    (['args.fp16 or args.bf16', 'args.amp'], '(args.fp16 or args.bf16) and args.amp'),
    (['a if b else c', 'd'], '(a if b else c) and d'),
    (['cfg.get("fp16", False)', 'x'], 'cfg.get("fp16", False) and x'),
])
def test_and_joins_without_needless_parentheses(parts, expected):
    from migrate.apex_plan.vocabulary import conjunction
    assert conjunction(parts) == expected
    # read back, the same parts joined by one `and`
    import ast
    joined = ast.parse(expected, mode="eval").body
    assert isinstance(joined, ast.BoolOp) and [ast.unparse(v) for v in joined.values] == [
        ast.unparse(ast.parse(part, mode="eval").body) for part in parts]


# A plain name every line binding which assigns a comparison (or a negation, a bool literal) is a
# bool; one bound any other way too may hold an int.
LOCAL = '''\
import torch
from apex import amp


def main(cfg{parameter}):
    {binding}
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1", enabled=use_mp)
    {other}
    for _ in range(3):
        x = torch.randn(8, 4)
        loss = (model(x) - x).pow(2).mean()
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
'''
BOOLEAN_BINDINGS = ['use_mp = cfg.DTYPE == "float16"', "use_mp = not cfg.fp32", 'use_mp = cfg.a > 0 and cfg.b != "x"',
                    "use_mp = False"]
# (the binding, another binding of the name somewhere in the file, a parameter of that name)
OTHER_BINDINGS = [
    ("use_mp = cfg.fp16", "", ""),
    ('use_mp = cfg.DTYPE == "float16"', "use_mp += 1", ""),
    ('use_mp = cfg.DTYPE == "float16"', "for use_mp in range(1):\n        pass", ""),
    ('use_mp, other = cfg.DTYPE == "float16", 1', "", ""),
    ('use_mp = cfg.DTYPE == "float16"', "", ", use_mp=0"),
    ('use_mp = cfg.DTYPE == "float16"', "with open('f') as use_mp:\n        pass", ""),
    ('use_mp = cfg.DTYPE == "float16"', "use_mp = cfg.level", ""),
]


def _scaler_options(binding: str, other: str = "", parameter: str = "") -> str:
    result = migrate_source(LOCAL.format(binding=binding, other=other, parameter=parameter), filename="train.py")
    assert "from apex" not in result.new_source, result.new_source
    return scaler_line(result)


@pytest.mark.parametrize("binding", BOOLEAN_BINDINGS)
def test_a_name_only_ever_assigned_a_comparison_is_a_bool_already(binding):
    assert _scaler_options(binding) == 'scaler = torch.amp.GradScaler("cuda", enabled=use_mp)'


@pytest.mark.parametrize("binding, other, parameter", OTHER_BINDINGS)
def test_a_name_bound_otherwise_too_is_made_a_bool(binding, other, parameter):
    assert _scaler_options(binding, other, parameter) == 'scaler = torch.amp.GradScaler("cuda", enabled=bool(use_mp))'
