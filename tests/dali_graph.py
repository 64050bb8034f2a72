"""Read a DALI pipeline's graph without building it: its operators, their devices and arguments.

A pipeline defined for a GPU (``device_id=0``) but not built allocates nothing and needs no GPU:
DALI's Python side traces the graph (``Pipeline._build_graph``) and keeps each operator's schema,
device and the arguments it was given. These tests read them on a CPU machine to check what a GPU
graph would run (how many image decoders, with which options, fed by which kind of source).
The attributes are DALI's private ones (read in DALI 2.4's ``pipeline.py`` and ``ops/__init__.py``);
if a DALI release renames them, :func:`operators` fails loudly rather than finding nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Arguments DALI adds to every operator about where it was defined: not what the operator does.
_BOOKKEEPING = ("_origin_stack", "_display_name", "_module", "preserve_name", "name")


@dataclass(frozen=True)
class Operator:
    """One operator of a traced graph.

    Attributes:
        schema: DALI's schema name (``decoders__Image``, ``decoders__ImageSlice``, ``Resize`` ...).
        device: ``cpu``, ``mixed`` or ``gpu``.
        args: The arguments it was given (DALI's bookkeeping ones left out).
        parallel: For an ``ExternalSource``: whether its callback runs in DALI's worker processes.
        batch: For an ``ExternalSource``: whether its callback makes whole batches.
        callback: For an ``ExternalSource``: its callback.
    """

    schema: str
    device: str
    args: dict = field(default_factory=dict)
    parallel: bool | None = None
    batch: bool | None = None
    callback: object = None


def operators(pipe) -> list[Operator]:
    """The operators of ``pipe`` (built or not), in DALI's order."""
    if getattr(pipe, "_ops", None) is None:
        pipe._build_graph()
    found = []
    for instance in pipe._ops:
        op = instance._op
        # ExternalSource is a Python class of its own, without a schema name.
        schema, device = getattr(op, "schema_name", None) or type(op).__name__, op.device
        if not isinstance(schema, str) or device not in ("cpu", "mixed", "gpu"):
            raise AssertionError(f"DALI's operator attributes changed: {type(op).__name__} {schema!r} {device!r}")
        args = {k: v for k, v in dict(getattr(op, "_init_args", {}) or {}).items() if not k.startswith(_BOOKKEEPING)}
        group = getattr(instance, "_group", None)
        found.append(
            Operator(
                schema,
                device,
                args,
                getattr(group, "parallel", None) if group is not None else None,
                getattr(group, "batch", None) if group is not None else None,
                getattr(group, "callback", None) if group is not None else None,
            )
        )
    if not found:
        raise AssertionError("the traced pipeline has no operators: DALI's graph attributes changed?")
    return found


def image_decoders(pipe) -> list[Operator]:
    """The image decoders of ``pipe`` (``fn.decoders.image`` and ``fn.decoders.image_slice``)."""
    return [op for op in operators(pipe) if op.schema.startswith("decoders__Image")]


def external_sources(pipe) -> list[Operator]:
    """One :class:`Operator` per ``fn.external_source`` call (DALI makes one operator per output of each)."""
    seen, found = set(), []
    for op in operators(pipe):
        if op.schema == "ExternalSource" and id(op.callback) not in seen:
            seen.add(id(op.callback))
            found.append(op)
    return found


def output_devices(pipe) -> list[str]:
    """The device of each of ``pipe``'s outputs (built or not), in order: ``cpu`` or ``gpu``."""
    if getattr(pipe, "_graph_outputs", None) is None:
        pipe._build_graph()
    devices = [node.device for node in pipe._graph_outputs or []]
    if not devices or any(device not in ("cpu", "gpu") for device in devices):
        raise AssertionError(f"DALI's graph output attributes changed: {devices!r}")
    return devices
