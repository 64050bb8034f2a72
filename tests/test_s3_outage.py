"""An object store that goes away mid-epoch stops the loader with the store's error, and marks no file bad.

With ``loader.on_bad_sample: skip`` a file that fails to read is left out of this and every later
epoch, and the checkpoint keeps that list. An outage read as bad files emptied the whole dataset,
silently and for good: every file of a bucket whose server was down was "unreadable", skipped, and
the resumed run read nothing. The run happens in a child process, which starts a moto server of
its own and stops it (DALI makes its S3 client once a process, from the first settings it sees).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.live, pytest.mark.timeout(300)]

_RUN = r"""
import json, os, signal, sys
from pathlib import Path
import numpy as np
from PIL import Image
from gpufeed.bench._s3_local import local_s3_server
from gpufeed.config import LoaderConfig
from gpufeed.core import _s3
from gpufeed.core._storage import S3Path
from gpufeed.pipelines import ImageLoader

root = Path(sys.argv[1])
for name in ("cat", "dog"):
    (root / name).mkdir(parents=True)
    for i in range(12):
        Image.fromarray(np.full((20, 24, 3), i * 9, np.uint8)).save(root / name / f"{i}.jpg")

def children():  # the moto server this process started
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == os.getpid():
                yield int(stat.parent.name)
        except (OSError, IndexError, ValueError):
            pass

out = {}
with local_s3_server():
    _s3.client().create_bucket(Bucket="outage")
    for path in sorted(root.rglob("*.jpg")):
        _s3.upload_file(path, S3Path("s3://outage") / path.relative_to(root).as_posix())
    loader = ImageLoader("s3://outage", 4, size_px=16, num_threads=1, device="cpu",
                         loader_cfg=LoaderConfig(on_bad_sample="skip", prefetch_queue_depth=1))
    batches = iter(loader)
    next(batches)
    for pid in list(children()):
        os.kill(pid, signal.SIGKILL)
    try:
        out["more"] = sum(1 for _ in batches)
    except Exception as err:
        out["error"] = f"{type(err).__name__}: {err}"
    out["read_failures"] = loader.state_dict()["read_failures"]
    out["skipped"] = len(loader.skipped)
    loader.close()
print(json.dumps(out))
"""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the server's process in /proc (Linux)")
def test_an_object_store_outage_is_not_a_bad_file(s3_server, tmp_path):
    pytest.importorskip("moto", reason="needs moto[server] (the test extra)")
    done = subprocess.run(
        [sys.executable, "-c", _RUN, str(tmp_path / "data")], capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert "more" not in result, f"the epoch went on without the store: {result}"
    # Our own read of a suspect file names the store; DALI's S3 reader, caught mid-read, its curl error.
    ours = (
        result["error"].startswith("StorageError: s3://outage/")
        and "cannot reach the object store at" in result["error"]
    )
    dali = result["error"].startswith("PipelineError: the pipeline failed at epoch 0") and (
        "a read failed for the machine or the object store, not for a file" in result["error"]
    )
    assert ours or dali, result
    assert result["read_failures"] == [] and result["skipped"] == 0, "no file is marked bad for an outage"
    assert "skipping bad sample" not in done.stderr, done.stderr[-2000:]


@pytest.mark.unit
def test_what_counts_as_an_outage():
    import errno

    from gpufeed.core import OUTAGE_PATTERN, StorageError, is_outage
    from gpufeed.pipelines._errors import likely_cause

    for err in (
        OSError(errno.EMFILE, "Too many open files"),
        StorageError(errno.EHOSTUNREACH, "s3://b/k.jpg: cannot reach the object store at http://127.0.0.1:9"),
        StorageError(errno.EIO, "s3://b/k.jpg: reading failed (SlowDown 503)"),
    ):
        assert is_outage(err) and re.search(OUTAGE_PATTERN, f"encountered: x: unreadable: {err}"), err
    for err in (
        OSError(errno.EIO, "Input/output error"),  # a local disk's: the file's sectors
        OSError(errno.ENOENT, "No such file or directory"),
        StorageError(errno.ENOENT, "s3://b/k.jpg: not found (http://127.0.0.1:9)"),
        ValueError("Too many open files"),
    ):
        assert not is_outage(err), err
    assert not re.search(OUTAGE_PATTERN, "s3://b/k.jpg: reading failed (InvalidRequest 400)")
    assert not re.search(OUTAGE_PATTERN, "cannot be decoded: damaged JPEG data (broken data stream)")
    dali = "S3 Object not found. bucket=bkt object=ds/a.jpg: : curlCode: 28, Timeout was reached; Details: ..."
    assert re.search(OUTAGE_PATTERN, dali), "DALI's own S3 reader (the AWS SDK) after a store stopped answering"
    assert likely_cause("Critical error: [/x.jpg] Too many open files").startswith(
        "a read failed for the machine or the object store, not for a file"
    )
