"""DeepEthogram project folders as clip datasets (``video.deepethogram: PROJECT``).

A project as DeepEthogram leaves it::

    PROJECT/project_config.yaml        project.class_names: [background, groom, rear, ...]
    PROJECT/DATA/<record>/record.yaml  rgb: {default: <video>, all: [...]}, label: {default: <csv>, ...}
    PROJECT/DATA/<record>/<video>      an mp4/avi/mov, a frame folder or an .h5 file of encoded frames
    PROJECT/DATA/<record>/<csv>        the labels: an unnamed index column (the frame), then one 0/1
                                       column per class in ``class_names`` order, background included

Each record with a label file is one video; records are split into training and validation by a
seeded shuffle (``video.val_fraction``), the same split for the same seed. A record that cannot be
used is a problem of its video naming the record and the key (``rgb``, ``label``): a missing video,
a label file whose rows are not the video's frames, a class the project does not list.

A project is input from anyone: its YAML files are read by the bounded loader
(:func:`gpufeed.core._yaml.read_yaml`: size, alias and nesting budgets), every file a record names must
resolve inside the project or a folder of ``data.allowed_roots``
(:mod:`gpufeed.pipelines._containment`: no absolute path, ``..`` or symbolic link out, nor a frame
store's links), and two records naming one video are one problem naming both (else one video
could sit in training and validation at once).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from gpufeed.core import DataPath, ObjectPath, YamlError, data_path, is_object_url, prime_listing, quoted, read_yaml
from gpufeed.pipelines._containment import Roots
from gpufeed.pipelines._errors import DatasetError
from gpufeed.pipelines._image_facts import DEFAULT_MAX_IMAGE_PIXELS
from gpufeed.pipelines._store_kinds import frame_store, store_kind
from gpufeed.pipelines._videos import VideoDataset, VideoInfo, index_videos, labels_for

__all__ = [
    "DeepEthogramProject",
    "ProjectRecord",
    "is_project",
    "project_dataset",
    "read_project",
    "split_records",
    "videos_at",
]


@dataclass(frozen=True)
class ProjectRecord:
    """One ``DATA/<key>/record.yaml``.

    Attributes:
        key: The record's name (its folder under ``DATA``).
        video: The ``rgb`` entry's ``default`` file (``None`` when missing).
        labels: The ``label`` entry's ``default`` file (``None`` when missing).
        problem: Why the record cannot be used, naming the key; ``None`` when fine so far.
    """

    key: str
    video: DataPath | None
    labels: DataPath | None
    problem: str | None = None


@dataclass(frozen=True)
class DeepEthogramProject:
    """A read project: its class names and records (sorted by key)."""

    root: DataPath
    class_names: tuple[str, ...]
    records: tuple[ProjectRecord, ...]

    @property
    def data_dir(self) -> DataPath:
        return self.root / "DATA"


def _load_yaml(path: DataPath, what: str) -> dict:
    try:
        data = read_yaml(path, what)
    except YamlError as err:
        raise DatasetError(str(err)) from None
    if not isinstance(data, dict):
        raise DatasetError(f"{what} {path} must be a mapping of keys, got {type(data).__name__}")
    return data


def _default_file(
    record: dict, folder: DataPath, entry: str, where: str, roots: Roots
) -> tuple[DataPath | None, str | None]:
    """The ``default`` file of ``entry`` (``rgb``/``label``), or why there is none (a path out of ``roots`` too)."""
    value = record.get(entry)
    default = value.get("default") if isinstance(value, dict) else None
    if not default:
        return None, f"{where}: key '{entry}.default' names no file (DeepEthogram writes [] until one is added)"
    if not isinstance(default, str):
        return None, f"{where}: key '{entry}.default' must be a file name, got {quoted(default)}"
    outside = roots.problem(default, folder)
    if outside:
        return None, f"{where}: key '{entry}.default' names {outside}"
    path = data_path(default) if is_object_url(default) else folder / default
    if not path.exists():
        return None, f"{where}: key '{entry}.default' names {default}, which is not in {folder}"
    return path, None


def is_project(path: DataPath) -> bool:
    """True for a folder holding ``project_config.yaml`` and ``DATA/`` (a DeepEthogram project)."""
    return (path / "project_config.yaml").is_file() and (path / "DATA").is_dir()


def read_project(
    root: str | Path | ObjectPath, allowed_roots: tuple[str | Path | ObjectPath, ...] = ()
) -> DeepEthogramProject:
    """Read ``project_config.yaml`` and every ``DATA/<record>/record.yaml`` (see the module docs).

    Args:
        allowed_roots: Folders outside the project its records may name (``data.allowed_roots``).

    Raises:
        DatasetError: The folder is not a DeepEthogram project (no config, no ``class_names``, no ``DATA``).
    """
    root = data_path(root)
    prime_listing(root)  # s3://: the whole project listed once, not a request per record
    config_path = root / "project_config.yaml"
    if not config_path.is_file():
        raise DatasetError(f"{root} is not a DeepEthogram project: it has no project_config.yaml")
    config = _load_yaml(config_path, "DeepEthogram project config")
    project = config.get("project")
    names = project.get("class_names") if isinstance(project, dict) else None
    if not isinstance(names, list) or len(names) < 2 or not all(isinstance(n, str) and n for n in names):
        raise DatasetError(
            f"{config_path}: key 'project.class_names' must list at least two class names (background first), "
            f"got {quoted(names)}"
        )
    data = root / "DATA"
    if not data.is_dir():
        raise DatasetError(f"{root} is not a DeepEthogram project: it has no DATA folder")
    roots = Roots.of(root, "the project", allowed_roots)
    records = []
    for folder in sorted(p for p in data.iterdir() if p.is_dir() and not p.name.startswith(".")):
        record_path = folder / "record.yaml"
        where = f"record {folder.name} ({str(record_path)[len(str(root)) + 1 :]})"  # relative to the project
        if not record_path.is_file():
            records.append(ProjectRecord(folder.name, None, None, f"{where}: no record.yaml in the record's folder"))
            continue
        try:
            record = _load_yaml(record_path, "record")
        except DatasetError as err:
            records.append(ProjectRecord(folder.name, None, None, f"{where}: {err}"))
            continue
        video, why_video = _default_file(record, folder, "rgb", where, roots)
        labels, why_labels = _default_file(record, folder, "label", where, roots)
        kind = store_kind(video) if video else ""
        inside = frame_store(kind).link_problem(video, roots) if video and kind else None
        why_store = f"{where}: key 'rgb.default' ({video.name}): {inside}" if video and inside else None
        records.append(ProjectRecord(folder.name, video, labels, why_video or why_store or why_labels))
    if not records:
        raise DatasetError(f"{data} holds no records (one folder per video, each with a record.yaml)")
    return DeepEthogramProject(root, tuple(names), _without_duplicates(records, root))


def _identity(path: DataPath) -> str:
    """What two records naming one video share: the real path (links resolved), or the object's URL."""
    return str(path) if isinstance(path, ObjectPath) else os.path.realpath(path)


