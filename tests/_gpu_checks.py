"""Collection-time checks of the GPU tests, which a machine without a GPU skips and so never runs.

A ``gpu`` test that would fail on its first GPU for a reason a CPU can see is failed here instead,
on every machine, before it would be skipped: ``conftest.py`` runs :func:`problems_of` on every
``gpu``-marked test it collects and fails the test with the problems it names. What it checks, by
reading the test's source (its body, the module helpers and test-support functions it calls, the
fixtures it requests; never running them):

1. **Tier marks** (:func:`tier_problems`): a test whose code starts a child process or a server
   carries the ``process`` or ``live`` mark, as the unit-tier guard (``_tiers.py``) would demand on
   the GPU. Starts are calls of :data:`PROCESS_STARTS` and :data:`LIVE_STARTS`, the entry points the
   guard patches and the gpufeed functions that start servers or workers whatever their input, and
   a clip loader whose code names PyAV (``"pyav"``: worker processes). A start that depends on the
   data alone (a loader over frame stores reads in worker processes) is left to the CPU twins and
   to the guard itself.
2. **Patch targets** (:func:`patch_problems`): every ``monkeypatch.setattr``/``delattr`` target
   exists: ``"dotted.path"`` resolved as monkeypatch resolves it, ``(module_or_class, "name")`` with
   the object found through the module's imports.
3. **Decoders for their inputs** (:func:`decoder_problems`): a video decoder asked for exists for
   the input's codec on that device: a parametrisation ``(codec, decoder, device)``, and a loader
   built with ``decoder="dali"`` on the CPU device over videos whose codec the source tells (the
   synthetic dataset's h264, a fixture that encodes with ``codec=...``): DALI's CPU reader decodes
   :data:`gpufeed.pipelines._videos.DALI_CPU_CODECS` only, NVDEC the codecs of its table.
4. **Tolerances** (:func:`exact_problems`): a GPU test's exact comparison (``torch.equal``,
   ``np.array_equal``, ``assert_array_equal``) says why its two sides can be bit-equal with an
   ``# exact: <why>`` comment on its lines or the two above (the same decoder on both sides, integer
   tags or ids); pixels from two decoders (nvJPEG and libjpeg-turbo, NVDEC and FFmpeg, a fused and a
   separate resize) differ by a level here and there and are compared with a tolerance.

:func:`problems_of` also takes source text, so ``tests/test_gpu_checks.py`` runs each check on
deliberately broken examples.
"""

from __future__ import annotations

import ast
import functools
import importlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

TESTS = Path(__file__).parent

# Calls that start a child process: what _tiers.py patches, and the usual ways to reach it.
PROCESS_STARTS = frozenset(
    {
        "subprocess.Popen",
        "subprocess.run",
        "subprocess.call",
        "subprocess.check_call",
        "subprocess.check_output",
        "os.system",
        "os.posix_spawn",
        "os.posix_spawnp",
        "os.fork",
        "multiprocessing.Process",
        "multiprocessing.Pool",
        "concurrent.futures.ProcessPoolExecutor",
        "torch.multiprocessing.spawn",
        "torch.multiprocessing.start_processes",
        # A training run: DALI worker processes (PyAV clips, frame stores), DataLoader workers, a
        # metrics endpoint: every test of train() is in the process tier.
        "gpufeed.train.train",
    }
)
# Calls that start a server (a listening socket).
LIVE_STARTS = frozenset(
    {
        "gpufeed.server.start_server",
        "gpufeed.server.serve_forever",
        "gpufeed.server._launch.start_server",
        "gpufeed.server._launch.serve_forever",
        "prometheus_client.start_http_server",
        "socket.socket.listen",
    }
)
# Fixtures that are servers.
LIVE_FIXTURES = frozenset({"kserve_server"})
# Loader constructors that start PyAV worker processes when their code names the PyAV decoder.
CLIP_LOADERS = frozenset({"gpufeed.pipelines.ClipLoader", "gpufeed.pipelines._clip_loader.ClipLoader"})
EXACT_CALLS = frozenset(
    {
        "torch.equal",
        "numpy.array_equal",
        "numpy.testing.assert_array_equal",
        "numpy.testing.assert_equal",
    }
)
EXACT_NOTE = "# exact:"
# Where a test's videos come from, and their codec: the synthetic dataset's (gpufeed.synth: h264).
SYNTH_VIDEO_CODEC = "h264"
DECODERS = ("dali", "pyav")
DEVICE_NAMES = ("cpu", "gpu")


