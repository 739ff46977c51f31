import copy
import os
import runpy
import textwrap

import pytest
import torch
import torch.distributed as dist
from _torchrun import spawn_past_gloo_teardown_aborts, torchrun

import ampshim.parallel as parallel
from ampshim.deprecation import DeprecatedFeatureWarning
from ampshim.parallel import (
    DistributedDataParallel,
    Reducer,
    SyncBatchNorm,
    convert_syncbn_model,
    create_syncbn_process_group,
    multiproc,
)

pytestmark = pytest.mark.filterwarnings("ignore::ampshim.deprecation.DeprecatedFeatureWarning")


def _local_grads(model, x):
    """Gradients of ``model(x).sum()`` computed on a private copy."""
    twin = copy.deepcopy(model)
    twin(x).sum().backward()
    return [p.grad for p in twin.parameters()]


class _Checkpointed(torch.nn.Module):
    """A block checkpointed reentrantly (torch's old default), then a head."""

    def __init__(self):
        super().__init__()
        self.body, self.head = torch.nn.Linear(3, 3), torch.nn.Linear(3, 2)

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        return self.head(checkpoint(self.body, x.requires_grad_(), use_reentrant=True))


def _two_rank_worker(rank, init_file):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        inputs = [torch.full((2, 3), 1.0), torch.full((2, 3), 3.0)]

        # DDP: parameters broadcast from rank 0 at construction; buffers left alone.
        torch.manual_seed(rank)
        net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
        net[1].running_mean.fill_(float(rank))
        model = DistributedDataParallel(net)
        weights = [torch.zeros_like(model.module[0].weight) for _ in range(2)]
        dist.all_gather(weights, model.module[0].weight.detach())
        assert torch.equal(weights[0], weights[1])
        model.eval()
        model(inputs[rank])
        assert model.module[1].running_mean[0].item() == float(rank)  # no buffer broadcast
        model.train()

        # Averaged gradients (apex's default).
        linear = torch.nn.Linear(3, 2)
        both = [_local_grads(DistributedDataParallel(linear).module, x) for x in inputs]
        model = DistributedDataParallel(linear)
        model(inputs[rank]).sum().backward()
        for p, g0, g1 in zip(model.parameters(), *both):
            torch.testing.assert_close(p.grad, (g0 + g1) / 2)

        # Summed gradients, and the predivide factor (which must not change an average).
        for kwargs, combine in [(dict(gradient_average=False), lambda a, b: a + b),
                                (dict(gradient_predivide_factor=2.0), lambda a, b: (a + b) / 2),
                                (dict(allreduce_always_fp32=True), lambda a, b: (a + b) / 2)]:
            model = DistributedDataParallel(copy.deepcopy(linear), **kwargs)
            model(inputs[rank]).sum().backward()
            for p, g0, g1 in zip(model.parameters(), *both):
                torch.testing.assert_close(p.grad, combine(g0, g1))

        # bf16 buckets reduced in fp32.
        half = copy.deepcopy(linear).to(torch.bfloat16)
        half_grads = [_local_grads(half, x.to(torch.bfloat16)) for x in inputs]
        model = DistributedDataParallel(half, allreduce_always_fp32=True)
        model(inputs[rank].to(torch.bfloat16)).sum().backward()
        for p, g0, g1 in zip(model.parameters(), *half_grads):
            assert p.grad.dtype == torch.bfloat16
            torch.testing.assert_close(p.grad, ((g0.float() + g1.float()) / 2).to(torch.bfloat16))

        # disable_allreduce() keeps gradients local until enable_allreduce().
        model = DistributedDataParallel(copy.deepcopy(linear))
        model.disable_allreduce()
        model(inputs[rank]).sum().backward()
        for p, g in zip(model.parameters(), both[rank]):
            torch.testing.assert_close(p.grad, g)
        model.enable_allreduce()
        model.zero_grad()
        model(inputs[rank]).sum().backward()
        for p, g0, g1 in zip(model.parameters(), *both):
            torch.testing.assert_close(p.grad, (g0 + g1) / 2)

        # parameters that get no gradient are tolerated, delayed or not (apex bucketed only
        # those the first backward pass reached)
        for delay in (True, False):
            unused = torch.nn.ModuleDict({"used": torch.nn.Linear(3, 2), "unused": torch.nn.Linear(3, 2)})
            unused.forward = lambda x, unused=unused: unused["used"](x)
            model = DistributedDataParallel(unused, delay_allreduce=delay)
            for _ in range(2):
                model(inputs[rank]).sum().backward()

        # a reentrant activation checkpoint: AMPSHIM_DDP_GRAPH=static runs it, with apex's average
        torch.manual_seed(0)  # the same weights on both ranks, as DDP broadcasts them
        net = _Checkpointed()
        plain = [_local_grads(net, x) for x in inputs]
        os.environ["AMPSHIM_DDP_GRAPH"] = "static"
        try:
            model = DistributedDataParallel(copy.deepcopy(net))
        finally:
            del os.environ["AMPSHIM_DDP_GRAPH"]
        for _ in range(2):
            model.zero_grad()
            model(inputs[rank].clone()).sum().backward()
            for p, g0, g1 in zip(model.parameters(), *plain):
                torch.testing.assert_close(p.grad, (g0 + g1) / 2)

        # Reducer: manual averaging of a module's grads.
        torch.manual_seed(rank)
        plain = torch.nn.Linear(3, 2)
        reducer = Reducer(plain)
        both = [_local_grads(plain, x) for x in inputs]
        plain(inputs[rank]).sum().backward()
        reducer.reduce()
        for p, g0, g1 in zip(plain.parameters(), *both):
            torch.testing.assert_close(p.grad, (g0 + g1) / 2)

        # Reducer over a fixed, nested list of tensors.
        values = [torch.full((2,), float(rank)), (torch.full((1,), 2.0 * rank),)]
        Reducer(values).reduce()
        assert values[0].tolist() == [0.5, 0.5] and values[1][0].tolist() == [1.0]

        # SyncBatchNorm: statistics over both ranks' batches = BatchNorm over the joint batch.
        torch.manual_seed(0)
        full = torch.randn(8, 3, 5)
        reference = torch.nn.BatchNorm1d(3)
        with torch.no_grad():
            reference.weight.uniform_()
            reference.bias.uniform_()
        bn = convert_syncbn_model(copy.deepcopy(reference))
        joint = full.clone().requires_grad_()
        upstream = torch.randn(8, 3, 5)
        joint_out = reference(joint)
        (joint_out * upstream).sum().backward()
        assert isinstance(bn, SyncBatchNorm)
        mine = full[4 * rank:4 * rank + 4].clone().requires_grad_()
        out = bn(mine)
        (out * upstream[4 * rank:4 * rank + 4]).sum().backward()
        torch.testing.assert_close(out, joint_out[4 * rank:4 * rank + 4])
        torch.testing.assert_close(mine.grad, joint.grad[4 * rank:4 * rank + 4])
        torch.testing.assert_close(bn.running_mean, reference.running_mean)
        torch.testing.assert_close(bn.running_var, reference.running_var)
        weight_grads = [torch.zeros(3) for _ in range(2)]
        dist.all_gather(weight_grads, bn.weight.grad)
        torch.testing.assert_close(weight_grads[0] + weight_grads[1], reference.weight.grad)

        # Process groups of one rank each: statistics stay local.
        group = create_syncbn_process_group(1)
        local_bn = SyncBatchNorm(3, process_group=group)
        local = full[4 * rank:4 * rank + 4]
        torch.testing.assert_close(local_bn(local), torch.nn.functional.batch_norm(local, None, None, training=True))
        assert create_syncbn_process_group(0) is None
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_on_gloo(tmp_path):
    spawn_past_gloo_teardown_aborts(_two_rank_worker, tmp_path)


