"""Errors raised by gpufeed's data pipelines. Every message names the file and what is wrong.

Two kinds of pipeline failure are kept apart: :class:`BadSampleError` when files are proven bad
(named in DALI's message, or failing a decode outside DALI), :class:`PipelineError` when no file
is to blame (a crop window the decoded image does not contain, a worker process that died, fork
after CUDA, out of memory). Skipping files (``loader.on_bad_sample: skip``) only ever applies to
the first kind.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from gpufeed.core import OUTAGE_PATTERN

__all__ = ["BAD_FILE_HINT", "BadSampleError", "DatasetError", "PipelineError", "dali_reason", "likely_cause"]

# What to do about bad files, appended to the errors that name them.
BAD_FILE_HINT = (
    "Run 'gpufeed check' for the full list; then leave them out with loader.quarantine_file "
    "('gpufeed check --quarantine' writes one), or set loader.on_bad_sample: skip."
)

# Lines DALI appends after the real error, or wraps around it: never the reason.
_NOISE = re.compile(
    r"^(Current pipeline object is no longer valid\.?|Critical error in pipeline:?|C\+\+ context: .*"
    r"|Stacktrace \(\d+ entries\):?|\[frame \d+\].*|Exception traceback received from worker thread:?"
    r"|Traceback \(most recent call last\):|The above exception was the direct cause.*)$"
)

# (pattern in DALI's message, what most likely happened and what to do), first match wins.
_CAUSES = (
    (
        OUTAGE_PATTERN,
        "a read failed for the machine or the object store, not for a file (out of file handles or "
        "memory, the store unreachable or failing): no file was marked bad; resume from the last "
        "checkpoint once it is back.",
    ),
    (
        r"cropping window .* is not valid for image dimensions",
        "the crop window was computed for a different image size than the decoder produced: the "
        "dataset index disagrees with the decoded image (an EXIF-rotated photo, or a file replaced after "
        "indexing). Re-index the data (delete its .gpufeed/ folder) and run 'gpufeed check'.",
    ),
    (
        r"Cannot fork a process when the CUDA has been initialized",
        "the PyAV worker processes were forked after CUDA was initialised in this process; set "
        "loader.worker_start_method: spawn (auto does so when it sees CUDA initialised).",
    ),
    (
        r"Worker data receiving interrupted|exited unexpectedly|Workers initialization failed",
        "a worker process of the parallel external source died (killed, often by the kernel's "
        "out-of-memory killer; see dmesg) or could not start; lower loader.num_threads or the batch size, "
        "or give the machine more memory or shared memory (/dev/shm).",
    ),
    (
        r"out of memory|cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY|std::bad_alloc",
        "memory ran out (GPU or host); lower loader.batch_size or loader.prefetch_queue_depth.",
    ),
    (
        r"CUDA error|cudaError|CUDA_ERROR|NVDEC|nvjpeg|nvJPEG",
        "a CUDA or GPU decoder error; check the driver ('nvidia-smi'), and that nothing else holds the GPU.",
    ),
)


def dali_reason(message: str) -> str:
    """The meaningful part of a DALI (or worker) error message.

    DALI reports "Critical error in pipeline: ... encountered: <the error> C++ context ... Current
    pipeline object is no longer valid."; a worker's error ends with its traceback's last line.
    Returns the error itself, without the wrapping and the trailing boilerplate.
    """
    text = message.strip()
    if "encountered:" in text:
        text = text.rsplit("encountered:", 1)[1]
    lines = [line.strip() for line in text.splitlines()]
    kept = [line for line in lines if line and not _NOISE.match(line) and not line.startswith(("File ", "^"))]
    if not kept:
        return text.strip().splitlines()[-1] if text.strip() else message
    if "Traceback (most recent call last)" in message:
        return kept[-1]  # a Python worker: its exception is the last line of its traceback
    return " ".join(kept[:3])


def likely_cause(message: str) -> str:
    """What most likely caused a pipeline failure that no file is to blame for."""
    for pattern, cause in _CAUSES:
        if re.search(pattern, message, flags=re.IGNORECASE):
            return cause
    return (
        "not tied to a file: every file of the batches DALI was working on decodes outside DALI. "
        "This is an environment or pipeline problem, not bad data."
    )


class DatasetError(ValueError):
    """The dataset is missing, empty or cannot be indexed (the message says which and where)."""


class BadSampleError(RuntimeError):
    """A sample failed to decode inside a pipeline.

    Attributes:
        problems: ``(path, reason)`` for each file found to be bad.
    """

    def __init__(self, problems: list[tuple[str, str]], detail: str = "") -> None:
        self.problems = problems
        listed = "; ".join(f"{path}: {reason}" for path, reason in problems[:10])
        more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
        super().__init__(f"bad sample in the pipeline: {listed}{more}. {BAD_FILE_HINT}{detail}")


class PipelineError(RuntimeError):
    """The pipeline failed and no file is to blame: skipping files cannot help.

    Attributes:
        reason: DALI's (or the worker's) own error, the first one raised.
        cause: What most likely happened and what to do.
        dali_message: DALI's full original message.
        checked: The files that were decoded outside DALI and found good.
    """

    def __init__(self, dali_message: str, *, checked: Sequence[str] = (), where: str = "") -> None:
        self.dali_message = dali_message
        self.reason = dali_reason(dali_message)
        self.cause = likely_cause(dali_message)
        self.checked = list(checked)
        files = f" {len(self.checked)} file(s) of the failing batches decode fine outside DALI." if checked else ""
        super().__init__(f"the pipeline failed{where}: {self.reason}. Likely cause: {self.cause}{files}")
