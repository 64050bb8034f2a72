"""The ``gpufeed`` command line: thin wrappers over the Python API.

Each command group lives in ``gpufeed/commands/<group>.py`` and registers its subcommands with
``register(subparsers)``, each naming its handler as ``"module:function"``; this module only wires
them together, sets up logging, imports the handler of the subcommand that runs
(:func:`gpufeed.commands.resolve_handler`) and turns the library's user-facing errors into one
clear line and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import logging
import os
import sys
from collections.abc import Mapping
from typing import ClassVar

from gpufeed import __version__
from gpufeed.commands import MissingExtraError, require_stack, resolve_handler
from gpufeed.core import ConfigError, StorageError
from gpufeed.device import DeviceUnavailableError

__all__ = ["LOG_FORMAT", "build_parser", "log_format", "main"]

# Commands that run without DALI and onnxruntime; the others check for them first (an install made
# with --no-deps may lack them).
WITHOUT_STACK = ("synth", "config", "obs", "doctor")

# Order here is the order in `gpufeed --help`.
COMMAND_MODULES = (
    "gpufeed.commands.data",
    "gpufeed.commands.run",
    "gpufeed.commands.train",
    "gpufeed.commands.serve",
    "gpufeed.commands.predict",
    "gpufeed.commands.cache",
    "gpufeed.commands.bench",
    "gpufeed.commands.obs",
    "gpufeed.commands.reliability",
    "gpufeed.commands.doctor",
)


class _Parser(argparse.ArgumentParser):
    """argparse with a hint after the usage errors that habits from other tools make (its subcommands too).

    ``argv`` is what the top-level parser was given: ``--set train.lr 0.001`` reads as an
    unrecognized ``0.001``, which only the arguments around it explain.
    """

    argv: ClassVar[list[str]] = []

    def error(self, message: str):
        super().error(message + _hint(message, _Parser.argv, self.prog, "--set" in self._option_string_actions))


def _hint(message: str, argv: list[str], prog: str, takes_set: bool = False) -> str:
    if "arguments are required: --config" in message:
        return f" (the YAML file goes after --config: {prog} --config FILE)"
    if not message.startswith("unrecognized arguments:"):
        return ""
    if any(a == "--set" and "=" not in b for a, b in itertools.pairwise(argv)):
        return " (--set takes KEY=VALUE in one word: --set train.lr=0.001, one --set for each key)"
    if any("=" in word and not word.startswith("-") for word in message.split(":", 1)[1].split()):
        return " (a config key is set with --set KEY=VALUE, one --set for each key)"
    if takes_set and message.split(":", 1)[1].split()[0].startswith("--"):
        return " (a setting without a flag of its own is a config key: --set KEY=VALUE; gpufeed config --describe lists them)"
    return ""


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the (sub)command ``args`` chose: ``gpufeed serve``'s, ``gpufeed obs prometheus``'s."""
    while True:
        subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        names = [str(getattr(args, a.dest, "")) for a in subcommands]
        chosen = [a.choices[n] for a, n in zip(subcommands, names, strict=True) if n in a.choices]
        if not chosen:
            return parser
        parser = chosen[0]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gpufeed",
        description="Keep GPUs fed: DALI input pipelines, loader-vs-compute telemetry, GPU-decoding serving.",
    )
    parser.add_argument("--version", action="version", version=f"gpufeed {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def log_format(environ: Mapping[str, str] | None = None) -> str:
    """The log line format: :data:`LOG_FORMAT`, with ``[rank R]`` after the level under a launcher.

    Under ``torchrun`` (``WORLD_SIZE`` > 1) every rank logs the same lines; the rank tells whose a
    line is (a bad sample, a resume). A single process logs as it always has.

    Args:
        environ: The environment to read ``RANK`` and ``WORLD_SIZE`` from; default ``os.environ``.
    """
    environ = os.environ if environ is None else environ
    try:
        several = int(environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:  # training names a malformed launcher variable itself, in one line
        several = False
    if not several:
        return LOG_FORMAT
    rank = (environ.get("RANK", "?").strip() or "?").replace("%", "%%")  # a literal in the format
    return LOG_FORMAT.replace("%(levelname)s ", f"%(levelname)s [rank {rank}] ", 1)


def _user_errors() -> tuple[type[BaseException], ...]:
    # Errors caused by input (config, data, device choice) are reported in one line, no traceback.
    # Deferred: these modules load torch, DALI and the server (about 1 s), which only a command that
    # raised needs.
    from gpufeed.models import ExportError, ModelCardError
    from gpufeed.pipelines import BadSampleError, DatasetError, PipelineError
    from gpufeed.server import ModelRepoError, RuntimeSetupError, ServerStartError
    from gpufeed.train import TrainError

    serving = (ExportError, ModelCardError, ModelRepoError, RuntimeSetupError, ServerStartError)
    # StorageError: an s3:// read, named in one line; PipelineError: DALI's reason and the likely cause.
    data = (ConfigError, DatasetError, BadSampleError, PipelineError, StorageError)
    # A path of the wrong kind (a file where a folder goes, a folder where a file goes): the OS's one
    # line names it, as FileNotFoundError's does.
    paths = (FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError)
    return (*data, DeviceUnavailableError, *paths, TrainError, *serving)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the process exit status."""
    parser = build_parser()
    _Parser.argv = list(sys.argv[1:] if argv is None else argv)
    args, extra = parser.parse_known_args(argv)
    if extra:  # said by the command's own parser: its usage names its options, the top level's none
        _command_parser(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format=log_format(),
        datefmt="%H:%M:%S",
    )
    if not args.verbose:
        # boto3's INFO lines ("Found credentials in environment variables") on every bucket read: noise
        # at gpufeed's INFO level; -v shows them with the rest.
        for name in ("botocore", "boto3", "s3transfer"):
            logging.getLogger(name).setLevel(logging.WARNING)
    try:
        if args.command not in WITHOUT_STACK:
            require_stack(f"gpufeed {args.command}")
        # The handler's module loads the libraries it runs (torch, DALI...): imported after the stack check.
        return int(resolve_handler(args.func)(args) or 0)
    except MissingExtraError as err:  # caught first: listing the other user errors imports torch and DALI
        print(f"gpufeed {args.command}: error: {err}", file=sys.stderr)
        return 2
    except _user_errors() as err:
        # A run stopped on request (SIGTERM: checkpointed) is no error: 128 + the signal, as a shell says it.
        status = getattr(err, "exit_status", 2)
        if not getattr(err, "quiet", False):  # a stopped run's other ranks leave the line to rank 0
            print(f"gpufeed {args.command}: {'error: ' if status == 2 else ''}{err}", file=sys.stderr)
        return status
    except KeyboardInterrupt as err:
        # A command that knows what it left behind says so in the interrupt (predict: the outputs kept).
        print(f"gpufeed {args.command}: interrupted{f': {err}' if str(err) else ''}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `gpufeed config --describe | head`: the reader left, as it may with any tool
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's own flush at exit fails else
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