@pytest.fixture
def world_of_one(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_single_process_world(world_of_one):
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(3, 2), message_size=100)
    x = torch.randn(4, 3)
    expected = _local_grads(model.module, x)
    model(x).sum().backward()
    for p, g in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad, g)
    bn = SyncBatchNorm(3)
    y = torch.randn(6, 3)
    torch.testing.assert_close(bn(y), torch.nn.functional.batch_norm(y, None, None, training=True))


def test_a_reentrant_checkpoint_needs_the_static_graph_setting(world_of_one, monkeypatch):
    """torch's search for unused parameters does not see into a reentrant checkpoint and raises
    at the first backward pass (the documented limit); the setting runs it."""
    model = DistributedDataParallel(_Checkpointed())
    with pytest.raises(RuntimeError, match="mark a variable ready only once"):
        model(torch.ones(2, 3)).sum().backward()
    monkeypatch.setenv("AMPSHIM_DDP_GRAPH", "static")
    model = DistributedDataParallel(_Checkpointed())
    model(torch.ones(2, 3)).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


class _TwoHeads(torch.nn.Module):
    """A multi-task net: one body, a head per task, the task chosen at each call."""

    def __init__(self):
        super().__init__()
        self.body, self.a, self.b = torch.nn.Linear(3, 3), torch.nn.Linear(3, 1), torch.nn.Linear(3, 1)

    def forward(self, x, task):
        return (self.a if task == "a" else self.b)(self.body(x)).sum()