@dataclass
class Module:
    """What the checks need of one parsed file."""

    path: Path
    tree: ast.Module
    lines: list[str]
    imports: dict[str, str] = field(default_factory=dict)  # local name -> dotted target
    functions: dict[str, ast.FunctionDef] = field(default_factory=dict)
    constants: dict[str, ast.expr] = field(default_factory=dict)

    @classmethod
    def parse(cls, source: str, path: Path) -> Module:
        tree = ast.parse(source)
        module = cls(path, tree, source.splitlines())
        for node in ast.walk(tree):  # imports anywhere: tests import inside their bodies too
            module.imports.update(_imports_of(node))
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                module.functions[node.name] = node  # type: ignore[assignment]  # async defs read alike
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                module.constants[node.targets[0].id] = node.value
        return module


def _imports_of(node: ast.AST) -> dict[str, str]:
    if isinstance(node, ast.Import):
        return {(a.asname or a.name.split(".")[0]): (a.name if a.asname else a.name.split(".")[0]) for a in node.names}
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        return {(a.asname or a.name): f"{node.module}.{a.name}" for a in node.names}
    return {}


@functools.cache
def _support_module(name: str) -> Module | None:
    """A test-support module of this folder (``_serving``, ``videohelp``, ``conftest``), parsed once."""
    path = TESTS / f"{name}.py"
    if not path.is_file():
        return None
    return Module.parse(path.read_text(encoding="utf-8"), path)


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


_ALIASES = {"np": "numpy", "mp": "multiprocessing"}


def qualified(module: Module, node: ast.expr) -> str | None:
    """The dotted name a call's function refers to, through the module's imports (``np`` is numpy)."""
    dotted = _dotted(node)
    if dotted is None:
        return None
    head, _, rest = dotted.partition(".")
    target = module.imports.get(head, _ALIASES.get(head, head))
    return f"{target}.{rest}" if rest else target


@dataclass
class Scope:
    """One function whose code the checks read, and the module it is in."""

    module: Module
    function: ast.FunctionDef

    def nodes(self) -> Iterator[ast.AST]:
        yield from ast.walk(self.function)


def reachable(module: Module, test: ast.FunctionDef, limit: int = 40) -> list[Scope]:
    """The test, the module helpers and test-support functions it calls, and the fixtures it asks for."""
    conftest = _support_module("conftest")
    seen: set[tuple[str, str]] = set()
    out: list[Scope] = []
    queue = [Scope(module, test)]
    while queue and len(out) < limit:
        scope = queue.pop(0)
        key = (str(scope.module.path), scope.function.name)
        if key in seen:
            continue
        seen.add(key)
        out.append(scope)
        fixtures = [a.arg for a in scope.function.args.args]
        for name in fixtures:
            for owner in (scope.module, conftest):
                if owner is not None and name in owner.functions and _is_fixture(owner.functions[name]):
                    queue.append(Scope(owner, owner.functions[name]))
                    break
        for node in scope.nodes():
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                name = node.func.id
                if name in scope.module.functions:
                    queue.append(Scope(scope.module, scope.module.functions[name]))
                    continue
                target = scope.module.imports.get(name, "")
                support = _support_module(target.rpartition(".")[0]) if "." in target else None
                if support is not None and target.rpartition(".")[2] in support.functions:
                    queue.append(Scope(support, support.functions[target.rpartition(".")[2]]))
    return out


