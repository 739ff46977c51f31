"""``from apex.fp16_utils import *`` where the file names none of what it binds: removed (AMP001),
so that the migrated file no longer needs apex, in each spelling around it."""
import itertools

import pytest

from migrate.api import migrate_source
from migrate.apex_nodes import FP16_UTILS_NAMES

PLACES = {
    "top": "{star}\n",
    "beside_amp": "{star}\nfrom apex import amp, optimizers\n",
    "guarded": "try:\n    {star}\n    from apex import amp\nexcept ImportError:\n    print('install apex for fp16')\n",
    "in_function": "def setup():\n    {star}\n    return 1\n",
}
USES = ["", "print(torch.ones(1))\n", "model = torch.nn.Linear(2, 2)\nmodel.tofp16 = None\n"]


@pytest.mark.parametrize("place,use", list(itertools.product(PLACES, USES)))
def test_an_unused_star_import_goes(place, use):
    source = "import torch\n" + PLACES[place].format(star="from apex.fp16_utils import *") + use
    result = migrate_source(source, filename="train.py")
    assert result.error is None
    assert "apex" not in result.new_source, result.new_source
    compile(result.new_source, "train.py", "exec")


@pytest.mark.parametrize("name", sorted(FP16_UTILS_NAMES))
def test_a_star_import_whose_names_are_used_stays(name):
    source = f"import torch\nfrom apex.fp16_utils import *\n\nresult = {name}\n"
    result = migrate_source(source, filename="train.py")
    assert "from apex.fp16_utils import *" in result.new_source


@pytest.mark.parametrize("kept", ["from apex.fp16_utils import *  # noqa: F401\n",
                                  "__all__ = ['network_to_half']\nfrom apex.fp16_utils import *\n",
                                  "try:\n    from apex.fp16_utils import *\nexcept ImportError:\n    HAS_APEX = False\n"])
def test_a_star_import_kept_on_purpose(kept):
    result = migrate_source("import torch\n" + kept, filename="train.py")
    assert "from apex.fp16_utils import *" in result.new_source


@pytest.mark.parametrize("name", ["network_to_half", "FP16_Optimizer", "to_python_float"])
@pytest.mark.parametrize("alone", [
    "'''\nif opt.fp16:\n    model = {name}(model)\n'''\n",  # code commented out in a string
    '"""Trains with {name} where asked."""\n',  # a docstring
])
def test_a_name_only_in_a_string_standing_alone_does_not_keep_the_star_import(name, alone):
    """A re-identification test script keeps its old fp16 lines in a bare ``'''...'''`` block:
    a string standing alone as a statement never runs, so the names in it use nothing."""
    source = "import torch\nfrom apex.fp16_utils import *\n\n" + alone.format(name=name) + "model = torch.nn.Linear(2, 2)\n"
    result = migrate_source(source, filename="test.py")
    assert "apex" not in result.new_source, result.new_source


@pytest.mark.parametrize("name", ["network_to_half", "FP16_Optimizer"])
def test_a_name_in_a_string_handed_to_eval_still_keeps_it(name):
    source = f"import torch\nfrom apex.fp16_utils import *\n\nmodel = eval('{name}')(torch.nn.Linear(2, 2))\n"
    assert "from apex.fp16_utils import *" in migrate_source(source, filename="test.py").new_source
