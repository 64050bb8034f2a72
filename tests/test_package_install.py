"""gpufeed as users install it: sdist, then wheel, then a non-editable install in a fresh venv.

The session's wheel venv (``installed``, built by ``_wheel_venv.py``) holds the wheel and the test
venv's runtime dependencies only. Commands run from a folder outside the checkout, so nothing in it
can stand in for the installed package:
``--help`` of every command the parser has, ``synth``, ``check``, ``obs prometheus`` + ``obs
verify`` reading the rules and dashboards shipped as package data, the one-line errors of
commands whose extra is missing, and the README's own-loop quickstart, run as written.
"""

from __future__ import annotations

import ast
import json
import re
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from _obs_cli import obs_prometheus
from _wheel_venv import ROOT, ok, run_cmd, runtime_view

from gpufeed.obs import PrometheusNotFoundError, find_prometheus_binary, load_queries

pytestmark = pytest.mark.process

STACK = ROOT / "gpufeed" / "obs" / "stack"
EXTRAS = ("bench", "demo", "grpc", "docs", "test")


def _roots() -> dict[str, str]:
    """setup.py's ROOTS: installed package name -> source folder."""
    for node in ast.parse((ROOT / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "ROOTS":
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no ROOTS mapping")


def test_the_sdist_and_wheel_hold_every_module_the_license_and_the_monitoring_stack(installed):
    with tarfile.open(installed["sdist"]) as tar:
        in_sdist = {Path(*Path(n).parts[1:]).as_posix() for n in tar.getnames()}
    assert {"LICENSE", "README.md", "pyproject.toml", "setup.py"} <= in_sdist
    with zipfile.ZipFile(installed["wheel"]) as whl:
        in_wheel = set(whl.namelist())
        metadata = whl.read(next(n for n in in_wheel if n.endswith(".dist-info/METADATA"))).decode()
        license_text = whl.read(next(n for n in in_wheel if n.endswith(".dist-info/licenses/LICENSE"))).decode()
    assert "License-Expression: Apache-2.0" in metadata
    assert license_text == (ROOT / "LICENSE").read_text() and "Apache License" in license_text
    expected = set()
    for name, folder in _roots().items():
        for path in (ROOT / folder).rglob("*.py"):
            if "__pycache__" not in path.parts:
                expected.add("/".join([*name.split("."), *path.relative_to(ROOT / folder).parts]))
    expected |= {"gpufeed/obs/stack/" + p.relative_to(STACK).as_posix() for p in STACK.rglob("*") if p.is_file()}
    missing = sorted(expected - in_wheel)
    assert not missing, f"the wheel lacks {len(missing)} file(s) of the checkout: {missing[:20]}"
    assert "gpufeed/commands/__init__.py" in in_wheel and "gpufeed/pipelines/__init__.py" in in_wheel
    strays = sorted(n for n in in_wheel if not n.startswith(("gpufeed/", "gpufeed-")))
    assert not strays, f"the wheel installs outside gpufeed/: {strays}"


def test_the_environment_is_the_installed_wheel_with_runtime_dependencies_only(installed):
    probe = (
        "import json, importlib.util as u; import gpufeed; "
        "names = ['gpufeed', 'gpufeed.commands', 'gpufeed.obs', 'gpufeed.pipelines', 'gpufeed.models', "
        "'gpufeed.server', 'gpufeed.train']; "
        "print(json.dumps({n: u.find_spec(n).origin for n in names} | "
        "{m: u.find_spec(m) is not None for m in ['litserve', 'fastapi', 'tritonclient', 'httpx', 'cv2', 'pytest']}))"
    )
    found = json.loads(ok(run_cmd([installed["python"], "-c", probe], installed["cwd"], installed["env"])).stdout)
    for name in ("gpufeed", "gpufeed.commands", "gpufeed.obs", "gpufeed.pipelines", "gpufeed.models", "gpufeed.server"):
        assert Path(found[name]).is_relative_to(installed["site"]), f"{name} imported from {found[name]}"
        assert not Path(found[name]).is_relative_to(ROOT)
    extras = {m: found[m] for m in ("litserve", "fastapi", "tritonclient", "httpx", "cv2", "pytest")}
    assert not any(extras.values()), f"extras' packages visible in the runtime-only venv: {extras}"


_EVERY_HELP = """
import argparse, contextlib, io, json
from gpufeed.cli import build_parser, main

def walk(parser, path):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield path + [name]
                yield from walk(sub, path + [name])

helps = {}
for path in walk(build_parser(), []):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main([*path, "--help"])
    helps[" ".join(path)] = out.getvalue()
print(json.dumps(helps))
"""


def test_help_of_gpufeed_and_of_every_subcommand(installed):
    top = ok(run_cmd([installed["gpufeed"], "--help"], installed["cwd"], installed["env"])).stdout
    # Every command and subcommand the installed parser has (read from it, not listed here), each
    # asked for --help through the installed CLI's main(), in one process.
    helps = json.loads(ok(run_cmd([installed["python"], "-c", _EVERY_HELP], installed["cwd"], installed["env"])).stdout)
    assert len(helps) >= 20 and "obs verify" in helps and "bench server" in helps
    for name in {path.split()[0] for path in helps}:
        assert re.search(rf"^\s+{name}\s", top, re.M), f"gpufeed --help does not list {name}"
    for path, text in helps.items():
        assert text.startswith(f"usage: gpufeed {path}") and "options:" in text, f"gpufeed {path} --help: {text[:300]}"


def test_synth_then_check(installed):
    data = installed["cwd"] / "data"
    ok(run_cmd([installed["gpufeed"], "synth", "--out", data], installed["cwd"], installed["env"]))
    assert (data / "synth.json").is_file() and list((data / "videos").glob("*.mp4"))
    proc = ok(run_cmd([installed["gpufeed"], "check", data], installed["cwd"], installed["env"], timeout=300))
    assert "no problems found" in proc.stdout, proc.stdout


QUICKSTART_MARK = "<!-- quickstart: own loop -->"


def readme_quickstart() -> str:
    """The README's own-loop quickstart: the ```python block right after its marker line."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(rf"^{re.escape(QUICKSTART_MARK)}\n```python\n(.*?)^```$", text, re.M | re.S)
    assert match, f"README.md has no ```python block right after the line {QUICKSTART_MARK}"
    return match.group(1)


@pytest.mark.timeout(300)
def test_the_readme_own_loop_quickstart_runs_as_written(installed):
    """The README's block, unchanged, from the wheel's venv on a folder of photos, then a check of what it did."""
    from gpufeed.synth._images import write_image_split

    snippet = readme_quickstart()
    assert 5 <= len([line for line in snippet.splitlines() if line.strip()]) <= 12, snippet
    cwd = installed["cwd"] / "quickstart"
    cwd.mkdir()
    write_image_split(cwd, "photos", ("amber", "birch", "cedar"), 6, seed=0)  # photos/<class>/*.jpg|png: 18 files
    check = (
        "\nimport json, gpufeed\n"
        "print(json.dumps({'epoch': loader.epoch, 'classes': list(loader.dataset.classes), "
        "'batch': list(batch.images.shape), 'steps': opt.state_dict()['state'][0]['step'].item(), "
        "'package': gpufeed.__file__}))\n"
    )
    (cwd / "quickstart.py").write_text(snippet + check, encoding="utf-8")
    proc = ok(run_cmd([installed["python"], "quickstart.py"], cwd, installed["env"], timeout=240))
    done = json.loads(proc.stdout.strip().splitlines()[-1])
    assert done["epoch"] == 1 and done["classes"] == ["amber", "birch", "cedar"], done
    assert done["batch"] == [16, 3, 96, 96] and done["steps"] == 1, done  # 18 images: one full batch of 16
    assert Path(done["package"]).is_relative_to(installed["site"]), done


@pytest.mark.timeout(600)
@pytest.mark.parametrize("form", ["mp4", "folder", "hdf5"])
def test_train_on_a_deepethogram_project_from_the_wheel(installed, form, tmp_path):
    """A project made by DeepEthogram's vidio (test extra) trains with the installed wheel's `gpufeed train`."""
    import yaml
    from videohelp import make_deepethogram_project

    project = make_deepethogram_project(tmp_path / f"{form}_deepethogram", form, (30, 28, 26))
    config = {
        "device": "cpu",
        "model": {"name": "clip_resnet18"},
        "video": {"deepethogram": str(project), "val_fraction": 0.34, "size_px": [48, 32]},
        "loader": {"batch_size": 4, "num_threads": 2},
        "train": {"epochs": 2, "max_steps": 2, "progress": False},
        "augment": {"ops": []},
        "telemetry": {"metrics_port": 0},
    }
    path = tmp_path / f"{form}.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    run = tmp_path / f"run-{form}"
    cmd = [installed["gpufeed"], "train", "--config", path, "--out", run]
    ok(run_cmd(cmd, installed["cwd"], installed["env"], timeout=500))
    assert len((run / "steps.jsonl").read_text().splitlines()) == 2


@pytest.mark.timeout(300)
def test_obs_reads_the_rules_and_dashboards_installed_with_the_package(installed):
    try:
        find_prometheus_binary()
    except PrometheusNotFoundError as err:
        pytest.fail(str(err))
    run = installed["cwd"] / "train-run"
    run.mkdir()
    cmd = [installed["gpufeed"], "obs", "prometheus", "--train", run, "--interval", "1s"]
    cmd += ["--workdir", installed["cwd"] / "prom"]
    with obs_prometheus(cmd, run, cwd=installed["cwd"], env=installed["env"]) as api:
        # Prometheus loaded the rule files from the installed package, not from the checkout.
        rule_files = {Path(g["file"]) for g in api.rule_groups()}
        assert rule_files and all(f.is_relative_to(installed["site"] / "gpufeed" / "obs" / "stack") for f in rule_files)
        queries = load_queries(STACK)
        assert sum(len(g["rules"]) for g in api.rule_groups()) == sum(q.kind in ("record", "alert") for q in queries)
        # No series here to take the dashboards' variables from: match every value.
        args = ["obs", "verify", "--prometheus", api.url, "--since", "1m", "--all", "--set", "rank=.*"]
        args += ["--set", "model=.*"]
        verify = run_cmd([installed["gpufeed"], *args], installed["cwd"], installed["env"])
    # Every dashboard panel and rule was found and evaluated; nothing gpufeed exports is scraped
    # here, so queries lack data (exit 1), but none may be invalid.
    assert verify.returncode == 1 and "Traceback" not in verify.stderr, verify.stdout + verify.stderr
    assert re.search(rf"\d+ passed, \d+ skipped, \d+ failed of {len(queries)}\b", verify.stdout), verify.stdout
    assert not re.search(r"^\s*error\s", verify.stdout, re.M), verify.stdout
    assert "Per-stage latency p99 (stacked)" in verify.stdout and "TrainingLoaderBound" in verify.stdout


@pytest.mark.parametrize(
    ("command", "extra"),
    [(["bench", "server"], "bench"), (["reliability", "fuzz"], "bench"), (["demo"], "demo")],
)
def test_a_command_whose_extra_is_missing_says_what_to_install(installed, command, extra):
    cwd = installed["cwd"] / f"needs-{extra}-{'-'.join(command)}"
    cwd.mkdir()
    proc = run_cmd([installed["gpufeed"], *command], cwd, installed["env"])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"gpufeed {command[0]}: error: 'gpufeed {' '.join(command)}' needs gpufeed's '{extra}'")
    assert lines[0].endswith(f"pip install 'gpufeed[{extra}]'"), lines[0]
    assert not list(cwd.iterdir()), "the command started work before checking its extra"


def test_serve_grpc_port_without_the_grpc_extra_says_what_to_install(installed):
    cwd = installed["cwd"] / "needs-grpc-serve"
    cwd.mkdir()
    proc = run_cmd(
        [installed["gpufeed"], "serve", "--model", cwd / "no-model", "--grpc-port", "0"], cwd, installed["env"]
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "'gpufeed serve --grpc-port' needs gpufeed's 'grpc' extra" in lines[0], lines[0]
    assert lines[0].endswith("pip install 'gpufeed[grpc]'"), lines[0]


def test_with_every_extra_installed_no_command_is_stopped():
    """The development venv has all extras: the check finds nothing missing (no false alarms)."""
    from gpufeed.commands import missing_from_extra, require_extra

    assert missing_from_extra("bench") == [] and missing_from_extra("demo") == [] and missing_from_extra("grpc") == []
    assert missing_from_extra("s3") == []
    require_extra("bench", "gpufeed bench server")
    with pytest.raises(ValueError, match="no extra 'gpu'; it has: bench, demo, grpc, docs, s3, test, cuda12"):
        missing_from_extra("gpu")


_CUDA12 = re.compile(r"^(nvidia-dali-cuda120|nvidia-[a-z-]+-cu12\b)")


@pytest.mark.parametrize("extras", [[], ["test"]])
def test_each_stacks_requirements_read_from_the_installed_wheel_match_pyproject(installed, extras):
    """The wheel user's CUDA 13 route reads the installed gpufeed's metadata; it must say what pyproject says."""
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    from gpufeed.stack import read_pyproject_requirements, stack_requirements

    declared = read_pyproject_requirements(str(ROOT / "pyproject.toml"))
    for stack in ("cpu", "cuda12", "cuda13"):
        command = [installed["python"], "-m", "gpufeed.stack", "requirements", stack, *extras]
        lines = ok(run_cmd(command, installed["cwd"], installed["env"])).stdout.splitlines()
        want = stack_requirements(stack, extras, declared=declared)
        # setuptools rewrites a line's form (quotes, the order of specifiers), not its meaning.
        assert sorted(map(str, map(Requirement, lines))) == sorted(map(str, map(Requirement, want))), stack
        if stack == "cuda13":
            assert not [line for line in lines if _CUDA12.match(line)] and len(lines) == len(set(lines)), lines
            ort = [Requirement(line) for line in lines if line.startswith("onnxruntime")]
            assert [(r.name, r.extras, str(r.specifier)) for r in ort] == [
                ("onnxruntime-gpu", {"cuda", "cudnn"}, str(SpecifierSet(">=1.27,<1.29")))  # no B200 code from 1.29
            ]
            assert [line for line in lines if line.startswith("nvidia-dali")] == ["nvidia-dali-cuda130>=2.4"]


def test_without_dali_and_onnxruntime_a_command_names_the_packages_in_one_line(installed, tmp_path):
    """An install made with --no-deps and no stack set after it: DALI and onnxruntime are missing."""
    venv = tmp_path / "venv"
    ok(run_cmd([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path))
    python = venv / "bin" / "python"
    site = ok(run_cmd([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path)).stdout
    left_out = runtime_view(tmp_path / "view", also_without=("nvidia-dali-cuda120", "onnxruntime-gpu"))
    assert {"nvidia", "onnxruntime"} <= left_out
    (Path(site.strip()) / "gpufeed-test-runtime-deps.pth").write_text(f"{tmp_path / 'view'}\n")
    ok(run_cmd([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q",
              installed["wheel"]], tmp_path, timeout=300))  # fmt: skip
    gpufeed = venv / "bin" / "gpufeed"
    proc = run_cmd([gpufeed, "check", tmp_path], installed["cwd"], installed["env"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("gpufeed check: error: 'gpufeed check' needs DALI and onnxruntime"), line
    assert "(missing: nvidia.dali, onnxruntime)" in line, line
    assert "pip install 'nvidia-dali-cuda120>=2.4' 'onnxruntime-gpu" in line and "requirements cuda13" in line, line
    doctor = run_cmd([gpufeed, "doctor"], installed["cwd"], installed["env"])
    assert doctor.returncode == 1 and "DALI is not installed" in doctor.stdout, doctor.stdout + doctor.stderr