def _is_fixture(function: ast.FunctionDef) -> bool:
    for decorator in function.decorator_list:
        node = decorator.func if isinstance(decorator, ast.Call) else decorator
        if (_dotted(node) or "").endswith("fixture"):
            return True
    return False


# -- 1. tier marks --------------------------------------------------------------------------------


def starts(scopes: list[Scope], fixtures: list[str]) -> dict[str, str]:
    """{"process"/"live": what starts it} for the code of ``scopes``."""
    found: dict[str, str] = {}
    for name in fixtures:
        if name in LIVE_FIXTURES:
            found.setdefault("live", f"the {name} fixture (a server)")
    names_pyav = any(isinstance(n, ast.Constant) and n.value == "pyav" for s in scopes for n in s.nodes())
    for scope in scopes:
        for node in scope.nodes():
            if not isinstance(node, ast.Call):
                continue
            target = qualified(scope.module, node.func) or ""
            where = f"{scope.function.name}() calls {target}"
            if target in LIVE_STARTS or target.endswith(".listen"):
                found.setdefault("live", where)
            elif target in PROCESS_STARTS:
                found.setdefault("process", where)
            elif target in CLIP_LOADERS and names_pyav:
                found.setdefault("process", f"{where} and its code names the PyAV decoder (worker processes)")
    return found


def tier_problems(scopes: list[Scope], marks: set[str], fixtures: list[str]) -> list[str]:
    """A start without its tier's mark (``live`` covers ``process``)."""
    found = starts(scopes, fixtures)
    problems = []
    if "live" in found and "live" not in marks:
        problems.append(f"starts a server ({found['live']}) but is not marked `live`")
    if "process" in found and not {"process", "live"} & marks:
        problems.append(f"starts child processes ({found['process']}) but is not marked `process`")
    return problems


# -- 2. patch targets -----------------------------------------------------------------------------


def _resolve(module: Module, node: ast.expr):
    """The object an expression names through the module's imports (``_clip_loader``, ``os.path``), or raise."""
    dotted = qualified(module, node)
    if dotted is None:
        raise LookupError("not a dotted name")
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise LookupError(f"{dotted} cannot be imported")


def patch_problems(scopes: list[Scope]) -> list[str]:
    """Every ``monkeypatch.setattr``/``delattr`` whose target is missing."""
    from _pytest.monkeypatch import derive_importpath

    problems = []
    for scope in scopes:
        for node in scope.nodes():
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr not in ("setattr", "delattr") or _dotted(node.func.value) != "monkeypatch":
                continue
            if any(k.arg == "raising" for k in node.keywords) or not node.args:
                continue
            first, where = node.args[0], f"{scope.function.name}() line {node.lineno}"
            string_form = isinstance(first, ast.Constant) and isinstance(first.value, str)
            if string_form and (len(node.args) == 2 or (node.func.attr == "delattr" and len(node.args) == 1)):
                try:
                    derive_importpath(first.value, True)
                except (AttributeError, ImportError) as err:
                    problems.append(f"{where} patches {first.value!r}, which does not exist ({err})")
                continue
            if len(node.args) < 2 or not isinstance(node.args[1], ast.Constant):
                continue
            name = node.args[1].value
            try:
                owner = _resolve(scope.module, first)
            except (LookupError, AttributeError):
                continue  # a local object: not resolvable from the source
            if not hasattr(owner, name):
                shown = qualified(scope.module, first)
                problems.append(f"{where} patches {shown}.{name}, which does not exist (moved or renamed?)")
    return problems


# -- 3. decoders for their inputs -----------------------------------------------------------------


@functools.cache
def _codec_tables() -> tuple[frozenset, frozenset]:
    from gpufeed.pipelines._nvdec import _NVDEC
    from gpufeed.pipelines._videos import DALI_CPU_CODECS

    return frozenset(DALI_CPU_CODECS), frozenset(_NVDEC)


