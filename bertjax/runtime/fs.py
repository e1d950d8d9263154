"""One file API for every path a user passes: `etils.epath`.

Data, tokenizers, workdirs, checkpoints, `--init` directories and outputs are opened as
`epath.Path(p)`: local paths go through Python's own file calls (no TensorFlow import), any
other scheme (`gs://`, `s3://`, ...) through TensorFlow's file systems (`tf.io.gfile`), the
same ones tf.data reads with and orbax writes with. This module holds only what epath lacks:
telling local from remote, making a local path absolute, atomic writes, text with Python's
newline and error handling, and a local copy for libraries that read only local files
(sentencepiece, safetensors, transformers).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tempfile
from typing import IO, Iterator

from etils import epath

PathLike = str | os.PathLike


def is_local(path: PathLike) -> bool:
  """True for a local file system path, False for `scheme://...`."""
  return "://" not in os.fspath(path)


def path(p: PathLike) -> epath.Path:
  """`p` as an epath.Path; a local `~` is expanded."""
  p = os.fspath(p)
  return epath.Path(os.path.expanduser(p) if is_local(p) else p)


def absolute(p: PathLike) -> epath.Path:
  """`p` made absolute when it is local (orbax mis-reads relative paths); remote stays."""
  p = os.fspath(p)
  return epath.Path(os.path.abspath(os.path.expanduser(p)) if is_local(p) else p)


def write_atomic(p: PathLike, data: str | bytes) -> None:
  """`p` holds `data` (text as UTF-8) whole or keeps what it held: a local file is written
  beside and renamed over, with the mode it had (new: the umask's); an object store publishes
  an object only when its upload completes."""
  target = path(p)
  if isinstance(data, str):
    data = data.encode("utf-8")
  if not is_local(target):
    with target.open("wb") as f:
      f.write(data)
    return
  fd, tmp = tempfile.mkstemp(dir=os.fspath(target.parent), prefix=f".{target.name}.")
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
    os.chmod(tmp, _mode(target))  # mkstemp makes 0600; keep what a plain write would give
    os.replace(tmp, target)
  except BaseException:
    with contextlib.suppress(OSError):
      os.unlink(tmp)
    raise


def _mode(target: epath.Path) -> int:
  try:
    return os.stat(target).st_mode & 0o777
  except FileNotFoundError:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


class _Readable(io.RawIOBase):
  """A file object with only `read` (TensorFlow's GFile) as a raw stream, for io's buffers."""

  def __init__(self, f):
    self._f = f

  def readable(self) -> bool:
    return True

  def readinto(self, b) -> int:
    data = self._f.read(len(b))
    b[: len(data)] = data
    return len(data)


@contextlib.contextmanager
def open_text(
    p: PathLike, encoding: str = "utf-8", newline: str | None = None, errors: str = "replace"
) -> Iterator[IO[str]]:
  """`p` as text, undecodable bytes as U+FFFD, read as `open(p, encoding=encoding,
  errors="replace", newline=newline)` reads a local file (newline "": line endings kept and
  lone "\r" ending a line), on every scheme: the bytes are decoded here, since epath's `open`
  takes neither argument and TensorFlow's files drop "\r" from the lines they return.
  `errors="surrogateescape"` keeps undecodable bytes as U+DC80..U+DCFF instead, for readers
  that count them."""
  with path(p).open("rb") as raw:
    buffered = raw if isinstance(raw, io.BufferedIOBase) else io.BufferedReader(_Readable(raw))
    f = io.TextIOWrapper(buffered, encoding=encoding, errors=errors, newline=newline)
    try:
      yield f
    finally:
      f.detach()  # `raw` is closed by its own context


@contextlib.contextmanager
def local_copy(p: PathLike) -> Iterator[str]:
  """A local file or directory with `p`'s contents for the block: `p` itself when local, else a
  temporary copy (a directory is copied whole, one level of files and their subdirectories)."""
  if is_local(p):
    yield os.fspath(path(p))
    return
  src = path(p)
  with tempfile.TemporaryDirectory(prefix="bertjax-") as tmp:
    dst = epath.Path(tmp) / src.name
    if src.is_dir():
      _copy_tree(src, dst)
    else:
      src.copy(dst)
    yield os.fspath(dst)


def _copy_tree(src: epath.Path, dst: epath.Path) -> None:
  dst.mkdir(parents=True, exist_ok=True)
  for child in src.iterdir():
    if child.is_dir():
      _copy_tree(child, dst / child.name)
    else:
      child.copy(dst / child.name)


def upload_tree(local: PathLike, dst: PathLike) -> None:
  """Copy the local directory `local` to `dst` (any scheme), file by file."""
  if is_local(dst):
    shutil.copytree(local, path(dst), dirs_exist_ok=True)
    return
  _copy_tree(epath.Path(local), path(dst))
