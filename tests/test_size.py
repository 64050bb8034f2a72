"""size_px: one number for a square, [width, height] otherwise, in the config and on the command line."""

from __future__ import annotations

import pytest

from gpufeed.config import (
    ConfigError,
    ImagePipelineConfig,
    SizePx,
    VideoConfig,
    load_config,
    parse_config,
    parse_size_px,
    save_config,
)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (224, SizePx(224, 224)),
        ([352, 224], SizePx(352, 224)),
        ((48, 32), SizePx(48, 32)),
        ("352x224", SizePx(352, 224)),
        ("352, 224", SizePx(352, 224)),
        ("64", SizePx(64, 64)),
        (SizePx(8, 4096), SizePx(8, 4096)),
    ],
)
def test_parse_size_px_reads_width_then_height(value, expected):
    size = parse_size_px(value, "image.size_px")
    assert size == expected
    assert size.hw == (expected.height_px, expected.width_px)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ([352], "[352] has 1 items; give [width, height]"),
        ([352, 224, 3], "has 3 items"),
        ([352, 4097], "height 4097 in [352, 4097] is out of range: each side must be 8..4096 px"),
        ([7, 224], "width 7 in [7, 224] is out of range"),
        (5000, "size 5000 in 5000 is out of range"),
        ([352, "tall"], "height 'tall' in [352, 'tall'] is not an integer"),
        ([True, 224], "width True"),
        (22.5, "value 22.5 is not a size"),
        (None, "value None is not a size"),
        ("352 by 224", "value '352 by 224' is not a size: give WIDTH (a square) or WIDTHxHEIGHT"),
        ({"w": 3}, "is not a size"),
    ],
)
def test_parse_size_px_names_the_key_and_the_bad_value(value, words):
    with pytest.raises(ConfigError) as info:
        parse_size_px(value, "video.size_px")
    assert info.value.key_path == "video.size_px"
    assert words in str(info.value)


@pytest.mark.parametrize("section", ["image", "video"])
def test_sections_take_a_pair_and_keep_a_number_square(section):
    cfg = parse_config({section: {"size_px": [352, 224]}})
    part = getattr(cfg, section)
    assert part.size_px == SizePx(width_px=352, height_px=224)
    square = getattr(parse_config({section: {"size_px": 96}}), section)
    assert square.size_px == SizePx(96, 96)
    # A square written as a pair is written back as the one number it always was.
    assert getattr(parse_config({section: {"size_px": [64, 64]}}), section).size_px.config_value() == 64


def test_defaults_stay_square():
    cfg = parse_config(None)
    assert cfg.image.size_px == SizePx(224, 224) and cfg.video.size_px == SizePx(112, 112)


@pytest.mark.parametrize("section", ["image", "video"])
def test_bad_sizes_name_the_section_key(section):
    with pytest.raises(ConfigError) as info:
        parse_config({section: {"size_px": [352, 2]}})
    assert info.value.key_path == f"{section}.size_px"
    assert "height 2 in [352, 2] is out of range" in str(info.value)
    with pytest.raises(ConfigError, match=rf"'{section}\.size_px'.*has 3 items"):
        parse_config(None, [f"{section}.size_px=[1, 2, 3]"])


def test_override_with_a_yaml_list():
    cfg = parse_config(None, ["image.size_px=[352,224]", "video.size_px=[48, 32]"])
    assert cfg.image.size_px == SizePx(352, 224) and cfg.video.size_px == SizePx(48, 32)


def test_non_square_round_trips_through_a_saved_config(tmp_path):
    cfg = parse_config({"image": {"size_px": [352, 224]}, "video": {"size_px": 64}})
    saved = save_config(cfg, tmp_path / "config.yaml")
    assert "- 352\n  - 224\n" in saved.read_text()
    again = load_config(saved)
    assert again == cfg and again.image.size_px == SizePx(352, 224) and again.video.size_px == SizePx(64, 64)


