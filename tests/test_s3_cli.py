"""``gpufeed check`` and ``gpufeed train`` on ``s3://`` roots, as a user runs them: the CLI in a child process,
its AWS settings from the environment (moto's server on 127.0.0.1), and the secret access key never in any output.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess

import pytest
import yaml
from _s3server import upload_tree
from train_support import gpufeed_cmd, run_gpufeed

from gpufeed.core._storage import S3Path

pytestmark = [pytest.mark.live, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def s3_data(s3_server, synth_dir) -> S3Path:
    from gpufeed.core import _s3

    bucket = S3Path("s3://gpufeed-cli-data")
    _s3.client().create_bucket(Bucket=bucket.bucket)
    upload_tree(synth_dir / "images", bucket / "synth" / "images")
    upload_tree(synth_dir / "videos", bucket / "synth" / "videos")
    return bucket / "synth"


def _no_secret(secret: str, *texts: str) -> None:
    for text in texts:
        assert secret not in text, "the secret access key was printed"


def _text_files(folder) -> list[str]:
    out = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        out.append(data.decode("utf-8", "replace"))
    return out


def test_check_reads_a_bucket_and_names_a_missing_prefix_in_one_line(s3_server, s3_data, tmp_path):
    done = run_gpufeed("check", f"{s3_data}/images/train", "--json", str(tmp_path / "report.json"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["checked"] == 96 and report["sources"][0].startswith("class folders under s3://gpufeed-cli-data/")
    missing = run_gpufeed("-v", "check", "s3://gpufeed-cli-data/no/such/prefix")  # -v: botocore's debug logs too
    assert missing.returncode != 0
    assert "s3://gpufeed-cli-data/no/such/prefix does not exist" in missing.stderr
    assert "Traceback" not in missing.stderr
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    unreachable = run_gpufeed(
        "check",
        f"{s3_data}/images/train",
        env={"AWS_ENDPOINT_URL": f"http://127.0.0.1:{closed}", "AWS_MAX_ATTEMPTS": "1"},
    )
    assert unreachable.returncode != 0 and "Traceback" not in unreachable.stderr
    assert (
        f"gpufeed check: error: {s3_data}/images/train: cannot reach the object store at http://127.0.0.1:{closed}"
        in (unreachable.stderr)
    )
    _no_secret(s3_server.secret, done.stdout, done.stderr, missing.stdout, missing.stderr, unreachable.stderr)
    assert "botocore" not in done.stderr and "botocore" in missing.stderr, "boto3's logs with -v only"


def test_check_of_one_object_checks_it_as_one_local_file(s3_data, synth_dir):
    image = min((synth_dir / "images" / "train").rglob("*.jpg"))
    key = image.relative_to(synth_dir).as_posix()
    done = run_gpufeed("check", f"{s3_data}/{key}")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.startswith(f"checked 1 file(s) in: {s3_data}/{key}\n"), done.stdout
    missing = run_gpufeed("check", f"{s3_data}/{key}.missing.jpg")
    assert missing.returncode == 2 and f"{s3_data}/{key}.missing.jpg does not exist" in missing.stderr


@pytest.mark.parametrize("model", ["image", "clip"])
def test_train_on_a_bucket_without_the_secret_in_any_output(model, s3_server, s3_data, tmp_path):
    run = tmp_path / "run"
    config = {
        "device": "cpu",
        "seed": 0,
        "loader": {"batch_size": 4, "num_threads": 2},
        "train": {"epochs": 1, "max_steps": 3, "progress": False},
        "augment": {"ops": []},
        "telemetry": {"metrics_port": 0},
        "storage": {"cache_dir": str(tmp_path / "cache"), "cache_max_bytes": 64 << 20},
    }
    if model == "image":
        config |= {
            "model": {"name": "smallcnn"},
            "image": {"size_px": 32},
            "data": {"train": {"root": f"{s3_data}/images/train"}, "val": {"root": f"{s3_data}/images/val"}},
        }
    else:
        config |= {
            "model": {"name": "clip_resnet18"},
            "video": {"train": f"{s3_data}/videos", "size_px": [48, 32], "decoder": "pyav"},
        }
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    # The S3-only endpoint variable alone: boto3 (the index, PyAV's reads) and DALI's AWS SDK (the images) both read it.
    env = {k: v for k, v in os.environ.items() if k != "AWS_ENDPOINT_URL"} | {"AWS_ENDPOINT_URL_S3": s3_server.endpoint}
    cmd = gpufeed_cmd("-v", "train", "--config", str(path), "--out", str(run))  # -v: botocore's debug logs too
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=500, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines()]
    assert len(steps) == 3
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert str(saved["data" if model == "image" else "video"]).count("s3://gpufeed-cli-data/") >= 1
    if model == "clip":  # PyAV's ranged reads went through the disk cache
        assert any((tmp_path / "cache" / "blocks").rglob("*")), "blocks cached"
    _no_secret(s3_server.secret, done.stdout, done.stderr, *_text_files(run))
