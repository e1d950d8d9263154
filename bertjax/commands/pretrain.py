"""`bertjax pretrain --config experiments/pretrain.py:VARIANT --workdir DIR [--config.KEY=V ...]`.

Rerunning the same command with the same workdir resumes from its latest checkpoint.
Multi-host: on a TPU pod slice or under SLURM every process runs the same command and finds
the others itself; elsewhere pass --coordinator_address, --num_processes and --process_id.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import pathlib
import re
import textwrap
from typing import Callable

from absl import flags
from ml_collections import config_dict, config_flags

from bertjax.training import config_checks

# The library is imported inside the functions below, not at the top: `--help` and flag
# errors answer before JAX and TensorFlow load (a fraction of a second instead of seconds).

PRETRAIN_CONFIG = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "pretrain.py"
_OVERRIDE = re.compile(r"^--?(no)?config\.([^=]+)(=(.*))?$", re.S)
# ml_collections' parser per field type (config_flags._FIELD_TYPE_TO_PARSER), for the checks.
_PARSERS = {int: flags.IntegerParser(), float: flags.FloatParser(), bool: flags.BooleanParser()}
_TYPE_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def define_flags(sys_argv: list[str]) -> flags.FlagValues:
  """A private flag set (no absl globals), so several commands can run in one process.

  `sys_argv` (program name first) is what ml_collections scans for `--config.KEY` overrides;
  it is not `sys.argv` when a command is called from Python (the demo, tests).
  """
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file(
      "config",
      None,
      "the experiment config, e.g. " "experiments/pretrain.py:tiny (required)",
      flag_values=fv,
      lock_config=True,
      sys_argv=sys_argv,
  )
  flags.DEFINE_string(
      "workdir",
      None,
      "output directory (local or gs://); reruns resume " "(required)",
      flag_values=fv,
  )
  flags.DEFINE_string(
      "coordinator_address",
      None,
      "HOST:PORT of process 0 (multi-host; " "found automatically on TPU pods and under SLURM)",
      flag_values=fv,
  )
  flags.DEFINE_integer("num_processes", None, "number of processes (multi-host)", flag_values=fv)
  flags.DEFINE_integer("process_id", None, "this process's index (multi-host)", flag_values=fv)
  return fv


# ----------------------------------------------------------------------------- config file


def _load_module(path: str | os.PathLike):
  name = "_bertjax_config_" + re.sub(r"\W", "_", str(path))
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def variants(path: str | os.PathLike = PRETRAIN_CONFIG) -> list[str]:
  """The variants of experiments/pretrain.py (its `VARIANTS`)."""
  return list(_load_module(path).VARIANTS)


def _config_spec(argv: list[str]) -> str | None:
  """The value of --config in `argv` (`--config X`, `--config=X`, `-config ...`), or None."""
  for i, a in enumerate(argv):
    if re.match(r"^--?config$", a):
      return argv[i + 1] if i + 1 < len(argv) else ""
    m = re.match(r"^--?config=(.*)$", a, re.S)
    if m:
      return m.group(1)
  return None


def load_config(spec: str) -> config_dict.ConfigDict:
  """`get_config(ARG)` of `FILE:ARG`, as ml_collections calls it, with the file's own errors."""
  path, colon, arg = spec.partition(":")
  if not path or not os.path.isfile(path):
    raise FileNotFoundError(
        f"--config {spec}: no config file {path!r} (relative to {os.getcwd()}); e.g. --config "
        f"experiments/pretrain.py:tiny, variants: {', '.join(variants())}"
    )
  module = _load_module(path)
  if not callable(getattr(module, "get_config", None)):
    raise ValueError(f"--config {spec}: {path} defines no get_config(arg)")
  return module.get_config(*([arg] if colon else []))


def check_overrides(config: config_dict.ConfigDict, argv: list[str]) -> None:
  """Every `--config.KEY=VALUE` in `argv` names a field of `config` and parses as its type.

  ml_collections fails on these too, but with a traceback (unknown key) or a message that
  names neither the valid keys nor the expected type.
  """
  for i, arg in enumerate(argv):
    m = _OVERRIDE.match(arg)
    if not m:
      continue
    negated, path, value = bool(m.group(1)), m.group(2), m.group(4)
    if "[" in path:  # an element of a tuple/list field: ml_collections' own checks
      continue
    node, where, field_type = config, "config", None
    for key in path.split("."):
      if not isinstance(node, config_dict.ConfigDict):
        raise ValueError(
            f"--config.{path}: {where} is a value, not a section; "
            f"override it as --{where}=VALUE"
        )
      if key not in node:
        close = difflib.get_close_matches(key, list(node.keys()), n=1)
        hint = f" (did you mean {where}.{close[0]}?)" if close else ""
        raise ValueError(
            f"--config.{path}: {where} has no field {key!r}{hint}; valid keys "
            f"of {where}: {', '.join(sorted(node.keys()))}"
        )
      field_type, node, where = node.get_type(key), node[key], f"{where}.{key}"
    if value is None and not negated and field_type is not bool:
      value = argv[i + 1] if i + 1 < len(argv) else None  # `--config.KEY VALUE`
    parser = _PARSERS.get(field_type)
    if parser is None or value is None or negated:
      continue
    try:
      parser.parse(value)
    except (ValueError, TypeError):
      now = f" (this variant's: {node})" if node is not None else ""
      raise ValueError(
          f"--config.{path}={value}: {where} takes {_TYPE_NAMES[field_type]}" f"{now}"
      ) from None