def test_python_callers_are_checked_too():
    assert ImagePipelineConfig(size_px=[48, 32]).size_px == SizePx(48, 32)
    assert VideoConfig(size_px=SizePx(40, 40)).size_px.config_value() == 40
    with pytest.raises(ConfigError, match="width 3 in"):
        VideoConfig(size_px=(3, 40))


@pytest.mark.parametrize(
    ("command", "flag"),
    [
        ("loader", "--size-px"),
        ("clips", "--size"),
        ("server", "--size-px"),
        ("train", "--size-px"),
        ("augment", "--image-size"),
    ],
)
def test_bench_flags_take_width_x_height(command, flag, capsys):
    from gpufeed.cli import build_parser

    parser = build_parser()
    assert getattr(parser.parse_args(["bench", command, flag, "352x224"]), flag.lstrip("-").replace("-", "_")) == (
        352,
        224,
    )
    assert getattr(parser.parse_args(["bench", command, flag, "96"]), flag.lstrip("-").replace("-", "_")) == SizePx(
        96, 96
    )
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", command, flag, "352x2"])
    assert "height 2 in [352, 2] is out of range" in capsys.readouterr().err


def test_model_spec_records_width_and_height():
    import json

    from gpufeed.models import ModelSpec

    spec = ModelSpec(name="smallcnn", task="image", num_classes=2, size_px=[352, 224])
    assert spec.size_px == SizePx(352, 224)
    assert spec.input_shape(4) == (4, 3, 224, 352)
    data = json.loads(json.dumps(spec.to_dict()))  # as a model card stores it
    assert (data["size_px"], data["width_px"], data["height_px"]) == ([352, 224], 352, 224)
    assert ModelSpec.from_dict(data) == spec
    clip = ModelSpec(name="r3d_small", task="clip", num_classes=2, clip_length_frames=5, size_px=(48, 32))
    assert clip.input_shape(1) == (1, 3, 5, 32, 48)
    assert ModelSpec(name="smallcnn", task="image", num_classes=2, size_px=[64, 64]).size_px.config_value() == 64
    with pytest.raises(ValueError, match=r"model 'smallcnn': size_px: value \[352\] has 1 items"):
        ModelSpec.from_dict({**data, "size_px": [352]})


# Where a size may be read from its written forms (an int, [width, height], "WxH"): everything
# else takes the SizePx these give and never re-reads it.
SIZE_BOUNDARIES = {
    "gpufeed/core/_size.py": "defines parse_size_px",
    "gpufeed/config/_data.py": "the config: YAML values (convert) and Python callers' image/video sections",
    "models/_spec.py": "a model's spec as checkpoints and model cards store it (224 or [352, 224])",
    "gpufeed/commands/bench.py": "command-line flags: --size-px 352x224",
}


def _parse_size_px_uses() -> dict[str, int]:
    import ast
    from pathlib import Path

    from _sources import parsed_file

    root = Path(__file__).resolve().parents[1]
    uses: dict[str, int] = {}
    for package in ("gpufeed", "pipelines", "models", "server"):
        for path in sorted((root / package).rglob("*.py")):
            tree = parsed_file(path)  # the session's one tree of it
            count = sum(
                (isinstance(node, ast.Name) and node.id == "parse_size_px")
                or (isinstance(node, ast.Attribute) and node.attr == "parse_size_px")
                or (isinstance(node, ast.FunctionDef) and node.name == "parse_size_px")
                for node in ast.walk(tree)
            )
            if count:
                uses[path.relative_to(root).as_posix()] = count
    return uses


def test_sizes_are_parsed_only_at_the_boundaries():
    uses = _parse_size_px_uses()
    outside = {path: n for path, n in uses.items() if path not in SIZE_BOUNDARIES}
    print(
        f"parse_size_px: {sum(uses.values())} uses in {len(uses)} modules, "
        f"{sum(outside.values())} outside the boundary modules {sorted(SIZE_BOUNDARIES)}"
    )
    assert not outside, f"size_px re-read past the boundary (take the SizePx instead): {outside}"
    assert set(uses) == set(SIZE_BOUNDARIES), (
        f"boundary modules that no longer read sizes: {set(SIZE_BOUNDARIES) - set(uses)}"
    )
