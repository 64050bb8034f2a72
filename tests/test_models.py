"""Models take uint8, normalise inside, and carry their preprocessing facts."""

from __future__ import annotations

import pytest
import torch

from gpufeed.models import ModelSpec, create_model, list_models
from gpufeed.models._registry import model_from_spec


@pytest.mark.parametrize("name", list_models())
def test_every_model_takes_uint8_and_gives_logits(name):
    model = create_model(name, num_classes=5, size_px=64).eval()
    spec = model.spec
    x = torch.randint(0, 256, spec.input_shape(2), dtype=torch.uint8)
    with torch.no_grad():
        out = model(x)
    # Dense models (unet_resnet18) give one map per class at the input's size.
    want = (2, 5, 64, 64) if spec.task in ("depth", "segmentation") else (2, 5)
    assert out.shape == want and out.dtype == torch.float32
    with pytest.raises(TypeError, match="uint8"):
        model(x.float())


def test_normalisation_inside_matches_the_spec():
    model = create_model("resnet18", num_classes=3, mean=(0.5, 0.25, 0.125), std=(0.5, 0.5, 0.25))
    x = torch.randint(0, 256, (1, 3, 8, 8), dtype=torch.uint8)
    expected = (x.float() / 255 - torch.tensor([0.5, 0.25, 0.125]).view(1, 3, 1, 1)) / torch.tensor(
        [0.5, 0.5, 0.25]
    ).view(1, 3, 1, 1)
    assert torch.allclose(model.normalize(x), expected, atol=1e-6)


def test_spec_round_trips_and_rebuilds_the_same_architecture():
    model = create_model("clip_resnet18", num_classes=4, labels=("background", "groom", "rear", "walk"))
    spec = ModelSpec.from_dict(model.spec.to_dict())
    assert spec == model.spec and spec.input_layout == "NCTHW" and spec.multilabel
    rebuilt = model_from_spec(spec)
    rebuilt.load_state_dict(model.state_dict())


def test_resnet18_has_the_reference_parameter_count():
    params = sum(p.numel() for p in create_model("resnet18", num_classes=1000).parameters())
    assert params == 11_689_512  # torchvision's resnet18


def test_unknown_model_and_bad_spec_are_named():
    with pytest.raises(ValueError, match="known models: "):
        create_model("resnet999")
    with pytest.raises(ValueError, match="labels for"):
        create_model("resnet18", num_classes=3, labels=("a", "b"))


def test_checkpoint_contract_round_trip(tmp_path):
    from gpufeed.models import checkpoint_path, find_checkpoint, load_model, model_state

    model = create_model("smallcnn", num_classes=3).eval()
    for step in (5, 12):
        path = checkpoint_path(tmp_path, step)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({**model_state(model), "step": step}, path)
    assert find_checkpoint(tmp_path).name == "ckpt-000000012.pt"
    loaded = load_model(tmp_path).eval()
    x = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8)
    assert torch.equal(loaded(x), model(x)) and loaded.spec == model.spec
    torch.save({"weights": {}}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a gpufeed checkpoint: missing model, model_spec"):
        load_model(tmp_path / "other.pt")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        find_checkpoint(tmp_path / "missing")