def test_forward_passes_through_different_heads_before_one_backward_need_the_static_graph_setting(
        world_of_one, monkeypatch):
    """torch's search for unused parameters starts from the last forward pass only: the first task's
    head, reached by the first, is taken for unused and raises when its gradient comes (the
    documented limit, as for torch's own DDP); the setting trains it, with every head's gradient."""
    model = DistributedDataParallel(_TwoHeads())
    with pytest.raises(RuntimeError, match="mark a variable ready only once"):
        (model(torch.ones(2, 3), task="a") + model(torch.ones(2, 3), task="b")).backward()
    monkeypatch.setenv("AMPSHIM_DDP_GRAPH", "static")
    torch.manual_seed(0)
    model = DistributedDataParallel(_TwoHeads())
    twin = copy.deepcopy(model.module)
    for _ in range(2):
        model.zero_grad()
        twin.zero_grad()
        (model(torch.ones(2, 3), task="a") + model(torch.ones(2, 3), task="b")).backward()
        (twin(torch.ones(2, 3), task="a") + twin(torch.ones(2, 3), task="b")).backward()
    for p, q in zip(model.module.parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_an_unknown_ddp_graph_setting_is_named(world_of_one, monkeypatch):
    monkeypatch.setenv("AMPSHIM_DDP_GRAPH", "dynamic")
    with pytest.raises(ValueError, match="AMPSHIM_DDP_GRAPH='dynamic'.*'unused'.*'static'"):
        DistributedDataParallel(torch.nn.Linear(2, 2))


def test_ddp_needs_a_process_group_and_rejects_apexs_removed_options():
    with pytest.raises(RuntimeError, match="init_process_group"):
        DistributedDataParallel(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="shared_param is no longer supported"):
        DistributedDataParallel(torch.nn.Linear(2, 2), shared_param=True)
    with pytest.raises(ValueError, match="allreduce_trigger_params"):
        DistributedDataParallel(torch.nn.Linear(2, 2), delay_allreduce=True, allreduce_trigger_params=[])
    with pytest.raises(ValueError, match="num_allreduce_streams"):
        DistributedDataParallel(torch.nn.Linear(2, 2), delay_allreduce=True, num_allreduce_streams=2)


def test_sync_batchnorm_without_distributed_is_plain_batchnorm():
    torch.manual_seed(0)
    reference = torch.nn.BatchNorm2d(3)
    bn = SyncBatchNorm(3)
    bn.load_state_dict(reference.state_dict())
    x = torch.randn(4, 3, 2, 2)
    torch.testing.assert_close(bn(x), reference(x))
    torch.testing.assert_close(bn.running_var, reference.running_var)
    bn.eval(), reference.eval()
    torch.testing.assert_close(bn(x), reference(x))


def test_sync_batchnorm_adds_z_and_fuses_relu():
    bn = SyncBatchNorm(2, fuse_relu=True)
    x, z = torch.randn(4, 2), torch.randn(4, 2)
    want = torch.relu(torch.nn.functional.batch_norm(x, None, None, training=True) + z)
    torch.testing.assert_close(bn(x, z), want)


def test_sync_batchnorm_channel_last_is_an_error_and_warns_deprecated():
    with pytest.raises(AttributeError, match="channel_last"):
        SyncBatchNorm(3, channel_last=True)
    with pytest.warns(DeprecatedFeatureWarning, match="torch.nn.SyncBatchNorm"):
        SyncBatchNorm(3)


def test_convert_syncbn_model_shares_running_stats_and_copies_affine_params():
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 1), torch.nn.BatchNorm2d(2), torch.nn.InstanceNorm2d(2))
    old_bn = model[1]
    with pytest.warns(DeprecatedFeatureWarning, match="convert_sync_batchnorm"):
        converted = convert_syncbn_model(model)
    new_bn = converted[1]
    assert isinstance(new_bn, SyncBatchNorm) and not isinstance(converted[2], SyncBatchNorm)
    assert new_bn.running_mean is old_bn.running_mean
    assert new_bn.weight is not old_bn.weight and torch.equal(new_bn.weight, old_bn.weight)
    assert converted[0] is model[0]


