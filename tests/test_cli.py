"""The CLI is thin, every subcommand has --help, and user errors are one clear line.

The ``--help`` of every subcommand and the commands' work run in-process through
:func:`gpufeed.cli.main` (unit tier), as does the check that every subcommand names a handler that
exists. Three checks start a real interpreter (process tier): that ``python -m gpufeed`` starts and
prints its help, that a user error ends the process with one line and exit status 2, never a
traceback, and that ``gpufeed --help`` and every subcommand's ``--help`` load neither torch, DALI
nor onnxruntime (the handlers' modules, which do, are imported only when a command runs).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from gpufeed.cli import build_parser, main
from gpufeed.commands import resolve_handler


def _run(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "gpufeed", *args], capture_output=True, text=True, timeout=timeout)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subcommands of ``parser`` by name, the unlisted old names (``bench soak``) included."""
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action._name_parser_map)
    return found


def _subcommands():
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    names = []
    for name, sub in action.choices.items():
        nested = [
            a for a in sub._actions if getattr(a, "choices", None) and a.dest != "help" and isinstance(a.choices, dict)
        ]
        names.append((name,))
        for group in nested:
            names += [(name, child) for child in group.choices]
    return names


def _runnable_commands():
    """Every command that runs a handler, as its words (``("bench", "loader")``), with its parser."""
    found = []
    for name, sub in _subparsers(build_parser()).items():
        children = _subparsers(sub)
        found += [((name, child), p) for child, p in children.items()] if children else [((name,), sub)]
    return found


@pytest.mark.parametrize("command", _subcommands(), ids=" ".join)
def test_every_subcommand_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--help"])
    out, err = capsys.readouterr()
    assert exit_info.value.code == 0, err
    assert out.startswith(f"usage: gpufeed {' '.join(command)}"), out[:200]


RUNNABLE = _runnable_commands()


@pytest.mark.parametrize(("command", "parser"), RUNNABLE, ids=[" ".join(words) for words, _ in RUNNABLE])
def test_every_command_names_a_handler_that_exists(command, parser):
    handler = parser.get_default("func")
    assert handler is not None, f"gpufeed {' '.join(command)} sets no handler"
    assert callable(resolve_handler(handler)), handler


def test_a_handler_named_wrongly_is_refused():
    assert resolve_handler(print) is print
    assert resolve_handler("gpufeed.commands._config_handlers:config").__name__ == "config"
    for bad in ("gpufeed.commands._config_handlers", "gpufeed.commands._config_handlers:no_such_handler"):
        with pytest.raises(ValueError, match="expected 'module:function'"):
            resolve_handler(bad)


# Asks for every subcommand's --help in one fresh interpreter, then lists the heavy libraries loaded.
_HELP_IMPORTS = """
import contextlib, io, json, sys
from gpufeed.cli import main
commands = json.loads(sys.argv[1])
for words in commands:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        main([*words, "--help"])
heavy = ("torch", "nvidia.dali", "onnxruntime", "gpufeed.pipelines", "gpufeed.train", "gpufeed.server")
print(json.dumps(sorted(name for name in sys.modules if name in heavy)))
"""


