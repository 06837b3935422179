"""Files by URI through pyarrow's filesystems (local paths, s3://, gs://, ...): open, read, checksum,
and credentials kept out of logs; ids hashed for the exactly-once checks of what was written."""

from __future__ import annotations

import hashlib
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from schemas.tables import SchemaError


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    try:
        return pafs.FileSystem.from_uri(uri)
    except (pa.ArrowInvalid, ValueError):  # a plain relative path
        return pafs.LocalFileSystem(), uri


def scheme_of(uri: str) -> str:
    """``s3://`` of ``s3://bucket/x`` ("" for a local path): what turns a path ``filesystem`` returned
    back into a URI."""
    return uri[: uri.index("://") + 3] if "://" in uri else ""


def redact(uri: str) -> str:
    """A URI without credentials (``s3://key:secret@bucket`` -> ``s3://***@bucket``), for logs and manifests."""
    parts = urlsplit(uri)
    if "@" not in parts.netloc:
        return uri
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))


def open_parquet(uri: str) -> pq.ParquetFile:
    fs, path = filesystem(uri)
    try:
        return pq.ParquetFile(fs.open_input_file(path))
    except FileNotFoundError:
        raise SchemaError(f"{redact(uri)}: file not found") from None
    except (pa.ArrowInvalid, OSError) as err:
        raise SchemaError(f"{redact(uri)}: not a readable Parquet file ({err})") from None


def file_sha256(fs, path: str) -> str:
    """sha256 of a file on any pyarrow filesystem, read a MiB at a time."""
    digest = hashlib.sha256()
    with fs.open_input_stream(path) as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def read_table(uri: str, columns: list[str] | None = None) -> pa.Table:
    """The file's table, or those columns of it; a column it lacks is an error here (pyarrow skips it
    silently, and the KeyError came later, from whatever read the row)."""
    pf = open_parquet(uri)
    missing = [c for c in columns or [] if c not in pf.schema_arrow.names]
    if missing:
        raise SchemaError(f"{redact(uri)}: no column {missing} (it has {pf.schema_arrow.names})")
    return pf.read(columns=columns)


def hash_ids(ids) -> np.ndarray:
    """Stable 64-bit hashes of ids (the same in every process), for exactly-once checks."""
    return pd.util.hash_array(np.asarray(ids, dtype=object))
