"""The overwrite policy of every command that writes a finished artefact, and the directories a
write will create (both on any scheme `etils.epath` opens; a local path never loads TensorFlow).

Imported inside the commands' functions: `--help` and flag errors answer before etils loads.
"""

from __future__ import annotations

import os

from bertjax import errors
from bertjax.runtime import fs


def refuse_existing(path: str, overwrite: bool, flag: str = "--output") -> None:
  """The overwrite policy of every command that writes a finished artefact.

  An existing `path` is refused unless `overwrite`; `path` may be local or any scheme
  `etils.epath` opens (gs://: through TensorFlow's file systems; a local path never loads
  TensorFlow).
  """
  if not overwrite and path and fs.path(path).exists():
    raise errors.OutputExistsError(
        f"{flag} {path} already exists — pass --overwrite to replace it, or choose another {flag}"
    )


def missing_dirs(path, field: str, start=None) -> list:
  """The directories that writing `path` will create, deepest first (walking up from `start`,
  default `path`), as `etils.epath` paths; a `ConfigError` naming `field` and `path` when the
  nearest existing ancestor is a file or cannot be written. On an object store (gs://) the walk
  stops at the bucket, which must exist; whether it can be written only a write can tell."""
  missing, existing = [], fs.path(path if start is None else start)
  local = fs.is_local(existing)
  while not existing.exists() and existing.parent != existing:
    if not local and str(existing.parent).endswith("://"):  # the bucket itself
      raise errors.ConfigError(f"{field} {path}: {existing} does not exist — create it first")
    missing.append(existing)
    existing = existing.parent
  if not existing.is_dir():
    raise errors.ConfigError(
        f"{field} {path}: {existing} is a file, not a directory — choose another {field}"
    )
  # epath has no permission query: a local directory only.
  if local and not os.access(existing, os.W_OK):
    raise errors.ConfigError(f"{field} {path}: {existing} is not writable — choose another {field}")
  return missing
