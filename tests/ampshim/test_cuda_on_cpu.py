"""CPU smoke mode: scripts written for CUDA run unchanged without a GPU, in one process or under torchrun."""
import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest
import torch
from _torchrun import free_port, run_past_gloo_teardown_aborts, torchrun

pytestmark = pytest.mark.slow  # an end-to-end run: `-m slow`, and in CI

ROOT = Path(__file__).resolve().parents[2]
LEGACY = ROOT / "fixtures" / "legacy"
AUTOLOAD_INSTALLED = (Path(sysconfig.get_paths()["purelib"]) / "ampshim-autoload.pth").exists()
SUMMARY = "ampshim --device cpu: ran on the CPU in place of CUDA: "

# Every CUDA idiom the mode maps, each checked where the script would notice it.
PROBE = textwrap.dedent('''
    import json, os, sys
    import torch
    import torch.backends.cudnn as cudnn
    import torch.distributed as dist

    cudnn.benchmark = True
    cudnn.deterministic = True
    assert torch.cuda.is_available() and torch.cuda.device_count() == 1
    torch.cuda.set_device(0)
    torch.cuda.manual_seed(0)
    torch.cuda.manual_seed_all(0)
    device = torch.device("cuda")
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).cuda()
    x = torch.randn(8, 4, device="cuda")
    y = torch.zeros(8, dtype=torch.long).to(device, non_blocking=True)
    legacy = torch.cuda.FloatTensor(3).fill_(1).type("torch.cuda.HalfTensor")
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)  # loads torch._dynamo's tables
    scaler = torch.amp.GradScaler("cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        out = model(x)
    with torch.cuda.amp.autocast():
        out_old_spelling = model(x.to("cuda:0"))
    scaler.scale(torch.nn.functional.cross_entropy(out.float(), y)).backward()
    scaler.step(optimizer)
    scaler.update()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", WORLD_SIZE="1")
    dist.init_process_group(backend="nccl", init_method="env://")
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()],
                                                    output_device=0)
    ddp(x).sum().backward()
    torch.save(model.state_dict(), "model.pt")
    loaded = torch.load("model.pt", map_location="cuda:0")
    print(json.dumps({
        "devices": sorted({str(t.device) for t in [x, y, legacy, out, *model.parameters()]}),
        "autocast_dtypes": [str(out.dtype), str(out_old_spelling.dtype)],
        "legacy_dtype": str(legacy.dtype),
        "backend": dist.get_backend(),
        "loaded": sorted(loaded) == sorted(model.state_dict()),
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "scale": scaler.get_scale(),
    }))
    dist.destroy_process_group()
''')


def environment(env=None):
    variables = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
    variables.pop("AMPSHIM_DEVICE", None)
    variables.update(env or {})
    return variables


def run(*args, env=None, cwd=None):
    return subprocess.run([sys.executable, *args], cwd=cwd, env=environment(env), capture_output=True,
                          text=True, timeout=180)


def summaries(stderr):
    return [line for line in stderr.splitlines() if line.startswith(SUMMARY)]


def last_json(stdout):
    return json.loads(stdout.strip().splitlines()[-1])


