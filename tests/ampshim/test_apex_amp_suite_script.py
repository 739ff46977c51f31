"""bench/apex_amp_suite.py on a stand-in for apex's run_amp folder (written here, not apex's)."""
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # an end-to-end run: `-m slow`, and in CI

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "apex_amp_suite.py"

# Shaped like apex's suite: unittest classes, a helper imported as `from utils import ...`, type
# strings written for CUDA in both quote styles, a test that skips itself.
UTILS = 'HALF = "torch.cuda.HalfTensor"\nFLOAT = \'torch.cuda.FloatTensor\'\n'
TESTS = textwrap.dedent('''
    import unittest

    import torch
    from apex import amp
    from utils import HALF, FLOAT


    class TestStandIn(unittest.TestCase):
        def setUp(self):
            self.handle = amp.init(enabled=True)

        def tearDown(self):
            self.handle._deactivate()

        def test_linear_is_half(self):
            layer = torch.nn.Linear(4, 4).cuda()
            self.assertEqual(layer(torch.randn(2, 4, device="cuda")).type(), HALF)

        def test_softmax_is_float(self):
            x = torch.randn(2, 4, device="cuda", dtype=torch.half)
            self.assertEqual(torch.nn.functional.softmax(x, 1).type(), FLOAT)

        def test_fails_on_purpose(self):
            self.assertEqual(torch.ones(1).type(), "torch.cuda.IntTensor")

        @unittest.skip("needs amp_C")
        def test_kernels(self):
            pass
''')


@pytest.fixture
def checkout(tmp_path):
    suite = tmp_path / "apex" / "tests" / "L0" / "run_amp"
    suite.mkdir(parents=True)
    (suite / "__init__.py").write_text("")
    (suite / "utils.py").write_text(UTILS)
    (suite / "test_stand_in.py").write_text(TESTS)
    return tmp_path / "apex"


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True,
                          text=True, timeout=300)


def test_each_test_gets_a_line_and_the_totals_count_runnable_ones(checkout):
    completed = run(checkout)
    assert completed.returncode == 0, completed.stderr[-3000:]
    lines = dict(line.split(None, 1) for line in completed.stdout.splitlines()[:-1])
    assert lines["test_stand_in.py::TestStandIn::test_linear_is_half"] == "passed"
    assert lines["test_stand_in.py::TestStandIn::test_softmax_is_float"] == "passed"
    assert lines["test_stand_in.py::TestStandIn::test_fails_on_purpose"].startswith("failed")
    assert lines["test_stand_in.py::TestStandIn::test_kernels"].startswith("skipped")
    assert completed.stdout.splitlines()[-1] == (
        "ampshim on cpu: 3 runnable: 2 passed, 1 failed; 1 skipped")
    # The three quoted type strings were read as the CPU's, in the copy only.
    assert "3 CUDA type strings read as the CPU's" in completed.stderr
    assert (checkout / "tests/L0/run_amp/utils.py").read_text() == UTILS


def test_reads_the_suite_from_a_commit_of_a_git_dir(checkout):
    git = ["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "suite"], check=True)
    (checkout / "tests/L0/run_amp/test_stand_in.py").unlink()  # only the commit has it
    completed = run(checkout, "--commit", "HEAD")
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.splitlines()[-1].endswith("2 passed, 1 failed; 1 skipped")


def test_a_folder_without_the_suite_is_a_clear_error(tmp_path):
    completed = run(tmp_path)
    assert completed.returncode == 1
    assert f"no tests/L0/run_amp in {tmp_path}" in completed.stderr