def decoder_verdict(codec: str, decoder: str, device: str) -> str | None:
    """Why ``decoder`` on ``device`` cannot decode ``codec``, or ``None``."""
    cpu_codecs, nvdec_codecs = _codec_tables()
    if decoder != "dali":
        return None
    if device == "cpu" and codec not in cpu_codecs:
        return f"DALI's CPU video reader has no {codec} decoder (it decodes {', '.join(sorted(cpu_codecs))})"
    if device == "gpu" and codec not in nvdec_codecs:
        return f"NVDEC has no {codec} decoder"
    return None


def param_problems(params: dict) -> list[str]:
    """A parametrisation ``(codec, decoder, device)`` whose decoder does not exist for its codec there."""
    cpu_codecs, nvdec_codecs = _codec_tables()
    problems = []
    for name, value in params.items():
        values = value if isinstance(value, (tuple, list)) else (value,)
        words = [v for v in values if isinstance(v, str)]
        codecs = [w for w in words if w in cpu_codecs | nvdec_codecs]
        decoders = [w for w in words if w in DECODERS]
        devices = [w for w in words if w in DEVICE_NAMES]
        if codecs and decoders and devices:
            why = decoder_verdict(codecs[0], decoders[0], devices[0])
            if why:
                problems.append(f"parameter {name}={value!r} asks for a decoder that does not exist: {why}")
    return problems


def _device_of(module: Module, node: ast.expr | None) -> str | None:
    """``"cpu"``/``"gpu"`` for a literal or a module constant made by ``DeviceChoice("cpu", ...)``."""
    if node is None:
        return None
    if isinstance(node, ast.Constant) and node.value in DEVICE_NAMES:
        return node.value
    if isinstance(node, ast.Name) and node.id in module.constants:
        node = module.constants[node.id]
    if isinstance(node, ast.Call) and (_dotted(node.func) or "").endswith("DeviceChoice") and node.args:
        first = node.args[0]
        if isinstance(first, ast.Constant) and first.value in DEVICE_NAMES:
            return first.value
    return None


def _keyword_literal(function: ast.FunctionDef, keyword: str) -> str | None:
    for node in ast.walk(function):
        if isinstance(node, ast.keyword) and node.arg == keyword and isinstance(node.value, ast.Constant):
            return node.value.value
    return None


def _codec_of(scope: Scope, node: ast.expr | None, depth: int = 0) -> str | None:
    """The codec of the videos an expression reads, where the source tells it."""
    if node is None or depth > 4:
        return None
    if isinstance(node, ast.Name):  # a local: the value it was given in the test
        for assign in ast.walk(scope.function):
            if isinstance(assign, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == node.id for t in assign.targets
            ):
                return _codec_of(scope, assign.value, depth + 1)
        fixture = scope.module.functions.get(node.id)
        return _keyword_literal(fixture, "codec") if fixture is not None else None
    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    strings = {n.value for n in ast.walk(node) if isinstance(n, ast.Constant)}
    if "synth_dir" in names and "videos" in strings:
        return SYNTH_VIDEO_CODEC
    for name in names:
        fixture = scope.module.functions.get(name)
        if fixture is not None and _is_fixture(fixture):
            codec = _keyword_literal(fixture, "codec")
            if codec:
                return codec
    return None


def _bound(call: ast.Call, function: ast.FunctionDef, parameter: str) -> ast.expr | None:
    """The argument a call passes for ``parameter`` of ``function`` (positional or keyword)."""
    for keyword in call.keywords:
        if keyword.arg == parameter:
            return keyword.value
    names = [a.arg for a in function.args.args]
    if parameter in names and names.index(parameter) < len(call.args):
        return call.args[names.index(parameter)]
    return None


def _default(function: ast.FunctionDef, parameter: str) -> ast.expr | None:
    """The default value of a parameter (positional or keyword-only)."""
    args = function.args
    positional = args.args[len(args.args) - len(args.defaults) :]
    for arg, default in [*zip(positional, args.defaults), *zip(args.kwonlyargs, args.kw_defaults)]:
        if arg.arg == parameter:
            return default
    return None


