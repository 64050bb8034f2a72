"""Whether a failed read says the file is bad, or that the machine or the store failed for now.

A loader that skips bad files (``loader.on_bad_sample: skip``) records them in its state, which
checkpoints keep: a file skipped for an object store that could not be reached, or for a process
out of file handles, would be left out of every epoch after the resume too. Such failures are the
environment's: they stop the read with the error itself, never as the file's fault.
"""

from __future__ import annotations

import errno
import os
import re

from gpufeed.core._s3 import StorageError

__all__ = ["OUTAGE_PATTERN", "is_outage"]

# The machine's or the network's: the same read may well pass in a minute.
_OUTAGE_ERRNOS = frozenset(
    {
        errno.EMFILE,  # too many open files (this process)
        errno.ENFILE,  # too many open files (the system)
        errno.ENOMEM,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.ETIMEDOUT,
    }
)


def is_outage(err: BaseException) -> bool:
    """True when ``err`` says the environment failed, not the file.

    An object store's server-side error (an HTTP 5xx, a body cut mid-stream after retries) counts:
    the object itself answered before. A local disk's ``EIO`` does not: it is the file's sectors.
    """
    if not isinstance(err, OSError):
        return False
    if err.errno in _OUTAGE_ERRNOS:
        return True
    return isinstance(err, StorageError) and err.errno == errno.EIO


# The same failures in a message that only carries their text (DALI's, from a reader inside it):
# the OS's words for the errnos above, and the object-store lines of gpufeed.core._s3.
OUTAGE_PATTERN = "|".join(
    [
        *(re.escape(os.strerror(code)) for code in sorted(_OUTAGE_ERRNOS)),
        r"cannot reach the object store",
        r"curlCode: \d+|Timeout was reached|Couldn't connect to server",  # DALI's S3 reader (the AWS SDK's curl)
        r"reading s3:// needs boto3",
        r"s3://\S+: [\w ]+ failed \((?:HTTP|\w+) 5\d\d\)",  # a server error, after botocore's retries
        r"s3://\S+: [\w ]+ failed \(\w+(?:Error|Exception)\)",
        r"s3://\S+: reading failed \(the body ended after",
    ]
)
