"""Weight files read as snapshots: bytes copied into memory, never memory-mapped, and written by atomic replacement.

`FileSnapshot(path)` opens a file once and records its identity (st_dev, st_ino, st_size, st_mtime_ns); `read(offset,
nbytes)` returns an owned uint8 numpy array of those bytes and raises FileChangedError (naming the file) when the
open file's identity moved or the bytes are not all there. A file rewritten, truncated or deleted later can therefore
neither change a loaded Tensor nor kill the process with SIGBUS, as a memory map read at realize would.
`atomic_write(path)` yields a temporary file in the same folder and moves it over `path` with os.replace when the block
ends, so a reader holding the old file (open or mapped) keeps the old, complete bytes.
"""
from __future__ import annotations
import contextlib, os, secrets
from dataclasses import dataclass
from typing import BinaryIO, Iterator
import numpy as np

# Linux returns at most this many bytes from one read (0x7ffff000, read(2)); larger reads are issued in pieces.
MAX_READ_BYTES = 0x7FFFF000
NEW_FILE_MODE = 0o666        # what open(path, 'wb') asks for; the umask takes its part off
TEMP_NAME_BYTES = 8          # random bytes in a temporary file's name (with the pid: unique among writers)

class FileChangedError(OSError):
  """A file changed (rewritten, truncated, replaced in place) while it was being read: the message names it."""

@dataclass(frozen=True)
class FileIdentity:
  """What says 'the same file with the same bytes' without reading them: device, inode, size, modification time."""
  device: int
  inode: int
  size: int
  mtime_ns: int
  @staticmethod
  def of(stat: os.stat_result) -> FileIdentity:
    return FileIdentity(stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)

class FileSnapshot:
  """One open file, read by explicit copies that are checked against the identity recorded when it was opened.
  Use as a context manager (or call close()); the reads stay valid after closing."""
  def __init__(self, path: str):
    self.path = os.fspath(path)
    self.fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try: self.identity = FileIdentity.of(os.fstat(self.fd))
    except OSError:
      os.close(self.fd)
      raise

  @property
  def size(self) -> int: return self.identity.size

  def check(self) -> None:
    """Raise FileChangedError if the open file is no longer the one recorded (written to or truncated in place)."""
    now = FileIdentity.of(os.fstat(self.fd))
    if now != self.identity:
      raise FileChangedError(f"{self.path}: the file changed while it was being read (opened as {self.identity}, "
                             f"now {now}); load it again")

  def read(self, offset: int, nbytes: int) -> np.ndarray:
    """bytes [offset, offset + nbytes) as a new uint8 array (memory this process owns)."""
    if offset < 0 or nbytes < 0 or offset + nbytes > self.size:
      raise ValueError(f"{self.path}: read of {nbytes} bytes at offset {offset} is outside the {self.size}-byte file")
    out = np.empty(nbytes, dtype=np.uint8)
    view, done = memoryview(out), 0
    while done < nbytes:
      got = os.preadv(self.fd, [view[done:done + min(nbytes - done, MAX_READ_BYTES)]], offset + done)
      if got == 0:
        raise FileChangedError(f"{self.path}: the file ended at byte {offset + done}, but it had {self.size} bytes "
                               "when it was opened (truncated while being read); load it again")
      done += got
    self.check()   # a write during the read moves the modification time: the bytes could be a mix of two versions
    return out

  def close(self) -> None:
    if self.fd >= 0:
      os.close(self.fd)
      self.fd = -1
  def __enter__(self) -> FileSnapshot: return self
  def __exit__(self, *exc) -> None: self.close()

@contextlib.contextmanager
def atomic_write(path: str) -> Iterator[BinaryIO]:
  """A binary file to write `path`'s new contents into; it replaces `path` only when the block ends without an
  exception (else it is removed and `path` is untouched). Atomic for readers, not a durability promise: nothing is
  fsync'd (a power loss right after may leave the old contents)."""
  path = os.fspath(path)
  folder, name = os.path.split(os.path.abspath(path))
  temporary = os.path.join(folder, f".{name}.{os.getpid()}.{secrets.token_hex(TEMP_NAME_BYTES)}.tmp")
  # O_EXCL: never write through someone else's file; mode 0o666 less the umask, as open() would give `path` itself
  fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), NEW_FILE_MODE)
  try:
    with os.fdopen(fd, "wb") as f: yield f
    os.replace(temporary, path)
  except BaseException:
    with contextlib.suppress(FileNotFoundError): os.remove(temporary)
    raise
