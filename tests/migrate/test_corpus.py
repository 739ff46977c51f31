"""Acceptance of ``ampmigrate`` on a corpus of realistic apex training code (``fixtures/corpus``).

The corpus reproduces the shapes of the usage-patterns catalogue; ``fixtures/corpus/SITES.json``
counts its apex call sites by hand. Every file is migrated with safe and with unsafe fixes, and:

- the output compiles, and a second run changes nothing;
- a negative control (code that only looks like apex) is byte-identical and has no findings;
- every apex call site is migrated or reported (see ``bench/corpus_report.py`` for the exact
  definitions), and every apex use left in an output has a finding on its line;
- at least 40% of the amp-core sites (``initialize``, ``scale_loss``, ``master_params``,
  ``state_dict``/``load_state_dict``: what the held-out set's 121 sites are) are migrated with safe
  fixes, at least 85% with unsafe fixes. The other apex sites (LAMB, FP16_Optimizer, internals...)
  often have no native equivalent; they only have to be reported.

``python bench/corpus_report.py -v`` prints the same measurement per file.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_REPORT = Path(__file__).resolve().parents[2] / "bench" / "corpus_report.py"
_spec = importlib.util.spec_from_file_location("corpus_report", _REPORT)
report = sys.modules.setdefault("corpus_report", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(report)

MANIFEST = report.load_manifest()
FILES = sorted(MANIFEST)
MODES = [pytest.param(False, id="safe"), pytest.param(True, id="unsafe")]


def _measure(name: str, unsafe_fixes: bool):
    source = (report.CORPUS / name).read_text(encoding="utf-8")
    return report.measure_file(name, source, MANIFEST[name], unsafe_fixes)


@pytest.mark.slow
def test_manifest_lists_every_corpus_file_and_every_apex_use():
    on_disk = sorted(path.name for path in report.CORPUS.glob("*.py"))
    assert FILES == on_disk
    for name in FILES:
        entry = MANIFEST[name]
        source = (report.CORPUS / name).read_text(encoding="utf-8")
        lines = source.splitlines()
        uses = report.apex_references(source)
        resolved = sorted(site["line"] for site in entry["sites"] if site.get("resolved", True))
        assert resolved == sorted(uses), f"{name}: resolved sites differ from the apex uses found"
        for site in entry["sites"]:
            assert site["api"] in lines[site["line"] - 1], f"{name}:{site['line']} does not mention {site['api']!r}"
        if entry["negative"]:
            assert entry["sites"] == [], f"{name}: a negative control has no apex site"
    assert sum(MANIFEST[name]["negative"] for name in FILES) >= 4


def test_site_classification_on_a_known_rewrite():
    """The measurement itself: a rewritten site counts as migrated, one left alone as reported or missed."""
    source = "from apex import amp\nmodel, opt = amp.initialize(model, opt)\nx = 1\namp.foo(x)\n"
    output = "import torch\nscaler = torch.amp.GradScaler('cuda')\nx = 1\namp.foo(x)\n"
    mapping = report.line_map(source, output)
    assert 2 in mapping[2] and mapping[3] == [3] and mapping[4] == [4]
    assert report.apex_references(source) == {2: {"apex.amp.initialize"}, 4: {"apex.amp.foo"}}
    assert report.apex_references(output) == {}
    assert report.apex_references("import apex.amp as a\nif a is None:\n    a.init()\n") == {3: {"apex.amp.init"}}


@pytest.mark.parametrize("unsafe_fixes", MODES)
@pytest.mark.parametrize("name", FILES)
def test_output_compiles_is_stable_and_negative_controls_are_untouched(name, unsafe_fixes):
    measure = _measure(name, unsafe_fixes)
    assert measure.failures == []


@pytest.mark.parametrize("unsafe_fixes", MODES)
@pytest.mark.parametrize("name", [name for name in FILES if not MANIFEST[name]["negative"]])
def test_every_site_is_migrated_or_reported(name, unsafe_fixes):
    measure = _measure(name, unsafe_fixes)
    assert measure.unreported == []


@pytest.mark.parametrize(("unsafe_fixes", "goal"), [(False, report.SAFE_GOAL), (True, report.UNSAFE_GOAL)], ids=["safe", "unsafe"])
def test_migrated_share_of_amp_core_sites(unsafe_fixes, goal):
    measures = [_measure(name, unsafe_fixes) for name in FILES]
    sites, migrated, _ = report.share(measures, core_only=True)
    assert sites >= 80
    assert migrated >= goal * sites, f"{migrated}/{sites} amp-core sites migrated = {migrated / sites:.1%}, goal {goal:.0%}"
