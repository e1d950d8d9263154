"""One writer per output directory: a lock file naming who holds it.

Two `bertjax pretrain` runs on one workdir would each write checkpoints, config.json and
metrics.jsonl over the other's (both exiting 0); two `prepare` runs into one directory would mix
their shards. The lock is `DIR/.bertjax.lock`, JSON {host, pid, started, command}, created
atomically before anything else is written and removed when the command ends. A lock left by a
process that died (same host, pid gone or reused) is taken over with a message; a lock held by
a live process or by another host is refused with who holds it. Multi-host runs take it once,
on process 0.

Local directories: the file is created with O_EXCL. Object stores (gs://, s3://): the object
is created with a write conditioned on its absence (tensorstore's conditional write, on GCS an
`ifGenerationMatch=0` precondition), so of two runs starting at once exactly one gets it; a
takeover is a write conditioned on the generation of the lock that was read, and the release
deletes the object only while it is still the holder's. A machine that dies leaves its lock
behind, and a rerun usually starts on another machine (a preempted VM), which cannot check the
holder's pid: so the holder rewrites the object every `RENEW_S` seconds (`renewed`, epoch
seconds), and a lock not rewritten for `STALE_S` seconds is taken over from any host. A scheme
tensorstore cannot open is not locked (with a warning).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time

from bertjax import errors
from bertjax.runtime import fs

LOCK_NAME = ".bertjax.lock"
RENEW_S = 60.0  # an object-store lock is rewritten this often while held,
STALE_S = 600.0  # and taken over from any host once not rewritten for this long


class WorkdirBusyError(errors.UserError, ValueError):
  """Another live process holds the directory's lock."""


def _start_ticks(pid: int) -> str | None:
  """The process's start time in clock ticks since boot (Linux), to tell a reused pid apart."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rpartition(")")[2].split()[19]
  except (OSError, IndexError):
    return None


def _alive(holder: dict) -> bool:
  pid = int(holder.get("pid", -1))
  if pid <= 0:
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # exists, owned by someone else
    return True
  ticks = holder.get("start_ticks")
  return ticks is None or _start_ticks(pid) in (None, ticks)


class Lock:
  """`with Lock(directory, "bertjax pretrain"):` holds `directory`'s lock for the block."""

  def __init__(self, directory: str, command: str, enabled: bool = True, name: str = LOCK_NAME):
    self.local = fs.is_local(directory)
    # An object store's directory is a URL prefix that tensorstore opens, not an epath.Path.
    self.directory = str(fs.absolute(directory)) if self.local else str(directory).rstrip("/")
    self.name = name
    self.path = (
        f"{self.directory}/{name}" if not self.local else str(fs.path(self.directory) / name)
    )
    self.command = command
    self.enabled = enabled
    self._held = False
    self._store = None  # object stores: the tensorstore KvStore of `directory`
    self._generation = None  # and the generation of the lock object this process wrote
    self._stop = threading.Event()
    self._renewer: threading.Thread | None = None

  def _me(self) -> dict:
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "start_ticks": _start_ticks(os.getpid()),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": self.command,
    }

  def _busy(self, holder: dict, extra: str = "") -> WorkdirBusyError:
    return WorkdirBusyError(
        f"{self.directory} is in use by {_describe(holder)}; wait for it to finish, use another "
        f"directory, or delete {self.path} if that process is certainly gone{extra}"
    )

  def _taking_over(self, holder: dict, why: str = "that process is gone") -> None:
    print(
        f"{self.command}: taking over the stale lock {self.path} of {_describe(holder)} ({why})",
        file=sys.stderr,
        flush=True,
    )

  def acquire(self) -> None:
    if not self.enabled:
      return
    if self.local:
      self._acquire_local()
    else:
      self._acquire_remote()

  # ------------------------------------------------------------------------------ local: O_EXCL

  def _acquire_local(self) -> None:
    fs.path(self.directory).mkdir(parents=True, exist_ok=True)
    me = self._me()
    for _ in range(3):
      try:
        # epath has no exclusive create: O_EXCL is the lock itself (local paths only).
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
      except FileExistsError:
        holder = self._read()
        if holder is None:  # being written by the other process right now, or empty
          time.sleep(0.2)
          holder = self._read() or {}
        if holder.get("host") == me["host"] and not _alive(holder):
          self._taking_over(holder)
          fs.path(self.path).unlink(missing_ok=True)
          continue
        raise self._busy(holder)
      with os.fdopen(fd, "w") as f:
        json.dump(me, f)
      self._held = True
      return
    raise WorkdirBusyError(
        f"{self.path}: could not take the lock (another process keeps " "taking it)"
    )

  def _read(self) -> dict | None:
    try:
      return json.loads(fs.path(self.path).read_text() or "null")
    except (OSError, ValueError):
      return None

  # ------------------------------------------------------------ object stores: conditional write

  def _open_store(self):
    """The directory as a tensorstore KvStore, or None (with a warning) for a scheme it lacks."""
    import tensorstore as ts  # orbax's own storage layer; only for object-store directories

    try:
      return ts.KvStore.open(self.directory + "/").result()
    except ValueError as e:  # "unsupported URL scheme"
      print(
          f"{self.command}: warning: {self.directory} is not locked: {e}; make sure no other "
          "run writes there",
          file=sys.stderr,
          flush=True,
      )
      return None

  def _acquire_remote(self) -> None:
    store = self._open_store()
    if store is None:
      return
    me = self._me()
    for _ in range(3):
      found = store.read(self.name).result()
      if found.state == "value":
        try:
          holder = json.loads(bytes(found.value).decode())
          holder = holder if isinstance(holder, dict) else {}
        except ValueError:
          holder = {}
        try:
          age = time.time() - float(holder["renewed"])
        except (KeyError, TypeError, ValueError):
          age = None  # never renewed: not taken over for its age
        if holder.get("host") == me["host"] and not _alive(holder):
          self._taking_over(holder)
        elif age is not None and age > STALE_S:
          self._taking_over(holder, f"not renewed for {age / 60:.0f} min: its machine is gone")
        else:
          renewed = f", renewed {age:.0f}s ago" if age is not None else ""
          raise self._busy(
              holder,
              f" (a lock not renewed for {STALE_S / 60:.0f} minutes is taken over{renewed})",
          )
      # Absent (the NoValue generation) or the stale lock just read: written only if unchanged.
      written = store.write(
          self.name, json.dumps(dict(me, renewed=time.time())), if_equal=found.stamp.generation
      ).result()
      if written.generation:  # empty: the condition failed, another process wrote it first
        self._store, self._generation, self._me_written = store, written.generation, me
        self._held = True
        self._stop.clear()
        self._renewer = threading.Thread(target=self._renew, name="bertjax-lock", daemon=True)
        self._renewer.start()
        return
    raise WorkdirBusyError(
        f"{self.path}: could not take the lock (another process keeps " "taking it)"
    )

  def _renew(self) -> None:
    while not self._stop.wait(RENEW_S):
      try:
        written = self._store.write(
            self.name,
            json.dumps(dict(self._me_written, renewed=time.time())),
            if_equal=self._generation,
        ).result()
      except Exception as e:  # noqa: BLE001  (a network error: try again at the next round)
        print(f"{self.command}: warning: could not renew {self.path}: {e}", file=sys.stderr)
        continue
      if not written.generation:
        print(
            f"{self.command}: warning: {self.path} was taken over by another process; this run "
            "no longer holds the directory",
            file=sys.stderr,
            flush=True,
        )
        self._held = False
        return
      self._generation = written.generation

  def _release_remote(self) -> None:
    self._stop.set()
    if self._renewer is not None:
      self._renewer.join()
      self._renewer = None
    if not self._held:  # taken over meanwhile: the lock is someone else's now
      return
    self._held = False
    try:  # deleted only if it is still the one this process wrote
      self._store.write(self.name, None, if_equal=self._generation).result()
    except Exception as e:  # noqa: BLE001
      print(
          f"{self.command}: warning: could not remove the lock {self.path} ({e}); delete it "
          "before the next run",
          file=sys.stderr,
          flush=True,
      )

  # ----------------------------------------------------------------------------------------

  def release(self) -> None:
    if not self.local and self._store is not None:
      self._release_remote()
      return
    if self._held:
      self._held = False
      fs.path(self.path).unlink(missing_ok=True)

  def __enter__(self) -> "Lock":
    self.acquire()
    return self

  def __exit__(self, *exc) -> None:
    self.release()


def _describe(holder: dict) -> str:
  if not holder:
    return "another process (lock file unreadable)"
  return (
      f"`{holder.get('command', '?')}` (pid {holder.get('pid', '?')} on "
      f"{holder.get('host', '?')}, started {holder.get('started', '?')})"
  )
