"""The flag parser every argparse command uses: one help style, one way to fail.

`ArgumentParser` raises `bertjax.errors.UsageError` instead of printing usage and exiting, so a
mistyped flag ends like every other user mistake: one line `bertjax COMMAND: ...`, exit 2.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import re
from typing import Callable

from bertjax import errors


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
  """Help of every argparse command: the description as written, each option's default.

  A default is appended as `(default: X)` unless the help mentions it already, the option is
  required, or the default is None/False/"" (nothing to say).
  """

  def add_argument(self, action):
    default = action.default
    if (
        action.help is not argparse.SUPPRESS
        and action.option_strings
        and not action.required
        and default is not argparse.SUPPRESS
        and default is not None
        and default is not False
        and default != ""
        and "default" not in (action.help or "")
    ):
      action = copy.copy(action)
      action.help = f"{action.help or ''} (default: %(default)s)".strip()
    super().add_argument(action)


class ArgumentParser(argparse.ArgumentParser):
  """argparse with `HelpFormatter` and errors raised as `UsageError` (one line, exit 2)."""

  def __init__(self, *args, **kwargs):
    kwargs.setdefault("formatter_class", HelpFormatter)
    super().__init__(*args, **kwargs)

  def error(self, message: str):
    # `prog` is "bertjax COMMAND [SUB]"; the CLI adds the "bertjax COMMAND: " prefix itself.
    sub = self.prog.split()[2:]
    where = f"{' '.join(sub)}: " if sub else ""
    raise errors.UsageError(f"{where}{message} — see `{self.prog} --help`")


def positive_int(text: str) -> int:
  """argparse type: an integer >= 1."""
  return _bounded(text, int, 1, ">= 1")


def nonneg_int(text: str) -> int:
  """argparse type: an integer >= 0."""
  return _bounded(text, int, 0, ">= 0")


def positive_float(text: str) -> float:
  """argparse type: a finite number > 0."""
  value = _number(text, float)
  if not value > 0 or value != value or value == float("inf"):
    raise argparse.ArgumentTypeError(f"{text!r} must be a finite number > 0")
  return value


def fraction(text: str) -> float:
  """argparse type: a number in [0, 1]."""
  value = _number(text, float)
  if not 0.0 <= value <= 1.0:
    raise argparse.ArgumentTypeError(f"{text!r} must be between 0 and 1")
  return value


def open_fraction(text: str) -> float:
  """argparse type: a number in [0, 1)."""
  value = _number(text, float)
  if not 0.0 <= value < 1.0:
    raise argparse.ArgumentTypeError(f"{text!r} must be >= 0 and < 1")
  return value


def nonneg_float(text: str) -> float:
  """argparse type: a finite number >= 0."""
  value = _number(text, float)
  if not 0.0 <= value < float("inf"):
    raise argparse.ArgumentTypeError(f"{text!r} must be a finite number >= 0")
  return value


def finite_float(text: str) -> float:
  """argparse type: any finite number."""
  value = _number(text, float)
  if not abs(value) < float("inf"):
    raise argparse.ArgumentTypeError(f"{text!r} must be a finite number")
  return value


def int_at_least(low: int, why: str) -> Callable[[str], int]:
  """argparse type: an integer >= `low`; `why` says what needs that many."""

  def parse(text: str) -> int:
    value = _number(text, int)
    if value < low:
      raise argparse.ArgumentTypeError(f"{text!r} must be >= {low} ({why})")
    return value

  return parse


def _number(text: str, kind):
  try:
    return kind(text)
  except ValueError:
    name = "an integer" if kind is int else "a number"
    raise argparse.ArgumentTypeError(f"{text!r} is not {name}") from None


def _bounded(text: str, kind, low, rule: str):
  value = _number(text, kind)
  if value < low:
    raise argparse.ArgumentTypeError(f"{text!r} must be {rule}")
  return value


MESH_AXES = ("data", "fsdp", "tensor")


def parse_mesh(text: str, flag: str = "--mesh") -> dict[str, int]:
  """`--mesh` in its one spelling, `data=1,fsdp=-1,tensor=1` (axes left out are absent; one may
  be -1: the devices left), or the older positional `1,-1,1` (data, fsdp, tensor)."""
  parts = [p.strip() for p in (text or "").split(",") if p.strip()]
  if parts and all("=" not in p for p in parts):  # the positional alias
    if len(parts) != len(MESH_AXES):
      raise errors.ConfigError(
          f"{flag} {text}: the positional form takes 3 sizes (data,fsdp,tensor) — write e.g. "
          f"{flag} data=1,fsdp=-1,tensor=1"
      )
    parts = [f"{a}={p}" for a, p in zip(MESH_AXES, parts)]
  out: dict[str, int] = {}
  for part in parts:
    name, _, value = part.partition("=")
    name = name.strip()
    if name not in MESH_AXES:
      raise errors.ConfigError(
          f"{flag} {text}: unknown axis {name!r} — valid axes: {', '.join(MESH_AXES)}"
      )
    try:
      size = int(value)
    except ValueError:
      raise errors.ConfigError(
          f"{flag} {text}: {name}={value.strip()!r} is not an integer — write e.g. "
          f"{flag} data=4,fsdp=2 (-1 fills the devices left)"
      ) from None
    if size == 0 or size < -1:
      raise errors.ConfigError(
          f"{flag} {text}: {name}={size} — each axis is >= 1, or -1 for the devices left"
      )
    out[name] = size
  if list(out.values()).count(-1) > 1:
    raise errors.ConfigError(f"{flag} {text}: at most one axis may be -1")
  return out


# ----------------------------------------------------------------- library words to flags


def flag_names(
    parser: argparse.ArgumentParser, prefix: str, renames: dict[str, str] | None = None
) -> dict[str, str]:
  """{library word: flag} for `reword`: `PREFIX.field=` -> `--flag `, `PREFIX.field` ->
  `--flag`, and `PREFIX.field=True` -> `--flag` for a switch. `renames`: {dest: field} where
  they differ (dest "input" for the field "inputs")."""
  out = {}
  for action in parser._actions:
    if not action.option_strings or action.dest == "help":
      continue
    flag = max(action.option_strings, key=len)
    field = f"{prefix}.{(renames or {}).get(action.dest, action.dest)}"
    if isinstance(action, argparse._StoreTrueAction):
      out[f"{field}=True"] = flag
    out[f"{field}="] = f"{flag} "
    out[field] = flag
  return out


def reword(error: errors.UserError, names: dict[str, str]) -> errors.UserError:
  """The library's error in the command line's words: config fields become their flags."""
  message = str(error)
  pattern = "|".join(re.escape(k) for k in sorted(names, key=len, reverse=True))
  if names and re.search(pattern, message):
    error.args = (re.sub(pattern, lambda m: names[m.group(0)], message),)
  return error


@contextlib.contextmanager
def in_flag_words(names: dict[str, str]):
  """Re-raises a library `UserError` with its field names as the flags the user typed."""
  try:
    yield
  except errors.UserError as e:
    raise reword(e, names)
