"""Reading the text files users write by hand: list files, ``classes.txt``, quarantine lists.

Windows editors (Notepad, Excel's "CSV UTF-8", PowerShell's ``Out-File -Encoding utf8``) start a
UTF-8 file with a byte-order mark, ``EF BB BF``. Read as plain UTF-8 it becomes a ``\\ufeff``
character glued to the first line: the first list entry named a file that does not exist, and
the first class of a ``classes.txt`` became ``'\\ufeffamber'`` all the way into the checkpoint,
the export and the server's answers. So these files are read with the mark dropped, from a local
disk and from object storage alike (``read_bytes`` serves both).
"""

from __future__ import annotations

import codecs

from gpufeed.core import DataPath

__all__ = ["read_list_text"]


def read_list_text(path: DataPath) -> str:
    """The UTF-8 text of ``path`` (local, or an ``s3://`` key), without a leading byte-order mark.

    Raises:
        OSError: The file cannot be read.
        UnicodeDecodeError: The file is not UTF-8; ``start`` counts bytes from the file's start,
            the mark included, so an error message names the byte a hex viewer shows.
    """
    raw = path.read_bytes()
    mark = len(codecs.BOM_UTF8) if raw.startswith(codecs.BOM_UTF8) else 0
    try:
        return raw[mark:].decode("utf-8")
    except UnicodeDecodeError as err:
        raise UnicodeDecodeError(err.encoding, raw, err.start + mark, err.end + mark, err.reason) from None
