"""AMP007's unsafe removal of a cast registration in a file that initializes nothing (apex amp
starts in another file) leaves a ``TODO(ampmigrate)`` marker where the call stood, on a ``pass``;
the import guard around it (``try: import apex ... except ImportError: raise``) keeps it, rather
than going with the marker. Over where the registration sits and how apex is imported."""
from __future__ import annotations

import itertools
import textwrap

import pytest

from migrate.api import migrate_source

IMPORTS = {"from": ("from apex import amp", "amp"), "module": ("import apex", "apex.amp")}
PLACES = {
    "module": "{import_line}\n{call}\n",
    "guarded": "{import_line}\nif args.fp16:\n    {call}\n",
    "function": "{import_line}\n\n\ndef setup(args):\n    {call}\n    return args\n",
    "try_in_function": ("def setup(args):\n    if args.fp16:\n        try:\n            {import_line}\n            {call}\n"
                        "        except ImportError:\n            raise ImportError('needs apex')\n    return args\n"),
}


@pytest.mark.parametrize("imported, place", list(itertools.product(IMPORTS, PLACES)))
def test_the_unsafe_removal_leaves_a_marker(imported, place):
    import_line, prefix = IMPORTS[imported]
    call = f'{prefix}.register_half_function(torch, "einsum")'
    source = "import torch\n" + PLACES[place].format(import_line=import_line, call=call)
    compile(source, "setup.py", "exec")
    safe = migrate_source(source, "setup.py").new_source
    assert safe == source  # only reported without --unsafe-fixes
    new = migrate_source(source, "setup.py", unsafe_fixes=True).new_source
    compile(new, "setup.py", "exec")
    assert "register_half_function(torch" not in new.replace(f"`{call}`", ""), new
    flat = " ".join(line.strip(" #") for line in new.splitlines())
    assert f"TODO(ampmigrate): review, this rewrite is unsafe: removed `{call}`: apex amp is initialized in another file" in flat, new
    assert migrate_source(new, "setup.py", unsafe_fixes=True).new_source == new  # a second run leaves it
