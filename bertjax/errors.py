"""The one contract for mistakes in what a user asked for.

Every error a user can fix (a flag, a config field, a path, a malformed input file, a checkpoint
that does not match its config) is a `UserError`. `bertjax.cli` catches `UserError` and the flag
parsers' errors and nothing else: it prints one line, `bertjax COMMAND: what is wrong — how to fix
it`, and exits 2. Any other exception is a bug and keeps its traceback (exit 1). Library code
raises these in config terms (`config.train.steps=0 must be >= 1`); commands translate them to
flags where the flag is the user's word for it.

The subclasses mix in the built-in type code already catches (`ValueError`, `FileNotFoundError`,
`FileExistsError`), so `except ValueError` around a library call keeps working. This module
imports nothing of bertjax; the overwrite policy that raises `OutputExistsError` is
`bertjax.runtime.outputs`.
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