# ----------------------------------------------------------------------------- command line


def _rows(rows: list[tuple[str, str]]) -> str:
  width = min(32, max(len(a) for a, _ in rows))
  out = []
  for left, text in rows:
    body = textwrap.wrap(text, 98 - width - 4) or [""]
    if len(left) > width:
      out.append(f"  {left}")
      out += [f"  {'':<{width}}  {line}" for line in body]
    else:
      out.append(f"  {left:<{width}}  {body[0]}")
      out += [f"  {'':<{width}}  {line}" for line in body[1:]]
  return "\n".join(out)


def _fields(section, prefix: str = ""):
  for key, value in sorted(section.items()):
    if isinstance(value, config_dict.ConfigDict):
      yield from _fields(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}", value


def help_text(
    fv: flags.FlagValues, doc: str, argv: list[str], flag_metavars: tuple[tuple[str, str], ...]
) -> str:
  """One help style for the config-file commands: usage, variants, flags with defaults."""
  rows = [
      ("--config FILE:VARIANT", fv["config"].help),
      (
          "--config.SECTION.KEY=VALUE",
          "override one field of the config, e.g. "
          "--config.train.steps=100 --config.data.source=synthetic; sections: model, data, "
          "train, phase2, mesh, checkpoint, eval",
      ),
  ]
  for name, metavar in flag_metavars:
    f = fv[name]
    rows.append(
        (
            f"--{name} {metavar}",
            f.help + (f" (default: {f.default})" if f.default is not None else ""),
        )
    )
  rows.append(("--debug", "on an error, print the full traceback (or set BERTJAX_DEBUG=1)"))
  first, _, body = doc.strip().partition("\n")
  if first.startswith("`"):  # the docstring's first line is the usage
    first = "usage: " + first.rstrip(".").strip("`")
  parts = [
      first + "\n" + body,
      "",
      textwrap.fill(
          "variants (experiments/pretrain.py:VARIANT): " + ", ".join(variants()),
          98,
          subsequent_indent="  ",
      ),
      "",
      "flags:",
      _rows(rows),
      "",
  ]
  spec = _config_spec(argv)
  if spec:
    parts += [f"fields of {spec} and their values (override with --config.KEY=VALUE):"]
    parts += [f"  {k} = {v!r}" for k, v in _fields(load_config(spec))]
  else:
    parts += ["Add --config FILE:VARIANT to --help to list that variant's fields and values."]
  return "\n".join(parts)


_PRETRAIN_FLAGS = (
    ("workdir", "DIR"),
    ("coordinator_address", "HOST:PORT"),
    ("num_processes", "N"),
    ("process_id", "I"),
)


def parse(
    argv: list[str],
    prog: str,
    define_extra: Callable[[flags.FlagValues], None] | None = None,
    doc: str = __doc__,
    flag_metavars: tuple[tuple[str, str], ...] = _PRETRAIN_FLAGS,
) -> flags.FlagValues | None:
  """Parsed and validated flags, or None after printing --help.

  User errors raise ValueError / FileNotFoundError / absl `flags.Error` naming the flag or
  config field and the fix (`bertjax.cli` prints them as one line), before anything is written.
  `define_extra(fv)` adds a command's own flags; `flag_metavars` lists those the help shows.
  """
  argv = list(argv)
  fv = define_flags([prog] + argv)
  if define_extra:
    define_extra(fv)
  if any(a in ("-h", "--help", "-help", "--helpfull", "--helpshort") for a in argv):
    print(help_text(fv, doc, argv, flag_metavars))
    return None
  spec = _config_spec(argv)
  if not spec:
    raise ValueError(
        "--config is required, e.g. --config experiments/pretrain.py:tiny "
        f"(variants: {', '.join(variants())})"
    )
  check_overrides(load_config(spec), argv)
  fv([prog] + argv)
  config_checks.validate(fv.config)
  return fv


def main(argv: list[str]) -> int:
  fv = parse(argv, "bertjax pretrain")
  if fv is None:
    return 0
  if not fv.workdir:
    raise ValueError(
        "--workdir is required (checkpoints, logs, metrics.jsonl), e.g. " "--workdir runs/tiny"
    )
  from bertjax.runtime import distributed

  distributed.initialize(fv.coordinator_address, fv.num_processes, fv.process_id)
  from bertjax.training import loop

  return loop.train_and_evaluate(fv.config, fv.workdir)
