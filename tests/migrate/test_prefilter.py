"""The check before parsing: it skips files full of the word ``amp``, and never one a rule would report."""
from __future__ import annotations

from pathlib import Path

import pytest

from migrate.api import select_rules
from migrate.engine import run_rules
from migrate.prefilter import PLAIN_RUN_STEP_WORDS, PLAIN_RUN_WORDS, needs_parsing, step_words, trigger_words
from migrate.rules import all_rules
from migrate.types import holds_trigger, triggers_pattern

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
_FILES = sorted(
    [*FIXTURES.glob("migrate/*.py"), *FIXTURES.glob("corpus/*.py"), *FIXTURES.glob("legacy/*.py")]
)


def test_plain_run_words_are_the_default_rules_words():
    words = tuple(sorted({word for rule in all_rules() if rule.DEFAULT for word in rule.TRIGGERS}))
    assert tuple(sorted(PLAIN_RUN_WORDS)) == words, f"set migrate.prefilter.PLAIN_RUN_WORDS = {words!r}"


def test_plain_run_step_words_are_those_only_the_default_step_rules_read():
    stepping = step_words([rule for rule in all_rules() if rule.DEFAULT])
    assert PLAIN_RUN_STEP_WORDS == stepping, f"set migrate.prefilter.PLAIN_RUN_STEP_WORDS = {set(stepping)!r}"


@pytest.mark.parametrize(
    ("rule", "source"),
    [
        pytest.param(rule, case.code, id=f"{rule.CODE}-INVALID{index}")
        for rule in all_rules()
        for index, case in enumerate(rule.INVALID)
    ],
)
def test_every_rule_example_is_parsed(rule, source):
    assert needs_parsing(source, trigger_words([rule]), step_words([rule]))
    if rule.DEFAULT:
        assert needs_parsing(source, trigger_words(None), step_words(None))


