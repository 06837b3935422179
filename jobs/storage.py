"""Files by URI through pyarrow's filesystems (local paths, s3://, gs://, ...): open, read, checksum,
and credentials kept out of logs; ids hashed for the exactly-once checks of what was written."""

from __future__ import annotations

import errno
import hashlib
import os
import re
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from schemas.errors import UserError
from schemas.tables import SchemaError


def unwritable(err: OSError) -> bool:
    """Whether ``err`` says the place cannot be written here (a read-only mount, no permission)."""
    return err.errno in (errno.EROFS, errno.EACCES, errno.EPERM)


def cannot_write(where, why: str, instead: str) -> UserError:
    """The refusal, in one line, of a job that would have to write ``where`` and cannot (a read-only mount):
    ``why`` it would, and what to do ``instead``."""
    return UserError(f"{where}: this process cannot write there (a read-only mount?), and {why}: {instead}")


def read_only(output: str) -> bool:
    """Whether ``output`` is a local folder this process cannot write (a read-only mount, another's files)."""
    return "://" not in output and os.path.isdir(output) and not os.access(output, os.W_OK)


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    if re.match(r"^[A-Za-z][\w+.-]*://\*\*\*@", uri):  # redact()'s placeholder, read back from a recorded config
        raise UserError(f"{uri}: its credentials were left out where it was recorded (config.yaml, a manifest): "
                        "give the URI with them again, or without the '***@' and with credentials in the "
                        "environment (AWS_ACCESS_KEY_ID, ...)")
    try:
        return pafs.FileSystem.from_uri(uri)
    except (pa.ArrowInvalid, ValueError) as err:
        if "://" not in uri:  # a plain relative path
            return pafs.LocalFileSystem(), uri
        # not a local path either: taken as one, it failed later with a traceback that printed the secret
        raise UserError(f"{redact(uri)}: not a URI pyarrow can open ({str(err).replace(uri, redact(uri))}); "
                        "percent-encode '/', spaces and other reserved characters in keys and secrets") from None


RAY_PACKAGES = ("runtime_resources", "working_dir_files")  # where Ray unpacks a job's uploaded working_dir


def ray_package(cwd: str | None = None) -> str | None:
    """The folder of the unpacked upload a Ray job (`ray job submit --working-dir`) runs in, or None."""
    parts = Path(cwd or os.getcwd()).parts
    for i in range(len(parts) - 2):
        if parts[i:i + 2] == RAY_PACKAGES:
            return str(Path(*parts[:i + 3]))
    return None


def check_kept(output: str, flag: str = "--output") -> None:
    """Refuse a relative local ``output`` in a Ray job's unpacked working_dir: it would be written inside
    Ray's copy of the upload (runtime_resources/working_dir_files/_ray_pkg_<hash>/), lost to the user, and
    a resubmission from a changed checkout (another hash) would start over. Inputs shipped with the job
    are read from there rightly, so only outputs are checked."""
    if "://" in output or os.path.isabs(output):
        return
    package = ray_package()
    if package:
        raise UserError(f"{flag} {output}: a relative path in a Ray job lands in Ray's copy of the uploaded working dir "
                        f"({package}), not where you can keep or resume it; pass an absolute path or a URI (s3://...)")


def scheme_of(uri: str) -> str:
    """``s3://`` of ``s3://bucket/x`` ("" for a local path)."""
    return uri[: uri.index("://") + 3] if "://" in uri else ""


def uri_of(base: str, path: str) -> str:
    """The URI of ``path``, a path on ``filesystem(base)``'s filesystem (a part found under an output
    folder, a file written there): ``base``'s scheme, credentials, host and query around it. From the
    scheme alone, ``key:secret@`` and ``?endpoint_override=`` were lost and the file read elsewhere."""
    if "://" not in base:
        return path
    parts = urlsplit(base)
    userinfo, _, host = parts.netloc.rpartition("@")
    # a bucket store's paths begin with the bucket (s3://b/x -> b/x); a host's do not (hdfs://h:9/x -> /x)
    if path.startswith(host):
        prefix = scheme_of(base) + (f"{userinfo}@" if userinfo else "")
    else:
        prefix = scheme_of(base) + parts.netloc
    # the path as pyarrow gave it, decoded: encoded again (a space, %, ?, # in a key), URI syntax kept
    return prefix + quote(path, safe="/:@!$&'()*+,;=~") + (f"?{parts.query}" if parts.query else "")


def join(uri: str, *names: str) -> str:
    """``uri`` / ``names``, the names put before a URI's query string (``s3://b/out?endpoint_override=x``
    / metrics.json is ``s3://b/out/metrics.json?endpoint_override=x``)."""
    if "://" in uri and (parts := urlsplit(uri)).query:
        return urlunsplit(parts._replace(path="/".join([parts.path.rstrip("/"), *names])))
    return "/".join([uri.rstrip("/"), *names])


def path_of(uri: str) -> str:
    """The path part of a URI (what its file name and suffix are read from), the string itself for a path."""
    return urlsplit(uri).path if "://" in uri else uri


def redact(uri: str) -> str:
    """A URI without credentials (``s3://key:secret@bucket`` -> ``s3://***@bucket``), for logs and manifests."""
    parts = urlsplit(uri)
    if "@" in parts.netloc:
        return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))
    # a secret with an unencoded '/' ends urlsplit's netloc early, at key:part-of-the-secret (a bucket
    # has no ':'): everything to the first '@' goes
    if ":" in parts.netloc and "@" in uri.split("?", 1)[0]:
        return re.sub(r"^([A-Za-z][\w+.-]*://)[^?#@]*@", r"\1***@", uri)
    return uri


_CREDENTIALS = re.compile(r"\b([A-Za-z][\w+.-]*://)[^/\s?#@:]*:[^\s@]*@")


def redact_text(text: str) -> str:
    """``text`` with the credentials of every URI in it replaced (``s3://key:secret@b`` -> ``s3://***@b``):
    an error message may quote a URI anywhere in its words, or a library's."""
    return _CREDENTIALS.sub(r"\1***@", text)


def open_parquet(uri: str) -> pq.ParquetFile:
    fs, path = filesystem(uri)
    try:
        return pq.ParquetFile(fs.open_input_file(path))
    except FileNotFoundError:
        raise SchemaError(f"{redact(uri)}: file not found") from None
    except pa.ArrowInvalid as err:
        raise SchemaError(f"{redact(uri)}: not a readable Parquet file ({err})") from None
    except OSError as err:  # access denied, a network error: the file may be fine
        raise SchemaError(f"{redact(uri)}: cannot be read ({str(err).replace(uri, redact(uri))})") from None


def write_whole(fs, path: str, data: bytes) -> None:
    """``data`` as the file ``path``, written beside it and moved into place: a run killed while writing
    leaves the earlier file whole, never a damaged one."""
    with fs.open_output_stream(f"{path}.tmp") as f:
        f.write(data)
    fs.move(f"{path}.tmp", path)


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


def text_values(column: pa.Array) -> list:
    """A column's values; a string that is not valid UTF-8 (a corpus may hold one: pyarrow's readers do
    not all check) comes back as its bytes, for the build to skip and count, where decoding it raised
    halfway through the build, and again at the same row on every resume."""
    try:
        return column.to_pylist()
    except UnicodeDecodeError:
        values = column.cast(pa.binary()).to_pylist()
    return [v if v is None else _decoded(v) for v in values]


def _decoded(raw: bytes) -> str | bytes:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw
