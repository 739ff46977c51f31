"""``python -m ampshim script.py``: the script runs as under ``python script.py``, children included."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from _torchrun import run_past_gloo_teardown_aborts

ROOT = Path(__file__).resolve().parents[2]

# Every kind of child a training script starts re-runs this file first, so each needs `apex`.
CHILDREN_SCRIPT = textwrap.dedent('''
    import json
    import multiprocessing
    import sys

    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from apex.parallel import DistributedDataParallel


    def report(queue):
        queue.put("apex.parallel" in sys.modules)


    class Samples(torch.utils.data.Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, index):
            return torch.tensor(float(index + ("apex.parallel" in sys.modules)))


    def ddp_worker(rank, init_file):
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
        model = DistributedDataParallel(torch.nn.Linear(1, 1))
        model(torch.full((1, 1), float(rank))).sum().backward()
        with open(f"{init_file}.rank{rank}", "w") as out:
            out.write(str(model.module.weight.grad.item()))
        dist.barrier()  # no rank tears gloo down while the other still talks to it
        dist.destroy_process_group()


    if __name__ == "__main__":
        spawn = multiprocessing.get_context("spawn")
        queue = spawn.Queue()
        child = spawn.Process(target=report, args=(queue,))
        child.start()
        from_process = queue.get(timeout=60)
        child.join()
        loader = torch.utils.data.DataLoader(Samples(), num_workers=1, multiprocessing_context="spawn")
        from_workers = [batch.item() for batch in loader]
        mp.spawn(ddp_worker, args=(sys.argv[1],), nprocs=2)
        grads = [float(open(f"{sys.argv[1]}.rank{rank}").read()) for rank in range(2)]
        print(json.dumps({"process": from_process, "workers": from_workers, "ddp_grads": grads,
                          "file": __file__, "argv0": sys.argv[0]}))
''')


def run_ampshim(*args, cwd):
    return subprocess.run([sys.executable, "-m", "ampshim", *args], cwd=cwd, env=_ENV,
                          capture_output=True, text=True, timeout=180)


_ENV = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore",
            AMPSHIM_AUTOLOAD="0")  # no start-up hook: only `python -m ampshim` serves apex


@pytest.mark.slow
def test_spawned_children_import_apex_without_the_startup_hook(tmp_path):
    (tmp_path / "train.py").write_text(CHILDREN_SCRIPT)
    init = tmp_path / "init"

    def command():
        init.unlink(missing_ok=True)  # a run that aborted leaves its gloo rendezvous file behind
        return [sys.executable, "-m", "ampshim", "train.py", str(init)]

    completed = run_past_gloo_teardown_aborts(command, cwd=tmp_path, env=_ENV, timeout=180)  # DDP over gloo
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert result["process"] is True
    assert result["workers"] == [1.0, 2.0]  # each sample saw apex.parallel imported in the worker
    assert result["ddp_grads"][0] == result["ddp_grads"][1] == 0.5  # averaged over both ranks
    assert result["file"] == str(tmp_path / "train.py")  # absolute, as under `python train.py`
    assert result["argv0"] == "train.py"  # as typed, as under `python train.py`


def test_the_script_is_main_for_good_so_its_functions_pickle(tmp_path):
    (tmp_path / "job.py").write_text(textwrap.dedent('''
        import pickle, sys

        def work():
            return 42

        assert sys.modules["__main__"].work is work
        assert pickle.loads(pickle.dumps(work))() == 42
        print(__name__, __spec__)
    '''))
    completed = run_ampshim("job.py", cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.split() == ["__main__", "None"]


def test_a_missing_script_and_a_script_that_exits(tmp_path):
    missing = run_ampshim("nope.py", cwd=tmp_path)
    assert missing.returncode == 2 and "can't open file 'nope.py'" in missing.stderr
    (tmp_path / "fails.py").write_text("import sys\nsys.exit(3)\n")
    assert run_ampshim("fails.py", cwd=tmp_path).returncode == 3


def test_device_cpu_beside_the_variable_that_asks_for_it_too(tmp_path):
    """``AMPSHIM_DEVICE=cpu python -m ampshim --device cpu``: the variable's hook fires while
    ``--device cpu`` imports the mapping module; it is turned on once, not half-imported."""
    script = tmp_path / "cuda_script.py"
    script.write_text("import torch\nprint(torch.ones(2).cuda().device, torch.cuda.is_available())\n")
    completed = subprocess.run(
        [sys.executable, "-m", "ampshim", "--device", "cpu", str(script)], capture_output=True,
        text=True, timeout=120, env=dict(os.environ, AMPSHIM_DEVICE="cpu", PYTHONPATH=str(ROOT)))
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.split() == ["cpu", "True"]
