"""One writer per output directory: a lock file naming who holds it.

Two `bertjax pretrain` runs on one workdir would each write checkpoints, config.json and
metrics.jsonl over the other's (both exiting 0); two `prepare` runs into one directory would mix
their shards. The lock is `DIR/.bertjax.lock`, JSON {host, pid, started, command}, created
atomically (O_EXCL) before anything else is written and removed when the command ends. A lock
left by a process that died (same host, pid gone or reused) is taken over with a message; a
lock held by a live process or by another host is refused with who holds it. Multi-host runs
take it once, on process 0. Object-store paths (gs://) have no atomic create and are not
locked.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

from bertjax import errors

LOCK_NAME = ".bertjax.lock"


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
    self.path = os.path.join(os.path.abspath(directory), name)
    self.command = command
    self.enabled = enabled and "://" not in str(directory)
    self._held = False

  def acquire(self) -> None:
    if not self.enabled:
      return
    os.makedirs(os.path.dirname(self.path), exist_ok=True)
    me = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "start_ticks": _start_ticks(os.getpid()),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": self.command,
    }
    for _ in range(3):
      try:
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
      except FileExistsError:
        holder = self._read()
        if holder is None:  # being written by the other process right now, or empty
          time.sleep(0.2)
          holder = self._read() or {}
        if holder.get("host") == me["host"] and not _alive(holder):
          print(
              f"{self.command}: taking over the stale lock {self.path} of "
              f"{_describe(holder)} (that process is gone)",
              file=sys.stderr,
              flush=True,
          )
          try:
            os.remove(self.path)
          except FileNotFoundError:
            pass
          continue
        where = os.path.dirname(self.path)
        raise WorkdirBusyError(
            f"{where} is in use by {_describe(holder)}; wait for it to finish, use another "
            f"directory, or delete {self.path} if that process is certainly gone"
        )
      with os.fdopen(fd, "w") as f:
        json.dump(me, f)
      self._held = True
      return
    raise WorkdirBusyError(
        f"{self.path}: could not take the lock (another process keeps " "taking it)"
    )

  def _read(self) -> dict | None:
    try:
      with open(self.path) as f:
        return json.loads(f.read() or "null")
    except (OSError, ValueError):
      return None

  def release(self) -> None:
    if self._held:
      self._held = False
      try:
        os.remove(self.path)
      except FileNotFoundError:
        pass

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
