"""The one contract for mistakes in what a user asked for.

Every error a user can fix (a flag, a config field, a path, a malformed input file, a checkpoint
that does not match its config) is a `UserError`. `bertjax.cli` catches `UserError` and the flag
parsers' errors and nothing else: it prints one line, `bertjax COMMAND: what is wrong — how to fix
it`, and exits 2. Any other exception is a bug and keeps its traceback (exit 1). Library code
raises these in config terms (`config.train.steps=0 must be >= 1`); commands translate them to
flags where the flag is the user's word for it.

The subclasses mix in the built-in type code already catches (`ValueError`, `FileNotFoundError`,
`FileExistsError`), so `except ValueError` around a library call keeps working.
"""

from __future__ import annotations


class UserError(Exception):
  """A mistake the user can fix; its message names the field or path and the fix."""


class ConfigError(UserError, ValueError):
  """A flag, config field or value that is out of range, of the wrong type or unknown."""


class InputNotFoundError(UserError, FileNotFoundError):
  """A path the user named does not exist (or holds none of the files it should)."""

  def __str__(self) -> str:  # OSError's str() would render (errno, strerror) pairs
    return str(self.args[0]) if len(self.args) == 1 else super().__str__()


class OutputExistsError(UserError, FileExistsError):
  """A finished artefact would be overwritten; `--overwrite` replaces it."""

  def __str__(self) -> str:
    return str(self.args[0]) if len(self.args) == 1 else super().__str__()


class BadInputError(UserError, ValueError):
  """An input file that cannot be read as what it claims to be (TSV, JSON, CoNLL, checkpoint)."""


class UsageError(UserError):
  """The command line itself does not parse (unknown flag, missing value, wrong type)."""


def refuse_existing(path: str, overwrite: bool, flag: str = "--output") -> None:
  """The overwrite policy of every command that writes a finished artefact.

  An existing `path` is refused unless `overwrite`; `path` may be local or any scheme
  `etils.epath` opens (gs://: through TensorFlow's file systems; a local path never loads
  TensorFlow).
  """
  from bertjax.runtime import fs  # here: `--help` and flag errors answer before etils loads

  if not overwrite and path and fs.path(path).exists():
    raise OutputExistsError(
        f"{flag} {path} already exists — pass --overwrite to replace it, or choose another {flag}"
    )


def missing_dirs(path, field: str, start=None) -> list:
  """The directories that writing `path` will create, deepest first (walking up from `start`,
  default `path`), as `etils.epath` paths; a `ConfigError` naming `field` and `path` when the
  nearest existing ancestor is a file or cannot be written. On an object store (gs://) the walk
  stops at the bucket, which must exist; whether it can be written only a write can tell."""
  import os

  from bertjax.runtime import fs

  missing, existing = [], fs.path(path if start is None else start)
  local = fs.is_local(existing)
  while not existing.exists() and existing.parent != existing:
    if not local and str(existing.parent).endswith("://"):  # the bucket itself
      raise ConfigError(f"{field} {path}: {existing} does not exist — create it first")
    missing.append(existing)
    existing = existing.parent
  if not existing.is_dir():
    raise ConfigError(
        f"{field} {path}: {existing} is a file, not a directory — choose another {field}"
    )
  # epath has no permission query: a local directory only.
  if local and not os.access(existing, os.W_OK):
    raise ConfigError(f"{field} {path}: {existing} is not writable — choose another {field}")
  return missing
