"""``python -m gpufeed.stack``: the CUDA stack check, the stack this machine gets, and a stack's requirements.

``check`` resolves and checks each GPU stack's install set (:func:`gpufeed.stack.check_stack`);
``choose`` prints the stack for this machine's driver (what the Makefile installs);
``requirements STACK [EXTRA ...]`` prints what to install beside gpufeed for a stack
(:func:`gpufeed.stack.stack_requirements`, read from the installed gpufeed or ``--pyproject``):
``pip install --no-deps gpufeed && pip install -r <(python -m gpufeed.stack requirements cuda13)``.
The check exits 1 when any stack has a problem, 0 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpufeed.core import write_json
from gpufeed.stack._choice import STACKS, StackChoiceError, _requirements_main, choose_stack, read_driver
from gpufeed.stack.check import StackReport, check_stack


def format_report(report: StackReport, *, verbose: bool = False) -> str:
    """A stack's check in a few lines for people (every library with ``verbose``)."""
    head = f"{report.stack}: {'PASS' if report.ok else 'FAIL'} ({report.seconds:.1f} s"
    head += f", {report.downloaded_bytes / 1e6:.0f} MB read)" if report.downloaded_bytes else ", all from the cache)"
    lines = [head]
    if report.packages:
        gpu = [
            f"{n} {v}"
            for n, v in report.packages.items()
            if n.lower().startswith(("torch", "nvidia-dali", "onnxruntime"))
        ]
        lines.append(f"  {len(report.packages)} packages, among them {', '.join(gpu)}")
        lines.append("  CUDA builds: " + ", ".join(f"{k} {v}" for k, v in sorted(report.cuda_builds.items())))
    by_how: dict[str, dict[str, str]] = {}
    for found in report.found:
        how = "optional, absent" if found.how == "missing" and not found.required else found.how
        short = found.name.rsplit("/", 1)[-1]
        detail = {"package": f"{found.where} [{found.package}]", "loaded": found.where}.get(
            how, found.where or found.note
        )
        by_how.setdefault(how, {})[short] = detail
    for how in ("package", "loaded", "driver", "system", "missing", "optional, absent"):
        names = by_how.get(how, {})
        if not names:
            continue
        if verbose:
            shown = "".join(f"\n      {name}: {detail}" for name, detail in sorted(names.items()))
        else:
            shown = ", ".join(sorted(names)[:12]) + (f" and {len(names) - 12} more" if len(names) > 12 else "")
        lines.append(f"  {how} ({len(names)}): {shown}")
    lines.extend(f"  note: {note}" for note in report.notes)
    lines.extend(f"  PROBLEM: {problem}" for problem in report.problems)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpufeed.stack", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="resolve each GPU stack's install set and check what its libraries load")
    check.add_argument(
        "--stack", action="append", choices=["cuda12", "cuda13"], help="a stack to check (default: both)"
    )
    check.add_argument("--python", default="3.11", help="target Python version (default 3.11)")
    check.add_argument(
        "--root", type=Path, default=Path.cwd(), help="the checkout whose pyproject.toml names the packages"
    )
    check.add_argument("--cache", type=Path, default=Path(".cache/cuda-stack"), help="where downloads are cached")
    check.add_argument("--json", type=Path, help="also write the full reports to this JSON file")
    check.add_argument("-v", "--verbose", action="store_true", help="list every library and where it comes from")
    sub.add_parser("choose", help="the stack for this machine's driver, and why")
    sub.add_parser(
        "requirements", add_help=False, help="what to install beside gpufeed (--no-deps) for a stack: STACK [EXTRA ...]"
    )
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["requirements"]:  # its own parser (gpufeed/stack/_choice.py, which the Makefile runs as a file)
        return _requirements_main(argv[1:], prog="python -m gpufeed.stack requirements")
    args = parser.parse_args(argv)
    if args.command == "choose":
        try:
            driver, found = read_driver(strict=True)
            stack, why = choose_stack(driver)
        except StackChoiceError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print(f"{stack.name}: {why} ({found}); {STACKS[stack.name].about}")
        return 0
    reports = []
    for stack in args.stack or ["cuda12", "cuda13"]:
        report = check_stack(stack, root=args.root, cache=args.cache, python_version=args.python)
        print(format_report(report, verbose=args.verbose), flush=True)
        reports.append(report)
    if args.json:
        write_json(args.json, [r.to_json() for r in reports])
    return 0 if all(r.ok for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
