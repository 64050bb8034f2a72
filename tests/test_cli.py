"""The CLI is thin, every subcommand has --help, and user errors are one clear line.

The ``--help`` of every subcommand and the commands' work run in-process through
:func:`gpufeed.cli.main` (unit tier); two checks start the real ``python -m gpufeed`` entry point
(process tier): that it starts and prints its help, and that a user error ends the process with
one line and exit status 2, never a traceback.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpufeed.cli import build_parser, main


def _run(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "gpufeed", *args], capture_output=True, text=True, timeout=timeout)


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


@pytest.mark.parametrize("command", _subcommands(), ids=" ".join)
def test_every_subcommand_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--help"])
    out, err = capsys.readouterr()
    assert exit_info.value.code == 0, err
    assert out.startswith(f"usage: gpufeed {' '.join(command)}"), out[:200]


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
