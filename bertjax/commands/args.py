"""The flag parser every argparse command uses: one help style, one way to fail.

`ArgumentParser` raises `bertjax.errors.UsageError` instead of printing usage and exiting, so a
mistyped flag ends like every other user mistake: one line `bertjax COMMAND: ...`, exit 2.
"""

from __future__ import annotations

import argparse
import copy

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
    raise errors.UsageError(
        f"{where}{message} — see `{self.prog} --help`"
    )


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