@pytest.mark.parametrize("path", _FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_fixture_a_rule_reports_on_is_skipped(path):
    text = path.read_text(encoding="utf-8")
    for rules, selection in ((select_rules(), None), (select_rules(["ALL"]), all_rules()), (select_rules(["AMP1"]),) * 2):
        outcome = run_rules(text, str(path), rules, fix=False)
        if outcome.diagnostics:
            assert needs_parsing(text, trigger_words(selection), step_words(selection)), [d.code for d in outcome.diagnostics]


@pytest.mark.parametrize(
    "source",
    [
        "parser.add_argument('--amp', action='store_true', help='mixed precision (needs apex or torch.amp)')\n",
        "def train(args):\n    use_amp = args.amp\n    if args.amp_dtype == 'bf16':\n        use_amp = False\n    return use_amp\n",
        "config = dict(amp=True, apex=False)\nprint('install apex for fp16 training')\n",
        "# ampere GPUs: amp is faster with apex\nfrom torch.cuda import amp\nprint(amp.common.amp_definitely_not_available())\n",
        "try:\n    import apex_free_module\nexcept ImportError:\n    raise\nuse_amp = True\n",
        "use_amp = True\ndef broken(:\n",  # nothing of apex's there: not worth reporting its syntax error
        "amp_scale = 2\nclamp.initialize()\nprint('apex_version')\n",
    ],
)
def test_files_that_only_say_amp_are_skipped(source):
    assert not needs_parsing(source, trigger_words(None))
    assert not needs_parsing(source.encode(), trigger_words(None))


@pytest.mark.parametrize(
    "source",
    [
        "from apex import amp\n",
        "import apex.optimizers as apex_optim\n",
        "try:\n    from amp_C import multi_tensor_l2norm\nexcept ImportError:\n    print('install apex for amp')\n",
        "import apex_C\nflat = apex_C.flatten(tensors)\n",
        "def step(loss, optimizer, amp):\n    with amp.scale_loss(loss, optimizer) as scaled:\n        scaled.backward()\n",
        "class Hook:\n    def state(self):\n        return self.amp.state_dict()\n",
        "import importlib\nmodule = importlib.import_module('apex.amp')\n",
        "try:\n    pass\nexcept ImportError:\n    amp = None\n",
        "try:\n    HAS_AMP = True\nexcept (ModuleNotFoundError, OSError):\n    HAS_AMP = False\n",
        "# TODO(ampmigrate): put the forward pass under torch.autocast\nuse_amp = True\n",
        "from apex import amp\ndef broken(:\n",  # not parsed here: handed on, so that the error is reported
        "x = amp  \\\n    .initialize(model)\n",
        "x = (amp  # the handle\n     .scale_loss(loss, opt))\n",
        "use_amp = False\nfor x, y in loader:\n    model(x, y).backward()\n    print(loss.item())\n",
        "# no apex here\nfor batch in data:\n    optimizer.step()\n",
    ],
)
def test_files_with_a_shape_the_rules_read_are_parsed(source):
    assert needs_parsing(source, trigger_words(None))


@pytest.mark.parametrize(
    "source",
    [
        "with torch.autocast('cuda'):\n    for x in loader:\n        print(model(x).argmax(1).tolist())\n",
        "scaler = StandardScaler()\nfeatures = scaler.fit_transform(features)\nprint(features.mean().item())\n",
        "def predict(model, x, use_amp):\n    with torch.cuda.amp.autocast(enabled=use_amp):\n        return model(x).float()\n",
        "# not .step() but a step size\ngrad_scaler_steps = 4\nscaler = MinMaxScaler(step_size=2)\n",
        "with torch.autocast('cuda'):\n    y = model(x)\ndef broken(:\n",  # no step: its error is not ours to report
    ],
)
def test_files_whose_words_only_step_rules_read_are_skipped_without_a_step(source):
    assert not needs_parsing(source, trigger_words(None), step_words(None))
    assert not needs_parsing(source.encode(), trigger_words(None), step_words(None))
    assert needs_parsing(source, trigger_words(None))  # without step words: every file holding them


@pytest.mark.parametrize(
    "source",
    [
        "with torch.autocast('cuda'):\n    loss = model(x)\nloss.backward()\n",
        "for x in loader:\n    scaler.step(opt)\n",
        "model.half()\nwith torch.autocast('cuda'):\n    y = model(x)\n",
        "model.to(device, dtype=half)\nwith autocast():\n    y = model(x)\n",
        "model = model.to(torch.float16)\nwith torch.autocast('cuda'):\n    y = model(x)\n",
        "model = model.to(dtype='float16')\nwith torch.autocast('cuda'):\n    y = model(x)\n",
        "with torch.autocast('cuda'):\n    loss = model(x)\nloss.backward()\ndef broken(:\n",  # handed on: its error is reported
    ],
)
def test_files_whose_words_only_step_rules_read_are_parsed_with_a_step_or_a_cast(source):
    assert needs_parsing(source, trigger_words(None), step_words(None))


def test_a_selection_with_a_rule_reading_a_step_word_everywhere_parses_every_file_holding_it():
    inference = "with torch.cuda.amp.autocast():\n    y = model(x)\n"
    assert not step_words(select_rules(["AMP020", "AMP104"]))
    assert needs_parsing(inference, trigger_words(select_rules(["AMP020"])), step_words(select_rules(["AMP020"])))
    assert not needs_parsing(inference, trigger_words(select_rules(["AMP104"])), step_words(select_rules(["AMP104"])))


def test_rare_words_decide_without_parsing():
    words = trigger_words(select_rules(["AMP02"]))
    assert needs_parsing("scaler = torch.cuda.amp.GradScaler()\n", words)
    assert not needs_parsing("use_amp = True\n", ("amp", "autocast"))
    assert not needs_parsing("x = 1\n", words)


_TRIGGER_TEXTS = [
    "use_amp = True", "AMP_LEVEL = 'O1'", "x = clamp(y)", "sample = example", "from apex import amp",
    "ampmigrate", "ampmigratex", "xampmigrate", "xcustom_fwd", "custom_fwdx", "@custom_fwd", "my_custom_bwd_x",
    "GRADSCALER()", "torch.cuda.amp.GradScaler", "scaler2 = 1", "2scaler", "amp", "", "camp amp",
    "# noqa: AMP100", "sampleamp_amp", "ſcaler = 1", "é amp", "éamp", "amp\u00e9", "name = 'Kelvin \u212a'",
    # the characters that match an ASCII letter in another case, beside a word or in one, and others that do not
    "\u0131amp", "amp\u0131", "\u0130amp = 1", "amp\u0130", "\u017famp", "amp\u017f", "\u212aamp", "amp\u212a",
    "Gradſcaler()", "ſcaler ü", "ÄMP = 1", "über_amp", "amp_über", "AMPé = 1", "naïve autocast", "ﬀ amp", "Ωscaler",
]


@pytest.mark.parametrize("text", _TRIGGER_TEXTS)
@pytest.mark.parametrize("words", [PLAIN_RUN_WORDS, ("custom_fwd", "custom_bwd", "amp"), ("noqa",), ()])
def test_the_trigger_search_finds_what_the_regex_finds(text, words):
    for content in (text, text.encode()):
        expected = triggers_pattern(words, isinstance(content, bytes)).search(content) is not None
        assert holds_trigger(content, words) is expected, content


@pytest.mark.parametrize("path", sorted(FIXTURES.rglob("*.py")), ids=lambda path: path.name)
def test_the_trigger_search_agrees_with_the_regex_on_the_fixtures(path):
    words = tuple(sorted({word for rule in all_rules() for word in rule.TRIGGERS or ()}))
    for content in (path.read_text(encoding="utf-8"), path.read_bytes()):
        expected = triggers_pattern(words, isinstance(content, bytes)).search(content) is not None
        assert holds_trigger(content, words) is expected