def test_package_surface_matches_apex():
    assert parallel.ReduceOp is dist.ReduceOp
    assert parallel.LARC.__name__ == "ampshim.parallel.LARC"  # the submodule, not the class
    from apex.parallel.LARC import LARC

    assert isinstance(LARC, type)


def test_multiproc_launches_one_process_per_rank(tmp_path, monkeypatch, capfd):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import sys
        rank = sys.argv[sys.argv.index("--rank") + 1]
        open(f"args_{rank}.txt", "w").write(" ".join(sys.argv[1:]))
        print("hello from", rank)
        sys.exit(int(rank) * 3)
    """))
    monkeypatch.chdir(tmp_path)
    assert multiproc.main([str(script), "--lr", "0.1", "--world-size", "2"]) == 3  # rank 1's exit code
    assert (tmp_path / "args_0.txt").read_text() == "--lr 0.1 --world-size 2 --rank 0"
    assert (tmp_path / "args_1.txt").read_text() == "--lr 0.1 --world-size 2 --rank 1"
    assert "hello from 0" in capfd.readouterr().out
    assert (tmp_path / "GPU_1.log").read_text() == "hello from 1\n"


SYNCBN_SCRIPT = '''
import sys

import torch
import torch.distributed as dist


def build_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                               torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 2))


def train(model, batches, rows):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for inputs, targets in batches:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(inputs[rows]), targets[rows])
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    from apex.parallel import DistributedDataParallel, convert_syncbn_model

    data, out = sys.argv[1:]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DistributedDataParallel(convert_syncbn_model(build_model()))
    train(model, torch.load(data), slice(4 * rank, 4 * rank + 4))
    torch.save({"state": model.module.state_dict(),
                "grads": [p.grad for p in model.parameters()]}, f"{out}/rank{rank}.pt")
    dist.barrier()  # no rank tears gloo down while the other still talks to it
    dist.destroy_process_group()
'''


@pytest.mark.slow
def test_syncbn_ddp_under_torchrun_on_cpu_matches_one_process_on_the_full_batch(tmp_path):
    script = tmp_path / "syncbn_ddp.py"
    script.write_text(SYNCBN_SCRIPT)
    torch.manual_seed(1)
    batches = [(torch.randn(8, 3, 8, 8) * 2 + 1, torch.randint(0, 2, (8,))) for _ in range(3)]
    torch.save(batches, tmp_path / "data.pt")
    completed = torchrun(script, tmp_path / "data.pt", tmp_path)
    assert completed.returncode == 0, completed.stderr[-3000:]

    helpers = runpy.run_path(str(script))
    reference = helpers["build_model"]()
    helpers["train"](reference, batches, slice(None))
    for rank in (0, 1):
        result = torch.load(tmp_path / f"rank{rank}.pt")
        for name, value in reference.state_dict().items():
            torch.testing.assert_close(result["state"][name], value, msg=f"rank {rank}: {name}")
        for grad, param in zip(result["grads"], reference.parameters()):
            torch.testing.assert_close(grad, param.grad)
    assert reference[1].running_var.sub(1).abs().max() > 0.1  # the statistics moved, measurably


@pytest.mark.cuda
def test_sync_batchnorm_on_cuda_runs_torchs_own(world_of_one, monkeypatch):
    calls = []
    native = torch.nn.SyncBatchNorm.forward
    monkeypatch.setattr(torch.nn.SyncBatchNorm, "forward",
                        lambda self, x: calls.append(x.device.type) or native(self, x))
    bn = SyncBatchNorm(3).cuda()
    bn(torch.randn(4, 3, device="cuda"))
    assert calls == ["cuda"]


def test_sync_batchnorm_is_not_torchs_class_so_native_ddp_accepts_it_on_cpu():
    # As in apex: native DDP refuses any torch.nn.SyncBatchNorm inside a CPU module.
    assert not isinstance(SyncBatchNorm(3), torch.nn.SyncBatchNorm)
    assert isinstance(SyncBatchNorm(3), torch.nn.modules.batchnorm._BatchNorm)