def _without_duplicates(records: list[ProjectRecord], root: DataPath) -> tuple[ProjectRecord, ...]:
    """The records, each one naming a video an earlier record names given a problem naming them all.

    The first record keeps its video: a video belongs to one record, so it sits in one split.
    """
    owners: dict[str, list[str]] = {}
    for record in records:
        if record.video is not None:
            owners.setdefault(_identity(record.video), []).append(record.key)
    out = []
    for record in records:
        keys = owners.get(_identity(record.video), []) if record.video is not None else []
        if record.video is not None and record.problem is None and len(keys) > 1 and keys[0] != record.key:
            video = (
                str(record.video.relative_to(root))
                if isinstance(record.video, ObjectPath) and isinstance(root, ObjectPath)
                else os.path.relpath(_identity(record.video), _identity(root))
            )
            where = f"record {record.key} ({Path('DATA', record.key, 'record.yaml')})"
            record = replace(  # no video: the record's folder stands for it, as for a missing one
                record,
                video=None,
                problem=f"{where}: key 'rgb.default' names the video of record {keys[0]} ({video}); "
                f"records {', '.join(keys)} all name it, and a video may belong to one record only",
            )
        out.append(record)
    return tuple(out)


def split_records(count: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(training, validation) record positions: a seeded shuffle, ``round(count * val_fraction)`` for validation.

    At least one record trains; a non-zero fraction of two or more records validates at least one.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction {val_fraction} is not allowed; allowed: 0 <= val_fraction < 1")
    order = np.random.default_rng(np.random.SeedSequence([seed, 20])).permutation(count)
    n_val = round(count * val_fraction)
    if val_fraction > 0 and count >= 2:
        n_val = max(1, n_val)
    n_val = min(n_val, count - 1)
    return np.sort(order[n_val:]), np.sort(order[:n_val])


def project_dataset(
    root: str | Path | ObjectPath,
    *,
    split: str,
    val_fraction: float,
    seed: int,
    progress: bool = False,
    allowed_roots: tuple[str | Path | ObjectPath, ...] = (),
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
) -> VideoDataset:
    """The training or validation videos of a DeepEthogram project, as a :class:`VideoDataset`.

    Args:
        split: ``"train"``, ``"val"`` or ``"all"`` (every record: ``gpufeed check``).
        val_fraction, seed: The record split (:func:`split_records`).
        allowed_roots: Folders outside the project its records may name (``data.allowed_roots``).
        max_pixels: Frames of frame stores whose header declares more pixels are refused undecoded
            (``data.max_image_pixels``).

    Raises:
        DatasetError: Not a project, or the split holds no record.
    """
    if split not in ("train", "val", "all"):
        raise ValueError(f"split {split!r} is not allowed; allowed: train, val, all")
    project = read_project(root, allowed_roots)
    train_ids, val_ids = split_records(len(project.records), val_fraction, seed)
    chosen = {"train": train_ids, "val": val_ids, "all": np.arange(len(project.records))}[split]
    records = [project.records[i] for i in chosen]
    if not records:
        raise DatasetError(
            f"DeepEthogram project {project.root}: no record for {split} ({len(project.records)} records, "
            f"video.val_fraction {val_fraction})"
        )
    # A record without a usable video still takes a place (its folder), so its problem is reported.
    paths = [str(r.video) if r.video else str(project.data_dir / r.key) for r in records]
    infos = _probe(project, records, paths, progress)
    problems: dict[int, str] = {}
    labels: list[np.ndarray | None] = [None] * len(records)
    for i, (record, info) in enumerate(zip(records, infos, strict=True)):
        where = f"record {record.key}"
        if record.problem:
            problems[i] = record.problem
            continue
        if info.problem:
            problems[i] = f"{where}: key 'rgb.default' ({record.video.name}): {info.problem}"
            continue
        rows, why, names = labels_for(record.video, info, record.labels)
        if why:
            problems[i] = f"{where}: key 'label.default': {why}"
        elif names != project.class_names:
            unknown = [n for n in names if n not in project.class_names]
            detail = f"unknown class(es) {unknown}" if unknown else f"columns {list(names)}"
            problems[i] = (
                f"{where}: key 'label.default' ({record.labels.name}): {detail}; project.class_names is "
                f"{list(project.class_names)} (in that order)"
            )
        else:
            labels[i] = rows
    return VideoDataset(
        tuple(paths),
        tuple(infos),
        tuple(labels),
        project.class_names,
        problems,
        f"{project.root} ({split})",
        max_pixels=max_pixels,
    )


def _probe(project: DeepEthogramProject, records, paths, progress: bool) -> list[VideoInfo]:
    usable = [i for i, r in enumerate(records) if r.video]
    probed = index_videos(project.data_dir, [paths[i] for i in usable], progress)
    # A record without a video: its problem is the video's, so check and the loaders name it.
    infos = [VideoInfo(p, problem=r.problem) for p, r in zip(paths, records, strict=True)]
    for i, info in zip(usable, probed, strict=True):
        infos[i] = info
    return infos


def videos_at(path: str | Path | ObjectPath, *, train: bool, val_fraction: float, seed: int) -> VideoDataset:
    """A folder of videos, or a DeepEthogram project's training (``train``) or validation records."""
    if is_project(data_path(path)):
        return project_dataset(path, split="train" if train else "val", val_fraction=val_fraction, seed=seed)
    return VideoDataset.from_folder(path)