def _decoder_of(call: ast.Call, helper: ast.FunctionDef) -> str | None:
    """The video decoder a call of ``helper`` asks for: the call's ``decoder=``, its default, or the helper's literal."""
    node = _bound(call, helper, "decoder")
    if node is None:
        node = _default(helper, "decoder")
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return _keyword_literal(helper, "decoder")


def decoder_problems(scopes: list[Scope]) -> list[str]:
    """Calls of a module helper that builds a loader with ``decoder="dali"`` on a device and input it cannot decode."""
    problems = []
    test = scopes[0]
    for node in test.nodes():
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        helper = test.module.functions.get(node.func.id)
        if helper is None or _decoder_of(node, helper) != "dali":
            continue
        device = _device_of(test.module, _bound(node, helper, "device"))
        dataset_param = helper.args.args[0].arg if helper.args.args else None
        codec = _codec_of(test, _bound(node, helper, dataset_param) if dataset_param else None)
        if device and codec:
            why = decoder_verdict(codec, "dali", device)
            if why:
                problems.append(
                    f"line {node.lineno}: {node.func.id}() builds a loader with decoder='dali' on the {device} over "
                    f"{codec} videos: {why}"
                )
    return problems


# -- 4. tolerances --------------------------------------------------------------------------------


def exact_problems(scopes: list[Scope]) -> list[str]:
    """Exact comparisons without an ``# exact: <why>`` note (see the module docs)."""
    problems = []
    for scope in scopes:
        if scope.module is not scopes[0].module:
            continue  # the test module's own code: support modules compare tags and files, not decoders
        # `not torch.equal(a, b)` asserts a difference, which claims nothing about bit-equality.
        negated = {id(n.operand) for n in scope.nodes() if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not)}
        for node in scope.nodes():
            if not isinstance(node, ast.Call) or qualified(scope.module, node.func) not in EXACT_CALLS:
                continue
            if id(node) in negated:
                continue
            lines = scope.module.lines
            span = range(max(0, node.lineno - 3), min(len(lines), (node.end_lineno or node.lineno)))
            if not any(EXACT_NOTE in lines[i] for i in span):
                problems.append(
                    f"{scope.function.name}() line {node.lineno} compares exactly ({_dotted(node.func)}) with no "
                    f"`{EXACT_NOTE} <why>` note: pixels from two decoders differ by a level; compare them with a "
                    "tolerance, or say why both sides are bit-equal"
                )
    return problems


# -- all of it --------------------------------------------------------------------------------------


def problems_of(
    module: Module, test_name: str, *, marks: set[str], fixtures: list[str], params: dict | None = None
) -> list[str]:
    """Every problem of one ``gpu`` test, in words naming what to change."""
    function = module.functions.get(test_name)
    if function is None:  # a method of a test class, or made at run time: nothing to read
        return param_problems(params or {})
    scopes = reachable(module, function)
    return (
        tier_problems(scopes, marks, fixtures)
        + patch_problems(scopes)
        + param_problems(params or {})
        + decoder_problems(scopes)
        + exact_problems(scopes)
    )


@functools.cache
def module_of(path: str) -> Module:
    return Module.parse(Path(path).read_text(encoding="utf-8"), Path(path))


def item_problems(item) -> list[str]:
    """:func:`problems_of` for a collected pytest item (``gpu``-marked ones; others have none)."""
    if item.get_closest_marker("gpu") is None or not str(item.path).endswith(".py"):
        return []
    marks = {m.name for m in item.iter_markers()}
    callspec = getattr(item, "callspec", None)
    params = dict(callspec.params) if callspec is not None else {}
    name = getattr(item, "originalname", None) or item.name
    return problems_of(
        module_of(str(item.path)), name, marks=marks, fixtures=list(getattr(item, "fixturenames", ())), params=params
    )
