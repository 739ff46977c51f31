"""An apex import that nothing uses, kept because its ``try`` asks whether apex is installed
(``except ImportError: HAS_APEX = False``): the file is left needing apex, and a finding says
why, where it used to be listed as needing apex with no finding at all (a learner module of an
NLP library). Over how the import, the flag and the handler are spelled, and where the flag is read."""
from __future__ import annotations

import itertools

import pytest

from migrate.api import migrate_source

IMPORTS = {"from": ("from apex import amp", "from apex import amp"), "module": ("import apex", "import apex"),
           "optimizers": ("from apex.optimizers import FusedAdam", "from apex.optimizers import FusedAdam")}
HANDLERS = ("except ImportError:", "except Exception:", "except (ImportError, ModuleNotFoundError):")
READS = {"none": "", "in_a_function": "\n\ndef fp16_ok(args):\n    return args.fp16 and IS_AMP_AVAILABLE\n",
         "exported": "\n__all__ = ['IS_AMP_AVAILABLE']\n"}


@pytest.mark.parametrize("imported, handler, read", list(itertools.product(IMPORTS, HANDLERS, READS)))
def test_an_unused_import_kept_by_its_availability_check_is_reported(imported, handler, read):
    line, spelled = IMPORTS[imported]
    source = (f"import torch\n\ntry:\n    {line}\n\n    IS_AMP_AVAILABLE = True\n{handler}\n    IS_AMP_AVAILABLE = False\n"
              f"{READS[read]}\n\ndef relu(x):\n    return torch.relu(x)\n")
    result = migrate_source(source, filename="learner.py")
    assert result.new_source in (None, source)  # the check stays: its answer may be read anywhere
    [finding] = [d for d in result.diagnostics if d.code == "AMP001"]
    assert f"`{spelled}` is never used; it stays, in a `try` that asks whether apex is installed" in finding.message
    assert "`IS_AMP_AVAILABLE = False` where not" in finding.message and finding.fix is None


def test_an_import_the_file_uses_is_not_reported_so():
    source = ("try:\n    from apex import amp\n    HAS_APEX = True\nexcept ImportError:\n    HAS_APEX = False\n\n\n"
              "def version():\n    return amp.__name__\n")
    assert not [d for d in migrate_source(source, filename="probe.py").diagnostics if "is never used" in d.message]
