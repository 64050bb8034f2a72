"""Whether gpufeed's optional extras are installed, read from gpufeed's own package metadata.

Commands that need an extra (``gpufeed demo``, ``gpufeed serve --grpc-port``, ``gpufeed bench
server --protocol grpc``) check it before any work starts, so a missing package is one clear line
rather than an ImportError halfway through.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re

__all__ = [
    "STACK_MODULES",
    "MissingExtraError",
    "missing_from_extra",
    "missing_stack_modules",
    "require_extra",
    "require_stack",
]

# DALI and onnxruntime: runtime dependencies, yet absent from an install made with --no-deps without
# its CUDA stack's set (docs/gpu.md, "CUDA stacks"); every command but synth, config, obs and doctor
# imports them.
STACK_MODULES = ("nvidia.dali", "onnxruntime")


class MissingExtraError(RuntimeError):
    """A command needs packages of a gpufeed extra (``pip install 'gpufeed[NAME]'``) that are not installed."""


def missing_from_extra(extra: str) -> list[str]:
    """The distributions of gpufeed's ``extra`` that are not installed, read from gpufeed's own metadata.

    The extra's list in pyproject.toml is the one source: nothing here names packages. Empty when
    gpufeed's metadata is absent (running from a checkout that was never installed). Requirements
    whose marker says more than ``extra == NAME`` are not judged here (no marker evaluator is a
    runtime dependency), so the check can only ever under-report.

    Raises:
        ValueError: gpufeed declares no such extra.
    """
    try:
        metadata = importlib.metadata.metadata("gpufeed")
    except importlib.metadata.PackageNotFoundError:
        return []
    if extra not in (metadata.get_all("Provides-Extra") or []):
        raise ValueError(
            f"gpufeed has no extra {extra!r}; it has: {', '.join(metadata.get_all('Provides-Extra') or [])}"
        )
    missing = []
    for requirement in metadata.get_all("Requires-Dist") or []:
        spec, _, marker = requirement.partition(";")
        if re.fullmatch(rf"\s*extra\s*==\s*[\"']{re.escape(extra)}[\"']\s*", marker) is None:
            continue
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec)
        if match is None:  # not a requirement line pip would have written; nothing to name
            continue
        name = match.group(1)
        if name.lower() == "gpufeed":
            continue
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    return missing


def require_extra(extra: str, command: str) -> None:
    """Check before any work starts that ``command`` has the packages of gpufeed's ``extra``.

    Raises:
        MissingExtraError: One line naming the missing packages and the ``pip install`` to run.
    """
    missing = missing_from_extra(extra)
    if missing:
        raise MissingExtraError(
            f"'{command}' needs gpufeed's '{extra}' extra, which is not installed (missing: {', '.join(missing)}); "
            f"install it with: pip install 'gpufeed[{extra}]'"
        )


def missing_stack_modules() -> list[str]:
    """The modules of :data:`STACK_MODULES` that cannot be imported (found without importing them)."""
    missing = []
    for module in STACK_MODULES:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # its parent package (nvidia) is absent too
            found = False
        if not found:
            missing.append(module)
    return missing


def _stack_packages() -> list[str]:
    """gpufeed's own DALI and onnxruntime requirement lines (the CUDA 12 builds), from its metadata."""
    try:
        requires = importlib.metadata.requires("gpufeed") or []
    except importlib.metadata.PackageNotFoundError:
        requires = []
    lines = [r for r in requires if "extra" not in r and r.lower().startswith(("nvidia-dali", "onnxruntime"))]
    return lines or ["nvidia-dali-cuda120", "onnxruntime-gpu"]


def require_stack(command: str) -> None:
    """Check before any work starts that DALI and onnxruntime are installed.

    They are gpufeed's runtime dependencies, so only an install made with ``--no-deps`` (the CUDA 13
    stack's route, half done) or a removal lacks them.

    Raises:
        MissingExtraError: One line naming what is missing and the packages to install.
    """
    missing = missing_stack_modules()
    if missing:
        packages = " ".join(f"'{line}'" for line in _stack_packages())
        raise MissingExtraError(
            f"'{command}' needs DALI and onnxruntime, which are not installed (missing: {', '.join(missing)}): "
            f"pip install {packages} (gpufeed's own dependencies), or for the CUDA 13 stack "
            "pip install -r <(python -m gpufeed.stack requirements cuda13)"
        )
