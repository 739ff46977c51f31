"""``migrate.flow.receivers``: every read of a handed-on value, or None where the file hides one."""
import libcst as cst
import pytest

from migrate.flow.receivers import receivers
from migrate.tree_walk import children, descendants


def _reads(source: str, marked: str = "amp"):
    """The reads of the value handed on at the line marked ``# here``."""
    module = cst.parse_module(source)
    parent = {}
    for node in descendants(module):
        for child in children(node, tokens=False):
            parent[id(child)] = node
    line = next(i for i, text in enumerate(source.splitlines(), 1) if text.endswith("# here"))
    positions = cst.MetadataWrapper(module, unsafe_skip_copy=True).resolve(cst.metadata.PositionProvider)
    value = next(node for node in descendants(module) if type(node) is cst.Name and node.value == marked
                 and positions[node].start.line == line and not _is_keyword(parent, node))
    found = receivers(module, parent, value)
    return None if found is None else sorted((read.method or "test") for read in found)


def _is_keyword(parent, node):
    """``f(amp=...)``'s keyword or ``self.amp``'s attribute: a name, not the value."""
    outer = parent.get(id(node))
    return isinstance(outer, cst.Arg) and outer.keyword is node or isinstance(outer, cst.Attribute) and outer.attr is node


RESTORE = """
def restore(path, model, amp=None):
    state = load(path)
    if amp is not None:
        amp.load_state_dict(state["amp"])
"""

HANDED = {
    "keyword": "restore(p, m, amp=amp)  # here\n",
    "keyword, off when disabled": "restore(p, m, amp=amp if fp16 else None)  # here\n",
    "position": "restore(p, m, amp)  # here\n",
}


@pytest.mark.parametrize("call", HANDED.values(), ids=HANDED.keys())
def test_a_same_file_function_receives_it(call):
    assert _reads(RESTORE + call) == ["load_state_dict", "test"]


def test_a_method_of_the_file_receives_it_by_position_past_self():
    source = ("class Trainer:\n    def fit(self, data, amp):\n        with amp.scale_loss(l, o) as s:\n"
              "            s.backward()\n        if not amp:\n            pass\n\n"
              "trainer.fit(data, amp)  # here\n")
    assert _reads(source) == ["scale_loss", "test"]


def test_hand_ons_are_followed():
    source = (RESTORE + "def train(model, amp):\n    amp.state_dict()\n    restore(p, model, amp=amp)\n\n"
              "train(model, amp)  # here\n")
    assert _reads(source) == ["load_state_dict", "state_dict", "test"]


def test_an_attribute_of_the_class_receives_it():
    source = ("class Trainer:\n    def __init__(self, fp16):\n        self.amp = amp if fp16 else None  # here\n\n"
              "    def step(self, loss):\n        if self.amp is not None:\n"
              "            with self.amp.scale_loss(loss, self.opt) as s:\n                s.backward()\n\n"
              "    def close(self):\n        self.amp = None\n")
    assert _reads(source) == ["scale_loss", "test"]


HIDDEN = {
    "callee elsewhere": "from helpers import restore\nrestore(p, m, amp=amp)  # here\n",
    "callee defined twice": RESTORE + RESTORE + "restore(p, m, amp=amp)  # here\n",
    "parameter rebound": "def f(amp):\n    amp = other\n    amp.x()\nf(amp)  # here\n",
    "stored in a list": "def f(amp):\n    keep = [amp]\nf(amp)  # here\n",
    "returned": "def f(amp):\n    return amp\nf(amp)  # here\n",
    "attribute read, not called": "def f(amp):\n    h = amp.handle\nf(amp)  # here\n",
    "handed to another module": "def f(amp):\n    lib.g(amp=amp)\nf(amp)  # here\n",
    "after a star argument": RESTORE + "restore(*a, amp)  # here\n",
    "attribute given another value": ("class T:\n    def a(self):\n        self.amp = amp  # here\n"
                                      "    def b(self):\n        self.amp = other\n"),
    "not handed on": "amp  # here\n",
}


@pytest.mark.parametrize("source", HIDDEN.values(), ids=HIDDEN.keys())
def test_a_read_the_file_does_not_show_is_none(source):
    assert _reads(source) is None


def test_only_reads_of_the_variable_count():
    source = ("def f(amp):\n    cfg.amp = 1\n    g(amp=2)\n    amp.state_dict()\n\n"
              "def g(amp=None):\n    pass\n\nf(amp)  # here\n")
    assert _reads(source) == ["state_dict"]
