"""``train.compile``: the model compiled in place computes what the eager one does, and its checkpoints are the same.

``nn.Module.compile`` keeps the module's own state-dict keys, so a compiled run's checkpoint loads
into an eager model and exports unchanged, and DDP wraps it as it is. Compiling takes its time at the first forward pass
(about 20 s for the small CNN on the 2-core machine, again for evaluation mode). Shapes are
compiled static: a partial batch gets a graph of its own. CUDA graphs (``reduce-overhead``) need a
GPU: refused on the CPU in one line; on a GPU the module test runs enough steps, marked as the
:class:`~gpufeed.train._step.Stepper` marks them, for the last to replay recorded graphs.
"""

from __future__ import annotations

import ast
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


class _Tiny(torch.nn.Module):
    """A convolution, BatchNorm and a linear head: what the CNNs compile, in seconds."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm, self.head = torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.conv(x)).relu().mean((2, 3)))


@pytest.mark.process  # inductor runs the C++ compiler
def test_a_partial_batch_gets_a_static_graph_of_its_own_and_full_batches_keep_theirs():
    """torch's default (``dynamic=None``) would recompile the partial batch with a symbolic batch
    size, and that graph would then run the full batches after it too (slower kernels on a GPU)."""
    # Deferred: torch._dynamo takes about 2 s to import, which collecting the other tests would pay.
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    from torch._dynamo.utils import clear_compilation_metrics, get_compilation_metrics

    torch.compiler.reset()  # compiles _Tiny.forward afresh, even where this test ran before in the process
    clear_compilation_metrics()
    model = _Tiny()
    compile_model(model, "default")
    for rows in (8, 5, 8):  # full, partial (a loader's last batch), full again
        model(torch.randn(rows, 3, 8, 8)).sum().backward()
    compiles = {
        str(m.compile_id): ast.literal_eval(m.graph_node_shapes)  # every node's sizes: ints, or symbols as strings
        for m in get_compilation_metrics()
        if m.co_name == "forward" and m.co_filename == __file__ and m.graph_node_shapes
    }
    assert [shapes["l_x_"] for shapes in compiles.values()] == [[8, 3, 8, 8], [5, 3, 8, 8]], compiles
    for compile_id, shapes in compiles.items():
        assert all(isinstance(size, int) for sizes in shapes.values() for size in sizes), (compile_id, shapes)
    # Dynamo keeps a function's graphs most recently used first: the one the last full batch ran.
    last = str(_debug_get_cache_entry_list(_Tiny.forward)[0].compile_id)
    assert compiles[last]["l_x_"] == [8, 3, 8, 8], (last, compiles)


def _train_steps(model: torch.nn.Module, batches: list) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Training steps as the :class:`~gpufeed.train._step.Stepper` runs them: the last one's logits and gradients."""
    for pixels, targets in batches:
        torch.compiler.cudagraph_mark_step_begin()  # as the Stepper does with CUDA graphs
        logits = model(pixels)
        torch.nn.functional.cross_entropy(logits, targets).backward()
        last = logits.detach().clone(), [p.grad.clone() for p in model.parameters()]
        for param in model.parameters():
            # As the Stepper's zero_grad(set_to_none=True). A replayed backward's gradients live in
            # the CUDA graphs' memory, which the next step's replay writes: accumulating into them fails.
            param.grad = None
        del logits
    return last


def _evaluate(model: torch.nn.Module, batches: list) -> torch.Tensor:
    """Evaluation batches as the Stepper's ``predict`` runs them (each marked): the last one's logits."""
    for pixels, _ in batches:
        torch.compiler.cudagraph_mark_step_begin()
        logits = model(pixels).clone()  # a replay's output lives in the graphs' memory until the next replay
    return logits


def _replayed(device_index: int) -> bool:
    """Whether the last compiled call on that GPU replayed a recorded CUDA graph (not warm-up, not recording)."""
    # Deferred: inductor takes seconds to import; only the GPU twin reads its CUDA graph trees.
    from torch._inductor.cudagraph_trees import ExecutionState, get_manager

    manager = get_manager(device_index, create_if_none_exists=False)
    return manager is not None and manager.path_state == ExecutionState.EXECUTION


@pytest.mark.process  # inductor runs the C++ compiler
@pytest.mark.parametrize("device", DEVICES)
def test_the_compiled_module_computes_what_the_eager_one_does(device, monkeypatch):
    """Same weights, same batches: the training forward, its gradients and BatchNorm statistics, and
    the evaluation output agree to float32 rounding (whole runs drift further: AdamW turns a rounding
    difference in a near-zero gradient into a full step of the other sign).

    On a GPU with ``reduce-overhead``, CUDA graph trees run a function's first call eagerly (warm-up),
    record the second and replay from the third: three steps and three evaluation batches, the last of
    each compared, and no function may have skipped its graphs.
    """
    # Deferred: torch._dynamo takes about 2 s to import, which collecting the other tests would pay.
    from torch._dynamo.utils import counters

    on_gpu = device == "gpu"
    if on_gpu:
        # cuDNN's convolutions (and any cuBLAS matmul asked to) round to TF32 by default on a GPU: 1e-3,
        # not float32 rounding. Both sides run in full float32, as gpufeed.predict's check does.
        monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
        monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    cuda = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    torch.manual_seed(0)
    eager = create_model("smallcnn", num_classes=4, size_px=32).to(cuda)
    twin = copy.deepcopy(eager)
    compile_model(twin, "reduce-overhead" if on_gpu else "default")
    skips = counters["inductor"]["cudagraph_skips"]
    batches = [
        (torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8, device=cuda), torch.randperm(8, device=cuda) % 4)
        for _ in range(3)
    ]
    (a_logits, a_grads), (b_logits, b_grads) = _train_steps(eager, batches), _train_steps(twin, batches)
    assert not on_gpu or _replayed(cuda.index), "the last step ran no recorded CUDA graph"
    assert torch.allclose(a_logits, b_logits, rtol=1e-4, atol=1e-5)
    for (name, _), a, b in zip(eager.named_parameters(), a_grads, b_grads, strict=True):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6), name
    for (name, a), b in zip(eager.named_buffers(), twin.buffers(), strict=True):
        assert torch.allclose(a.float(), b.float(), rtol=1e-5, atol=1e-6), f"{name}: updated in the compiled step too"
    eager.eval(), twin.eval()
    with torch.inference_mode():
        a_logits, b_logits = _evaluate(eager, batches), _evaluate(twin, batches)
    assert not on_gpu or _replayed(cuda.index), "the last evaluation batch ran no recorded CUDA graph"
    assert torch.allclose(a_logits, b_logits, rtol=1e-4, atol=1e-5)
    assert counters["inductor"]["cudagraph_skips"] == skips, "a compiled function ran without its CUDA graphs"


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