@pytest.mark.process
def test_help_loads_neither_torch_nor_dali_nor_onnxruntime():
    commands = [[]] + [list(words) for words in _subcommands()]
    proc = subprocess.run(
        [sys.executable, "-c", _HELP_IMPORTS, json.dumps(commands)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [], f"gpufeed ... --help imported {proc.stdout.strip()}"


@pytest.mark.process
def test_the_entry_point_starts_and_prints_help():
    proc = _run("--help")
    assert proc.returncode == 0, proc.stderr
    assert "usage: gpufeed" in proc.stdout
    assert all(name in proc.stdout for (name, *_) in _subcommands())


@pytest.mark.process
def test_config_errors_are_one_line_with_exit_2(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("loader:\n  batch_size: many\n")
    proc = _run("config", str(cfg))
    assert proc.returncode == 2
    assert "config key 'loader.batch_size': expected an integer, got 'many'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_synth_then_check(tmp_path, capsys):
    out = tmp_path / "data"
    status = main(
        [
            "synth",
            "--out",
            str(out),
            "--classes",
            "2",
            "--train-per-class",
            "3",
            "--val-per-class",
            "2",
            "--videos",
            "1",
            "--video-frames",
            "20",
        ]
    )
    assert status == 0, capsys.readouterr().err
    assert (out / "images" / "train.txt").is_file() and (out / "videos" / "clip_000.mp4").is_file()
    capsys.readouterr()
    assert main(["check", str(out)]) == 0
    printed = capsys.readouterr()
    assert "no problems found" in printed.out, printed.out + printed.err


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["train", "train.yaml"], "(the YAML file goes after --config: gpufeed train --config FILE)"),
        (["train", "--config", "t.yaml", "--set", "train.lr", "0.001"], "(--set takes KEY=VALUE in one word"),
        (["train", "--config", "t.yaml", "--set", "train.lr=1", "train.epochs=2"], "one --set for each key)"),
        (["train", "--config", "t.yaml", "train.lr=0.01"], "(a config key is set with --set KEY=VALUE"),
        (["serve", "--model-repo", "m", "--workers", "4"], "(a setting without a flag of its own is a config key"),
    ],
)
def test_usage_errors_from_other_tools_habits_say_what_to_write(argv, hint, capsys):
    """Hydra's key=value, --set with a space, the config as a positional: argparse alone said only what failed.

    Said by the command's own parser: ``serve --workers 4`` printed the top level's usage, which
    names no option of serve's."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err.rstrip().splitlines()
    assert err[-1].startswith(f"gpufeed {argv[0]}: error: ") and hint in err[-1]
    assert err[0].startswith(f"usage: gpufeed {argv[0]} "), err[0]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["check", "data", "s3://b/x.jpg"], "argument data: 's3://b/x.jpg': 'b' is not a bucket name"),
        (["prepare", "s3://bkt/v", "--shards", "gs://bkt/out"], "argument --shards: 'gs://bkt/out': gs:// is not read"),
        (["predict", "m.pt", "s3://Bkt/v.mp4"], "argument SOURCE: 's3://Bkt/v.mp4': 'Bkt' is not a bucket name"),
        (["bench", "storage", "--url", "s3://b"], "argument --url: 's3://b': 'b' is not a bucket name"),
    ],
)
def test_a_url_gpufeed_cannot_read_is_a_usage_error_naming_the_argument(argv, said, capsys):
    """A bad bucket name given to check or bench storage was a ValueError's traceback from deep in the command."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err.rstrip().splitlines()
    assert info.value.code == 2 and err[-1].startswith(f"gpufeed {' '.join(argv[: 2 if argv[0] == 'bench' else 1])}: ")
    assert said in err[-1] and not any("Traceback" in line for line in err), err


def test_describe_takes_a_key_or_a_section(capsys):
    """``config --describe train.lr`` ignored its argument and printed all 150 keys in a 551-column table."""
    assert main(["config", "--describe", "train.lr"]) == 0
    rows = capsys.readouterr().out.splitlines()[2:]
    assert [row.split()[0] for row in rows] == ["train.lr"]
    assert main(["config", "--describe", "telemetry"]) == 0
    keys = [row.split()[0] for row in capsys.readouterr().out.splitlines()[2:]]
    assert keys and all(key.startswith("telemetry.") for key in keys)
    assert main(["config", "--describe", "trai"]) == 2
    assert "config key 'trai': no config key is or starts with it" in capsys.readouterr().err


@pytest.mark.process
def test_output_cut_short_by_its_reader_is_no_traceback():
    """``gpufeed config --describe | head -1``: a BrokenPipeError traceback, twice (Python's flush at exit too)."""
    proc = subprocess.run(
        f"{sys.executable} -m gpufeed config --describe | head -1",
        shell=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.stdout.startswith("key ") and proc.stderr == ""
