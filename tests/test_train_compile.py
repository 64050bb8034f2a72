"""``train.compile``: the model compiled in place computes what the eager one does, and its checkpoints are the same.

``nn.Module.compile`` keeps the module's own state-dict keys, so a compiled run's checkpoint loads
into an eager model and exports unchanged, and DDP wraps it as it is. Compiling takes its time at the first forward pass
(about 20 s for the small CNN on the 2-core machine, again for evaluation mode). CUDA graphs
(``reduce-overhead``) need a GPU: refused on the CPU in one line; on a GPU the module test runs
with them (the :class:`~gpufeed.train._step.Stepper` marks each step as that test does).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import DEVICES
from train_support import train_config, write_train_config

from gpufeed.config import ConfigError
from gpufeed.models import create_model, load_model
from gpufeed.train import train
from gpufeed.train._optim import compile_model

pytestmark = pytest.mark.timeout(600)


def test_cuda_graphs_without_a_gpu_are_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"train\.compile.*reduce-overhead.*CPU"):
        compile_model(torch.nn.Linear(2, 2), "reduce-overhead")


def test_off_leaves_the_module_eager():
    model = torch.nn.Linear(2, 2)
    compile_model(model, "off")
    assert model._compiled_call_impl is None


@pytest.mark.process  # inductor runs the C++ compiler
@pytest.mark.parametrize("device", DEVICES)
def test_the_compiled_module_computes_what_the_eager_one_does(device):
    """Same weights, same batch: the training forward, its gradients and BatchNorm statistics, and the
    evaluation output agree to float32 rounding (whole runs drift further: AdamW turns a rounding
    difference in a near-zero gradient into a full step of the other sign)."""
    cuda = torch.device("cuda", 0) if device == "gpu" else torch.device("cpu")
    torch.manual_seed(0)
    eager = create_model("smallcnn", num_classes=4, size_px=32).to(cuda)
    twin = copy.deepcopy(eager)
    compile_model(twin, "reduce-overhead" if device == "gpu" else "default")
    pixels = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8, device=cuda)
    targets = torch.arange(8, device=cuda) % 4
    for model in (eager, twin):
        torch.compiler.cudagraph_mark_step_begin()  # as the Stepper does with CUDA graphs
        torch.nn.functional.cross_entropy(model(pixels), targets).backward()
    for (name, a), b in zip(eager.named_parameters(), twin.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-6), name
    for (name, a), b in zip(eager.named_buffers(), twin.buffers(), strict=True):
        assert torch.allclose(a.float(), b.float(), rtol=1e-5, atol=1e-6), f"{name}: updated in the compiled step too"
    eager.eval(), twin.eval()
    with torch.inference_mode():
        torch.compiler.cudagraph_mark_step_begin()
        assert torch.allclose(eager(pixels), twin(pixels).clone(), rtol=1e-4, atol=1e-5)


def _losses(run) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "steps.jsonl").read_text().splitlines()]


@pytest.mark.process
def test_a_compiled_run_trains_as_the_eager_one_and_writes_the_same_checkpoints(synth_dir, tmp_path):
    # The CPU only: on a GPU this would compile twice more (training and evaluation), a minute of the
    # GPU run's device time that the module test above spends on the same maths with CUDA graphs.
    settings = ["train.epochs=2", "train.amp=off", "augment.ops=[]"]
    eager = train(train_config(synth_dir, settings), tmp_path / "eager")
    compiled = train(train_config(synth_dir, [*settings, "train.compile=default"]), tmp_path / "compiled")
    assert compiled.step == eager.step == 12
    a, b = _losses(eager.run_dir), _losses(compiled.run_dir)
    # The same maths in another kernel order (fused): float32 rounding only. The first steps agree
    # to 1e-4; AdamW then amplifies the rounding (measured: 0.5% apart at step 10 of 12).
    assert b[:3] == pytest.approx(a[:3], rel=1e-4), (a, b)
    assert b == pytest.approx(a, rel=2e-2), (a, b)
    # Evaluation runs the model compiled for evaluation mode.
    assert len(compiled.evaluations) == 2 and all(e["loss"] > 0 for e in compiled.evaluations)
    saved = torch.load(compiled.checkpoint, map_location="cpu", weights_only=True)["model"]
    reference = torch.load(eager.checkpoint, map_location="cpu", weights_only=True)["model"]
    assert list(saved) == list(reference), "the module's own keys, no compile wrapper's prefix"
    model = load_model(compiled.run_dir)  # the export path reads it as an eager model's
    assert model.spec == load_model(eager.run_dir).spec


@pytest.mark.process
def test_a_compiled_run_on_two_ranks_resumes_on_one(synth_dir, tmp_path):
    """DDP wraps the compiled module (gloo, two CPU ranks); a resume compiles again and carries on."""
    cfg, run = write_train_config(tmp_path / "train.yaml", synth_dir), tmp_path / "run"
    sets = ["train.compile=default", "train.epochs=1", "train.eval_every_epochs=0", "augment.ops=[]"]
    ddp = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "gpufeed"]
    for command in (
        [*ddp, "train", "--config", str(cfg), "--out", str(run), "--set", "train.max_steps=2"],
        [sys.executable, "-m", "gpufeed", "train", "--config", str(cfg), "--out", str(run), "--resume"],
    ):
        args = [*command, *(part for value in sets for part in ("--set", value))]
        proc = subprocess.run(
            args, capture_output=True, text=True, timeout=400, env={**os.environ, "OMP_NUM_THREADS": "1"}
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    steps = [json.loads(line)["step"] for line in (run / "steps.jsonl").read_text().splitlines()]
    # 96 images in batches of 16: 2 steps on two ranks read 64, and one rank reads the 32 left in 2.
    assert steps == [1, 2, 3, 4], steps
    assert load_model(run).spec.num_classes == 4
