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
from pathlib import Path

from _gpu_source import Module, Scope, dotted, is_fixture, qualified, reachable

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
    name = qualified(module, node)
    if name is None:
        raise LookupError("not a dotted name")
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise LookupError(f"{name} cannot be imported")


def patch_problems(scopes: list[Scope]) -> list[str]:
    """Every ``monkeypatch.setattr``/``delattr`` whose target is missing."""
    from _pytest.monkeypatch import derive_importpath

    problems = []
    for scope in scopes:
        for node in scope.nodes():
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr not in ("setattr", "delattr") or dotted(node.func.value) != "monkeypatch":
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
    if isinstance(node, ast.Call) and (dotted(node.func) or "").endswith("DeviceChoice") and node.args:
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
        if fixture is not None and is_fixture(fixture):
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
    for arg, default in [
        *zip(positional, args.defaults, strict=True),
        *zip(args.kwonlyargs, args.kw_defaults, strict=True),
    ]:
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
                    f"{scope.function.name}() line {node.lineno} compares exactly ({dotted(node.func)}) with no "
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
