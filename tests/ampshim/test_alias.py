"""The ``apex`` import name: served from ampshim, deferring to a real apex where it has the module."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ampshim import _alias

ROOT = Path(__file__).resolve().parents[2]


def run_python(code, *, pythonpath=(), env=None, cwd=None):
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([*map(str, pythonpath), str(ROOT)]))
    environment.pop("AMPSHIM_AUTOLOAD", None)
    environment.update(env or {})
    completed = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environment,
                               cwd=cwd, capture_output=True, text=True, timeout=120)
    return completed


@pytest.mark.parametrize("apex_name, ampshim_name", [
    ("apex", "ampshim._apex"),
    ("apex.amp", "ampshim.amp"),
    ("apex.amp.scaler", "ampshim.scaler"),
    ("apex.amp.lists.functional_overrides", "ampshim.lists.functional_overrides"),
    ("apex.fp16_utils.loss_scaler", "ampshim.fp16_utils.loss_scaler"),
    ("apex.parallel.LARC", "ampshim.parallel.LARC"),
    ("apex.normalization.fused_layer_norm", "ampshim.normalization.fused_layer_norm"),
    ("apex.amp.no_such_module", None),
    ("apexish", None),
])
def test_apex_names_map_to_ampshim_modules(apex_name, ampshim_name):
    assert _alias.target_of(apex_name) == ampshim_name


def test_apex_modules_are_ampshim_modules_shared_not_copied():
    completed = run_python("""
        import ampshim, sys
        import apex.amp, apex.amp.scaler, ampshim.amp, ampshim.scaler
        from apex.amp import _amp_state
        from apex.parallel.LARC import LARC
        assert apex.amp is ampshim.amp and sys.modules["apex.amp"] is ampshim.amp
        assert apex.amp.scaler is ampshim.scaler
        assert ampshim.amp.__spec__.name == "ampshim.amp"
        assert _amp_state is ampshim.state._amp_state
        assert isinstance(LARC, type)
        import apex
        assert apex.fp16_utils.FP16_Optimizer
        print("ok")
    """)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "ok"


def test_old_pickled_class_paths_resolve():
    # A loss scaler as real apex pickled it (FP16_Optimizer checkpoints): made under stand-in
    # apex modules, then loaded with only ampshim present.
    completed = run_python("""
        import pickle, sys, types
        import torch
        for name in ("apex", "apex.amp", "apex.amp.scaler"):
            sys.modules[name] = types.ModuleType(name)
        class LossScaler:
            pass
        LossScaler.__module__, LossScaler.__qualname__ = "apex.amp.scaler", "LossScaler"
        sys.modules["apex.amp.scaler"].LossScaler = LossScaler
        old = LossScaler()
        old.__dict__.update(dynamic=True, _loss_scale=1024.0, _max_loss_scale=2.**24,
                            _min_loss_scale=None, _scale_seq_len=2000, _unskipped=7,
                            _has_overflow=False, _overflow_buf=torch.zeros(1, dtype=torch.int))
        data = pickle.dumps(old)
        for name in ("apex", "apex.amp", "apex.amp.scaler"):
            del sys.modules[name]

        import ampshim
        from ampshim.scaler import LossScaler
        loaded = pickle.loads(data)
        assert type(loaded) is LossScaler
        assert loaded.loss_scale() == 1024.0 and loaded._unskipped == 7
        print("ok")
    """)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "ok"


def test_with_the_hook_off_and_no_import_there_is_no_apex():
    completed = run_python("import apex", env={"AMPSHIM_AUTOLOAD": "0"})
    assert completed.returncode != 0 and "No module named 'apex'" in completed.stderr


@pytest.mark.parametrize("block_torch", [
    'sys.modules["torch"] = None',  # as if torch were not installed
    textwrap.dedent("""
        class NoTorch:  # an import system that cannot find torch
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        sys.meta_path.insert(0, NoTorch())
    """),
])
def test_missing_torch_is_one_line_saying_what_to_install(block_torch):
    completed = run_python("import sys\n" + block_torch + "\nimport ampshim\nfrom apex import amp\n")
    assert completed.returncode == 1
    assert completed.stderr.splitlines() == [
        "TorchMissingError: apex (provided by ampshim) needs PyTorch, which is not installed: "
        "install the torch build you train with (pip install torch; the CPU build: pip install "
        "torch --index-url https://download.pytorch.org/whl/cpu)"]


def test_missing_torch_is_still_an_import_error_scripts_can_catch():
    completed = run_python("""
        import sys
        sys.modules["torch"] = None
        import ampshim
        try:
            from apex import amp
        except ImportError as error:
            print("no apex:", error.name)
        raise SystemExit(3)
    """)
    assert (completed.returncode, completed.stdout, completed.stderr) == (3, "no apex: torch\n", "")


def fake_apex(root, *, with_amp):
    package = root / "apex"
    (package / "optimizers").mkdir(parents=True)
    (package / "__init__.py").write_text("REAL = True\n")
    (package / "optimizers" / "__init__.py").write_text("REAL = True\n")
    if with_amp:
        (package / "amp").mkdir()
        (package / "amp" / "__init__.py").write_text("REAL = True\n")
    return root


def test_a_real_apex_without_amp_keeps_its_modules_and_gets_ours(tmp_path):
    site = fake_apex(tmp_path, with_amp=False)
    completed = run_python("""
        import ampshim, apex, apex.optimizers, apex.amp, ampshim.amp
        assert apex.REAL and apex.optimizers.REAL
        assert apex.amp is ampshim.amp
        print("ok")
    """, pythonpath=[site])
    assert completed.returncode == 0, completed.stderr


def test_a_real_apex_with_amp_is_used_whole(tmp_path):
    site = fake_apex(tmp_path, with_amp=True)
    completed = run_python("""
        import ampshim, apex.amp
        assert apex.amp.REAL
        print("ok")
    """, pythonpath=[site])
    assert completed.returncode == 0, completed.stderr


def write_autoload_site(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "ampshim-autoload.pth").write_text((ROOT / "ampshim" / "ampshim-autoload.pth").read_text())
    return site


@pytest.mark.parametrize("switch, installed", [(None, True), ("0", False)])
def test_autoload_hook_installs_without_importing_torch(tmp_path, switch, installed):
    site = write_autoload_site(tmp_path)
    completed = run_python(f"""
        import site, sys
        site.addsitedir({str(site)!r})
        finders = [type(f).__name__ for f in sys.meta_path]
        print("ApexFinder" in finders, "torch" in sys.modules)
    """, env={"AMPSHIM_AUTOLOAD": switch} if switch else None)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.split() == [str(installed), "False"]


def test_python_dash_m_ampshim_runs_a_script_as_main(tmp_path):
    script = tmp_path / "legacy.py"
    script.write_text(textwrap.dedent("""
        import sys
        from apex import amp
        import helper_next_to_script
        assert __name__ == "__main__"
        print(sys.argv[1:], callable(amp.initialize))
    """))
    (tmp_path / "helper_next_to_script.py").write_text("")
    completed = subprocess.run([sys.executable, "-m", "ampshim", str(script), "--flag", "x"],
                               env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT,
                               capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "['--flag', 'x'] True"


def test_python_dash_m_ampshim_reports_a_missing_script():
    completed = subprocess.run([sys.executable, "-m", "ampshim", "no_such_script.py"],
                               env=dict(os.environ, PYTHONPATH=str(ROOT)),
                               capture_output=True, text=True, timeout=60)
    assert completed.returncode == 2 and "no_such_script.py" in completed.stderr


def test_python_dash_m_runs_an_apex_module(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text("import sys; print(sys.argv[1:])")
    completed = subprocess.run(
        [sys.executable, "-m", "ampshim", "-m", "apex.parallel.multiproc", str(script), "--world-size", "1"],
        env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert "['--world-size', '1', '--rank', '0']" in completed.stdout
