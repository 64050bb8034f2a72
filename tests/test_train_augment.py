"""Where augmentation runs: the plan, the fused torch ops, Kornia's precision, host syncs, the benchmark."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from train_support import train_config

from gpufeed.config import AUGMENT_OPS, LOADER_AUGMENT_OPS, AugmentConfig, ConfigError, SizePx, parse_config
from gpufeed.pipelines import ColourJitter, LoaderAugment, reference_augment
from gpufeed.train._augment import FusedColour, RandomFlip, build_augmenter, plan_augmentation
from gpufeed.train._session import Session

pytestmark = pytest.mark.timeout(300)


def _cfg(ops, **where) -> AugmentConfig:
    return parse_config({"augment": {"ops": list(ops), **{op: {"where": w} for op, w in where.items()}}}).augment


def test_default_colour_jitter_runs_in_the_loader_and_nothing_on_the_device():
    plan = plan_augmentation(AugmentConfig())
    assert plan.placement == {"color_jitter": "loader"}
    c = AugmentConfig().color_jitter
    assert plan.loader == LoaderAugment(jitter=ColourJitter(c.p, c.brightness, c.contrast, c.saturation, c.hue))
    assert not plan.augmenter and plan.augmenter.names == []


@pytest.mark.parametrize(
    ("ops", "where", "placement"),
    [
        (["color_jitter", "grayscale", "gaussian_blur"], {}, ["loader", "loader", "kornia"]),
        # The list's order holds: an op after a device op stays on the device (fused torch for colour).
        (["rotation", "color_jitter", "horizontal_flip"], {}, ["kornia", "torch", "torch"]),
        (["color_jitter", "erasing", "grayscale"], {}, ["loader", "kornia", "torch"]),
        (["color_jitter", "grayscale"], {"grayscale": "kornia"}, ["loader", "kornia"]),
        (["color_jitter", "grayscale"], {"color_jitter": "torch"}, ["torch", "torch"]),
        (["rotation", "grayscale"], {"grayscale": "loader"}, ["kornia", "loader"]),
    ],
)
def test_each_op_runs_in_exactly_one_place(ops, where, placement):
    plan = plan_augmentation(_cfg(ops, **where))
    assert list(plan.placement) == ops and list(plan.placement.values()) == placement
    in_loader = plan.ops_at("loader")
    assert plan.augmenter.names == [op for op in ops if op not in in_loader], "the device runs the rest, once"
    loader = plan.loader or LoaderAugment()
    assert (loader.jitter is not None) == ("color_jitter" in in_loader)
    assert (loader.grayscale_p is not None) == ("grayscale" in in_loader)
    assert (loader.flip_p is not None) == ("horizontal_flip" in in_loader)


def test_a_loader_that_cannot_augment_gets_the_same_ops_on_the_device():
    plan = plan_augmentation(_cfg(["color_jitter", "grayscale", "horizontal_flip"]), loader=False)
    assert plan.loader is None and set(plan.placement.values()) == {"torch"}
    assert [type(s) for s in plan.augmenter.stages] == [FusedColour, RandomFlip], "neighbouring colour ops fuse"


def test_where_is_validated_with_its_key_path_and_old_configs_still_load():
    with pytest.raises(
        ConfigError, match=r"augment\.gaussian_blur\.where.*'loader' is not allowed; allowed: auto, kornia"
    ):
        parse_config({"augment": {"ops": ["gaussian_blur"], "gaussian_blur": {"where": "loader"}}})
    with pytest.raises(ConfigError, match=r"augment\.color_jitter\.where.*allowed: auto, loader, torch, kornia"):
        parse_config({"augment": {"color_jitter": {"where": "gpu"}}})
    old = parse_config({"augment": {"ops": ["color_jitter", "grayscale"], "color_jitter": {"p": 1.0, "hue": 0.1}}})
    assert old.augment.color_jitter.where == "auto" and old.augment.color_jitter.hue == 0.1


def test_fused_colour_is_the_loaders_formula_on_torch_draws():
    fused = FusedColour(ColourJitter(p=0.9, brightness=0.4, contrast=0.4, saturation=0.5, hue=0.1), 0.3)
    images = torch.randint(0, 256, (12, 3, 20, 24), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
    torch.manual_seed(5)
    out = fused(images)
    torch.manual_seed(5)
    matrices = fused.matrices(12, torch.device("cpu")).numpy()
    assert out.dtype == torch.uint8 and out.is_contiguous(memory_format=torch.channels_last)
    for k in range(12):
        expected = reference_augment(images[k].permute(1, 2, 0).numpy(), matrices[k]).astype(int)
        assert np.abs(out[k].permute(1, 2, 0).numpy().astype(int) - expected).max() <= 1
    assert len({tuple(m.ravel().round(4)) for m in matrices}) > 6, "per-sample parameters"


def test_fused_ops_give_a_clip_one_draw_for_all_its_frames():
    frame = torch.randint(0, 256, (4, 3, 1, 16, 16), dtype=torch.uint8)
    clips = frame.expand(4, 3, 6, 16, 16).contiguous()
    cfg = _cfg(["color_jitter", "horizontal_flip"], color_jitter="torch", horizontal_flip="torch")
    cfg = dataclasses.replace(cfg, color_jitter=dataclasses.replace(cfg.color_jitter, p=1.0))
    torch.manual_seed(0)
    out = build_augmenter(cfg, clips=True)(clips)
    for t in range(1, 6):
        assert torch.equal(out[:, :, t], out[:, :, 0]), "one set of parameters per clip"
    assert not torch.equal(out[0, :, 0], out[1, :, 0])


@pytest.mark.parametrize("op", AUGMENT_OPS)
def test_kornia_ops_run_in_the_steps_precision(op):
    cfg = parse_config({"augment": {"ops": [op], op: {"p": 1.0, "where": "kornia"}}}).augment
    images = torch.randint(0, 256, (4, 3, 24, 24), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
    for dtype in (torch.bfloat16, torch.float16):
        out = build_augmenter(cfg, dtype=dtype)(images)
        assert out.dtype == torch.uint8 and out.shape == images.shape
        assert out.is_contiguous(memory_format=torch.channels_last), "back in the layout the convolutions want"
        assert not torch.equal(out, images)


@pytest.mark.process
def test_training_applies_each_op_once(synth_dir, tmp_path):
    cfg = train_config(synth_dir, ["augment.ops=[color_jitter,gaussian_blur,grayscale]"])
    with Session(cfg, tmp_path / "run", resume=False, profile_steps=None) as session:
        assert session.augment_placement == {"color_jitter": "loader", "gaussian_blur": "kornia", "grayscale": "torch"}
        assert session.data.train.augment.jitter is not None and session.data.train.augment.grayscale_p is None
        assert session.data.val.augment is None, "evaluation never augments"
        assert session.augment.names == ["gaussian_blur", "grayscale"]


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("op", "place"), [(op, "kornia") for op in AUGMENT_OPS] + [(op, "torch") for op in LOADER_AUGMENT_OPS]
)
def test_device_ops_never_synchronise_with_the_host(op, place):
    cfg = parse_config({"augment": {"ops": [op], op: {"where": place, "p": 0.5}}}).augment
    augment = build_augmenter(cfg, dtype=torch.bfloat16).cuda()
    images = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8, device="cuda")
    images = images.contiguous(memory_format=torch.channels_last)
    augment(images)  # first call: lazy set-up may sync
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            augment(images)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


@pytest.mark.parametrize("size", [SizePx(32, 32), SizePx(48, 32)], ids=["square", "48x32"])
def test_bench_augment_prints_every_op_beside_the_model_step(capsys, size):
    from gpufeed.bench.augment import print_augment_result, run_augment_bench

    result = run_augment_bench(device="cpu", model="smallcnn", batch_size=4, size_px=size, rounds=2, graph_iterations=2)
    assert result["model_step_ms"] > 0
    places = {(r["op"], r["place"].split(":")[0]) for r in result["ops"]}
    assert {(op, "kornia") for op in AUGMENT_OPS} <= places
    assert {("color_jitter", "loader"), ("grayscale", "loader"), ("color_jitter", "torch (fused)")} <= places
    assert all(
        r["ms"] >= 0 and r["share_of_step"] == pytest.approx(r["ms"] / result["model_step_ms"]) for r in result["ops"]
    )
    default = result["default"]
    assert default["placement_now"] == {"color_jitter": "loader"} and default["before_ms"] > 0
    print_augment_result(result)
    out = capsys.readouterr().out
    assert "model step" in out and "default augmentation" in out and "target <= 20%" in out
    assert f"smallcnn, {32 if size == SizePx(32, 32) else '48x32'} px" in out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("separable", [True, False])
def test_the_gpu_blur_equals_kornias_gaussian_blur(separable, dtype):
    # On a GPU the blur skips Kornia's positivity check (a host read per step); the pixels must not
    # change, under AMP too (Kornia blurs half-precision pixels in float32 and rounds once).
    from kornia.filters import gaussian_blur2d

    from gpufeed.train._augment import _kernels_blur

    generator = torch.Generator().manual_seed(3)
    pixels = torch.rand(4, 3, 33, 20, generator=generator).to(dtype)
    sigma = torch.rand(4, 2, generator=generator) * 1.4 + 0.1
    for kernel in [(5, 5), (3, 7)]:
        ours = _kernels_blur(pixels, kernel, sigma, "reflect", separable)
        assert torch.equal(ours, gaussian_blur2d(pixels, kernel, sigma, "reflect", separable))
