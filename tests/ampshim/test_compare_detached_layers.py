"""The recorder's count of layers run with gradients off: which layers, in which dtype, and when."""
import json

import torch
import torch.nn as nn

from ampshim.compare.recorder import Recorder, _hook_detached_layers


def test_layers_run_without_gradients_are_counted_by_their_output_dtype(tmp_path):
    recorder = Recorder(str(tmp_path / "events.jsonl"), steps=10)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Conv1d(1, 1, 3), nn.Tanh())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = _hook_detached_layers(recorder)
    try:
        x = torch.randn(2, 1, 4)
        model(x).sum().backward()  # gradients on: the loss's graph tells, not the hook
        with torch.no_grad():
            model(x)  # two layers in float32
            with torch.autocast("cpu", dtype=torch.bfloat16):
                model(x)  # two in bfloat16
        with torch.inference_mode():
            nn.MultiheadAttention(4, 1)(x[0], x[0], x[0])  # one, its output the first of a tuple
        assert recorder.begin_attempt()
        recorder.end_attempt(optimizer, True)
    finally:
        handle.remove()
        recorder.end("steps")
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert events[0]["e"] == "step" and events[0]["detached"] == [5, 2]
