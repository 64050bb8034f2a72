"""The ground floor: what every gpufeed package shares, and nothing above it.

Typed configuration parsing (:func:`from_mapping`, :class:`ConfigError`), the bounded YAML reader,
the one image size type (:class:`SizePx`), atomic file writes, one-line text for errors, progress
bars, check lists, worker-process guards, storage paths that are local or ``s3://`` (:func:`data_path`,
:class:`ObjectPath`) and the metric names and buckets shared by the trainer and the server.

Nothing here imports torch, DALI or onnxruntime, so the CLI, worker processes and every layer above
can import it. The modules behind this face are private; gpufeed's packages import these names
from ``gpufeed.core``.
"""

from gpufeed.core._extras import MissingExtraError, missing_from_extra, require_extra, require_stack
from gpufeed.core._files import atomic_path, finite, remove_stale_temps, temp_path, write_atomic, write_json
from gpufeed.core._metric_values import PROTOCOLS, SERVER_SECONDS_BUCKETS, STAGES, TRAIN_SECONDS_BUCKETS
from gpufeed.core._object_path import ObjectPath, is_object_url
from gpufeed.core._outage import OUTAGE_PATTERN, is_outage
from gpufeed.core._prefetch import prefetch
from gpufeed.core._procs import (
    ParentWatch,
    WorkerCallback,
    descendants,
    forked_children_die_with_me,
    gc_frozen_for_fork,
    module_argv,
    process_alive,
)
from gpufeed.core._progress import progress_bar
from gpufeed.core._report import Check, Checklist, finish
from gpufeed.core._s3 import StorageError
from gpufeed.core._s3 import client as s3_client
from gpufeed.core._s3 import fetch_stats as s3_fetch_stats
from gpufeed.core._s3 import upload_file as s3_upload_file
from gpufeed.core._schema import ConfigError, check_ranges, describe, from_mapping, option, to_mapping
from gpufeed.core._size import SizePx, parse_size_px
from gpufeed.core._storage import (
    DataPath,
    S3Path,
    configure_storage,
    data_path,
    file_size,
    is_remote,
    join,
    listdir,
    local_file,
    media_source,
    member_ref,
    open_binary,
    prime_listing,
    read_bytes,
    split_member,
    stat_key,
    storage_cache,
    walk,
)
from gpufeed.core._storage_settings import DEFAULT_BLOCK_BYTES, DEFAULT_CACHE_MAX_BYTES
from gpufeed.core._text import format_table, parse_limit_mb, quoted
from gpufeed.core._yaml import YamlError, parse_yaml, read_yaml

__all__ = [
    "DEFAULT_BLOCK_BYTES",
    "DEFAULT_CACHE_MAX_BYTES",
    "OUTAGE_PATTERN",
    "PROTOCOLS",
    "SERVER_SECONDS_BUCKETS",
    "STAGES",
    "TRAIN_SECONDS_BUCKETS",
    "Check",
    "Checklist",
    "ConfigError",
    "DataPath",
    "MissingExtraError",
    "ObjectPath",
    "ParentWatch",
    "S3Path",
    "SizePx",
    "StorageError",
    "WorkerCallback",
    "YamlError",
    "atomic_path",
    "check_ranges",
    "configure_storage",
    "data_path",
    "descendants",
    "describe",
    "file_size",
    "finish",
    "finite",
    "forked_children_die_with_me",
    "format_table",
    "from_mapping",
    "gc_frozen_for_fork",
    "is_object_url",
    "is_outage",
    "is_remote",
    "join",
    "listdir",
    "local_file",
    "media_source",
    "member_ref",
    "missing_from_extra",
    "module_argv",
    "open_binary",
    "option",
    "parse_limit_mb",
    "parse_size_px",
    "parse_yaml",
    "prefetch",
    "prime_listing",
    "process_alive",
    "progress_bar",
    "quoted",
    "read_bytes",
    "read_yaml",
    "remove_stale_temps",
    "require_extra",
    "require_stack",
    "s3_client",
    "s3_fetch_stats",
    "s3_upload_file",
    "split_member",
    "stat_key",
    "storage_cache",
    "temp_path",
    "to_mapping",
    "walk",
    "write_atomic",
    "write_json",
]