def test_cuda_idioms_run_on_the_cpu_and_one_line_says_what_was_mapped(tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    # The probe ends with gloo's teardown, which torch can abort at exit: such a run is retried.
    completed = run_past_gloo_teardown_aborts(
        lambda: [sys.executable, "-m", "ampshim", "--device", "cpu", "probe.py", str(free_port())],
        cwd=tmp_path, env=environment(), timeout=180)
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = last_json(completed.stdout)
    assert result["devices"] == ["cpu"]
    assert result["autocast_dtypes"] == ["torch.bfloat16", "torch.bfloat16"]
    assert result["legacy_dtype"] == "torch.float16"
    assert result["backend"] == "gloo" and result["loaded"]
    assert result["max_memory_allocated"] == 0 and result["scale"] > 0
    [summary] = summaries(completed.stderr)
    for mapped in (".cuda()", "device='cuda'", ".to('cuda')", "backend 'nccl' -> 'gloo'",
                   "DDP device_ids dropped", "float16 autocast -> bfloat16", "torch.cuda.synchronize"):
        assert mapped in summary


def test_the_summary_follows_the_scripts_last_line_in_a_joined_log(tmp_path):
    # stdout to a pipe is block-buffered: a line the script prints at exit (its own atexit
    # handler runs before ours) must not land after ours, or inside it.
    (tmp_path / "prints.py").write_text(
        'import atexit, torch\nprint("first")\nx = torch.ones(1, device="cuda")\n'
        'atexit.register(print, "last", x.dtype)\n')
    buffered = environment()
    buffered.pop("PYTHONUNBUFFERED", None)
    completed = subprocess.run([sys.executable, "-m", "ampshim", "--device", "cpu", "prints.py"],
                               cwd=tmp_path, env=buffered, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=180)
    assert completed.returncode == 0, completed.stdout[-3000:]
    lines = completed.stdout.splitlines()
    assert lines[-3:-1] == ["first", "last torch.float32"]
    assert lines[-1].startswith(SUMMARY)


HANDLE_SCRIPT = textwrap.dedent('''
    import torch
    import torch.nn.functional as F
    from apex import amp

    handle = amp.init(enabled=True)  # the 2018 API, before any model exists
    weight = torch.randn(4, 4, device="cuda")
    x = torch.randn(2, 4, device="cuda")
    lstm = torch.nn.LSTM(4, 4).cuda()
    print(F.linear(x, weight).dtype, F.softmax(x.half(), 1).dtype, lstm(x[None])[0].dtype,
          torch.is_autocast_enabled("cpu"))
''')


def test_the_2018_handle_casts_on_the_cpu_it_was_mapped_to(tmp_path):
    # Its device comes from the mapping: CUDA's autocast would have cast nothing on the CPU.
    (tmp_path / "handle.py").write_text(HANDLE_SCRIPT)
    completed = run("-m", "ampshim", "--device", "cpu", "handle.py", cwd=tmp_path,
                    env={"AMPSHIM_DTYPE": "float16"})
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.split() == ["torch.float16", "torch.float32", "torch.float16", "True"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the probe runs as written on a GPU")
def test_with_device_cuda_the_probe_runs_as_written_and_needs_a_gpu(tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    completed = run("-m", "ampshim", "--device", "cuda", "probe.py", "0", cwd=tmp_path)
    assert completed.returncode != 0 and not summaries(completed.stderr)


def test_an_unknown_device_is_a_clear_error(tmp_path):
    flag = run("-m", "ampshim", "--device", "tpu", "train.py", cwd=tmp_path)
    assert flag.returncode == 2 and "use --device cpu" in flag.stderr
    variable = run("-c", "import ampshim, torch", env={"AMPSHIM_DEVICE": "gpu"})
    assert variable.returncode != 0
    assert "AMPSHIM_DEVICE='gpu': ampshim can run CUDA scripts on 'cpu' only" in variable.stderr


def test_dcgan_with_three_losses_on_the_cpu(tmp_path):
    completed = run("-m", "ampshim", "--device", "cpu", str(LEGACY / "cuda_dcgan.py"), cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = last_json(completed.stdout)
    assert sorted(result["amp_state"]) == ["loss_scaler0", "loss_scaler1", "loss_scaler2"]
    assert all(state["unskipped"] == 12 for state in result["amp_state"].values())
    assert result["sample_shape"] == [16, 3, 8, 8]
    assert sum(result["d_losses"][-3:]) < sum(result["d_losses"][:3])  # the discriminator learns
    assert "device='cuda'" in summaries(completed.stderr)[0]


def test_imagenet_style_script_with_apex_ddp_and_syncbn_under_torchrun(tmp_path):
    completed = torchrun(LEGACY / "cuda_imagenet.py", "--opt-level", "O1", "--sync_bn", "--epochs", "2",
                         launcher=("-m", "ampshim"), env={"AMPSHIM_DEVICE": "cpu"}, cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = last_json(completed.stdout)
    assert result["world_size"] == 2 and result["bn_type"] == "SyncBatchNorm"
    assert result["weight_dtype"] == "torch.float32"  # O1 keeps the weights in float32
    losses = result["losses"]
    assert len(losses) == 8 and sum(losses[-3:]) < sum(losses[:3])
    ranks = summaries(completed.stderr)
    assert len(ranks) == 2 and all("backend 'nccl' -> 'gloo'" in line for line in ranks)


def test_minimal_distributed_script_under_torchrun_with_the_environment_variable(tmp_path):
    # Through the start-up hook where it is installed: the workers are plain `python script.py`.
    launcher = () if AUTOLOAD_INSTALLED else ("-m", "ampshim")
    completed = torchrun(LEGACY / "cuda_distributed.py", launcher=launcher,
                         env={"AMPSHIM_DEVICE": "cpu"}, cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = last_json(completed.stdout)
    assert result["world_size"] == 2 and result["backend"] == "gloo" and result["ranks_agree"]
    assert result["losses"][-1] < result["losses"][0]
    assert len(summaries(completed.stderr)) == 2  # one line per rank, none from the launcher


def test_the_environment_variable_applies_when_torch_was_imported_before_ampshim():
    completed = run("-c", "import torch, ampshim; print(torch.zeros(1, device='cuda').device)",
                    env={"AMPSHIM_DEVICE": "cpu", "AMPSHIM_AUTOLOAD": "0"})
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.split() == ["cpu"] and len(summaries(completed.stderr)) == 1
