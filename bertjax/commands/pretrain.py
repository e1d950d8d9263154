"""`bertjax pretrain --config VARIANT|FILE:VARIANT --workdir DIR [--config.KEY=VALUE ...]`.

`--config base` is the `base` recipe of experiments/pretrain.py as shipped with bertjax, from
any directory; `--config FILE:VARIANT` reads FILE where you stand when it exists there, and
otherwise the shipped recipe file of that name (`--config no_nsp.py:tiny`). The command prints
which file it read. Rerunning the same command with the same workdir resumes from its latest
checkpoint. Multi-host: on a TPU pod slice or under SLURM every process runs the same command
and finds the others itself; elsewhere pass --coordinator-address, --num-processes and
--process-id.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import math
import os
import pathlib
import re
import textwrap
from typing import Callable

from absl import flags
from ml_collections import config_dict, config_flags

from bertjax import errors, locations
from bertjax.training import config_checks

# The library is imported inside the functions below, not at the top: `--help` and flag
# errors answer before JAX and TensorFlow load (a fraction of a second instead of seconds).

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
      "the recipe: a variant of experiments/pretrain.py (e.g. tiny), or FILE:VARIANT (required)",
      flag_values=fv,
      lock_config=True,
      sys_argv=sys_argv,
  )
  flags.DEFINE_string(
      "workdir", None, "output directory (local or gs://); reruns resume (required)", flag_values=fv
  )
  flags.DEFINE_string(
      "coordinator_address",
      None,
      "HOST:PORT of process 0 (multi-host; found automatically on TPU pods and under SLURM)",
      flag_values=fv,
  )
  flags.DEFINE_integer(
      "num_processes", None, "number of processes (multi-host)", lower_bound=1, flag_values=fv
  )
  flags.DEFINE_integer(
      "process_id", None, "this process's index, 0..N-1 (multi-host)", lower_bound=0, flag_values=fv
  )
  return fv


# ----------------------------------------------------------------------------- recipes


def shipped_dir() -> pathlib.Path:
  """The experiments/ directory installed with bertjax (the repository's, in a clone)."""
  found = locations.experiments_dir()
  if found is None:
    raise errors.InputNotFoundError(
        "the recipes shipped with bertjax (experiments/pretrain.py) are not installed — "
        "reinstall bertjax (`pip install -e .` from its repository)"
    )
  return found


def recipe_files() -> list[str]:
  """The shipped config files (`get_config(arg)` files) by name, pretrain.py first."""
  names = sorted(
      p.name
      for p in shipped_dir().glob("*.py")
      if "\ndef get_config(" in p.read_text(encoding="utf-8")
  )
  return sorted(names, key=lambda n: n != "pretrain.py")


def _load_module(path: str | os.PathLike):
  name = "_bertjax_config_" + re.sub(r"\W", "_", str(path))
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def variants(path: str | os.PathLike | None = None) -> dict[str, str]:
  """A recipe file's variants and their one-line descriptions (its `VARIANTS`); the shipped
  experiments/pretrain.py's by default. {} for a file without VARIANTS."""
  found = getattr(_load_module(path or shipped_dir() / "pretrain.py"), "VARIANTS", {})
  return dict(found) if isinstance(found, dict) else {v: "" for v in found}


def _valid_variants() -> str:
  return ", ".join(variants())


@dataclasses.dataclass(frozen=True)
class Recipe:
  """Where `--config SPEC` points: a file and the argument its `get_config` gets."""

  path: pathlib.Path
  arg: str | None  # None: `get_config()` with its default
  shown: str  # as the user would write it
  shipped: bool  # the file installed with bertjax, not one in the working directory

  @property
  def flag_value(self) -> str:
    """The `--config` value ml_collections reads: the real path, wherever the user stands."""
    return str(self.path) + (f":{self.arg}" if self.arg is not None else "")

  def source_line(self, variant: str | None = None) -> str:
    """`config: experiments/pretrain.py:base (shipped with bertjax: WHERE)`: what was read;
    `variant` (the config's own name for it) is added when the file's default was used."""
    where = os.path.relpath(self.path.resolve())
    where = str(self.path.resolve()) if where.startswith("..") else where
    origin = "shipped with bertjax" if self.shipped else "local file"
    default = f"its default variant {variant}; " if self.arg is None and variant else ""
    return f"config: {self.shown} ({default}{origin}: {where})"


def resolve(spec: str) -> Recipe:
  """`--config SPEC` as a Recipe. A FILE that exists where the user stands is read; a path
  that does not exist is the shipped recipe file of that name; a bare NAME is a variant of
  the shipped experiments/pretrain.py."""
  path, colon, arg = spec.partition(":")
  arg = arg if colon else None
  shipped = shipped_dir()
  if os.path.isfile(path):  # in a clone, experiments/pretrain.py is the shipped file itself
    same = pathlib.Path(path).resolve() == (shipped / os.path.basename(path)).resolve()
    return Recipe(pathlib.Path(path), arg, spec, shipped=same)
  if not colon and "/" not in path and not path.endswith(".py"):  # `--config base`
    found = variants()
    if path not in found:
      close = difflib.get_close_matches(path, list(found), n=1)
      hint = f" (did you mean {close[0]}?)" if close else ""
      raise errors.ConfigError(
          f"--config {spec}: not a variant of experiments/pretrain.py nor a file here — "
          f"variants: {', '.join(found)}{hint}; or give FILE:VARIANT"
      )
    return Recipe(shipped / "pretrain.py", path, f"experiments/pretrain.py:{path}", shipped=True)
  name = os.path.basename(path) if path.endswith(".py") else os.path.basename(path) + ".py"
  if path and name in recipe_files():
    shown = f"experiments/{name}" + (f":{arg}" if colon else "")
    return Recipe(shipped / name, arg, shown, shipped=True)
  raise errors.InputNotFoundError(
      f"--config {spec}: no config file {path or '(none before the colon)'} here "
      f"({os.getcwd()}) nor shipped with bertjax — shipped recipe files: "
      f"{', '.join(recipe_files())}; e.g. --config tiny or --config experiments/pretrain.py:tiny "
      f"(variants: {_valid_variants()})"
  )


def load_config(spec: str | Recipe) -> config_dict.ConfigDict:
  """`get_config(ARG)` of the recipe, as ml_collections calls it; a variant the file does not
  have, and any failure of a file of the user's own, is a ConfigError naming --config."""
  recipe = spec if isinstance(spec, Recipe) else resolve(spec)
  where = f"--config {recipe.shown}"
  try:
    module = _load_module(recipe.path)
    known = getattr(module, "VARIANTS", None)
    if known is not None and recipe.arg is not None and recipe.arg not in known:
      close = difflib.get_close_matches(recipe.arg, list(known), n=1)
      hint = f" (did you mean {close[0]}?)" if close else ""
      raise errors.ConfigError(
          f"{where}: unknown variant {recipe.arg!r} — valid: {', '.join(known)}{hint}"
      )
    if not callable(getattr(module, "get_config", None)):
      raise errors.ConfigError(f"{where}: {recipe.path} defines no get_config(arg)")
    return module.get_config(*([] if recipe.arg is None else [recipe.arg]))
  except errors.UserError:
    raise
  except (ValueError, KeyError) as e:  # the file's own "bad argument" errors
    raise errors.ConfigError(f"{where}: {e.args[0] if e.args else type(e).__name__}") from e
  except Exception as e:  # noqa: BLE001  (a broken file of the user's; a shipped one is a bug)
    if recipe.shipped:
      raise
    raise errors.ConfigError(f"{where}: {recipe.path} failed: {type(e).__name__}: {e}") from e


def _config_spec(argv: list[str]) -> str | None:
  """The value of --config in `argv` (`--config X`, `--config=X`, `-config ...`), or None."""
  found = []
  for i, a in enumerate(argv):
    if re.match(r"^--?config$", a):
      found.append(argv[i + 1] if i + 1 < len(argv) else "")
    m = re.match(r"^--?config=(.*)$", a, re.S)
    if m:
      found.append(m.group(1))
  if len(found) > 1:
    raise errors.UsageError(f"--config given {len(found)} times ({', '.join(found)}) — give one")
  return found[0] if found else None


def _with_config(argv: list[str], value: str) -> list[str]:
  """`argv` with the value of --config replaced by `value`."""
  out = list(argv)
  for i, a in enumerate(out):
    if re.match(r"^--?config$", a) and i + 1 < len(out):
      out[i + 1] = value
      return out
    if re.match(r"^--?config=", a):
      out[i] = f"--config={value}"
      return out
  return out


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
        raise errors.ConfigError(
            f"--config.{path}: {where} is a value, not a section — override it as "
            f"--{where}=VALUE"
        )
      if key not in node:
        close = difflib.get_close_matches(key, list(node.keys()), n=1)
        hint = f" (did you mean {where}.{close[0]}?)" if close else ""
        raise errors.ConfigError(
            f"--config.{path}: {where} has no field {key!r}{hint}; valid keys of {where}: "
            f"{', '.join(sorted(node.keys()))}"
        )
      field_type, node, where = node.get_type(key), node[key], f"{where}.{key}"
    if value is None and not negated and field_type is not bool:
      value = argv[i + 1] if i + 1 < len(argv) else None  # `--config.KEY VALUE`
      if value is None or value.startswith("--"):
        raise errors.ConfigError(f"--config.{path} has no value — write --config.{path}=VALUE")
    parser = _PARSERS.get(field_type)
    if parser is None or value is None or negated:
      continue
    try:
      parser.parse(value)
    except (ValueError, TypeError):
      now = f" (this variant's: {node})" if node is not None else ""
      raise errors.ConfigError(
          f"--config.{path}={value}: {where} takes {_TYPE_NAMES[field_type]}{now}"
      ) from None


# ----------------------------------------------------------------------------- command line


def _rows(rows: list[tuple[str, str]], width: int = 32) -> str:
  width = min(width, max(len(a) for a, _ in rows))
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


def _dashed(name: str) -> str:
  return name.replace("_", "-")


def _flags_heading(flag_metavars: tuple[tuple[str, str], ...]) -> str:
  example = next((n for n, _ in flag_metavars if "_" in n), None)
  if example is None:
    return "flags:"
  return f"flags (--{_dashed(example)} is also accepted as --{example}):"


def help_text(
    fv: flags.FlagValues, doc: str, argv: list[str], flag_metavars: tuple[tuple[str, str], ...]
) -> str:
  """One help style for the config-file commands: usage, recipes, flags with defaults."""
  rows = [
      ("--config VARIANT|FILE:VARIANT", fv["config"].help),
      (
          "--config.SECTION.KEY=VALUE",
          "override one field of the config, e.g. --config.train.steps=100 "
          "--config.data.source=synthetic; sections: model, data, train, phase2, mesh, "
          "checkpoint, eval",
      ),
  ]
  for name, metavar in flag_metavars:
    f = fv[name]
    default = f" (default: {f.default})" if f.default is not None else ""
    rows.append((f"--{_dashed(name)} {metavar}".rstrip(), f.help + default))
  rows.append(("--debug", "on an error, print the full traceback (or set BERTJAX_DEBUG=1)"))
  first, _, body = doc.strip().partition("\n")
  if first.startswith("`"):  # the docstring's first line is the usage
    first = "usage: " + first.rstrip(".").strip("`")
  others = [n for n in recipe_files() if n != "pretrain.py"]
  parts = [
      first + "\n" + body,
      "",
      "variants of experiments/pretrain.py (--config VARIANT, or experiments/pretrain.py:VARIANT):",
      _rows(list(variants().items()), width=20),  # the longest name: contrastive_pretrain
      textwrap.fill(
          "other recipe files shipped with bertjax (--config FILE:ARG, e.g. no_nsp.py:tiny): "
          + ", ".join(others),
          98,
          subsequent_indent="  ",
      ),
      "",
      _flags_heading(flag_metavars),
      _rows(rows),
      "",
  ]
  spec = _config_spec(argv)
  if spec:
    recipe = resolve(spec)
    parts += [f"fields of {recipe.shown} and their values (override with --config.KEY=VALUE):"]
    parts += [f"  {k} = {v!r}" for k, v in _fields(load_config(recipe))]
  else:
    parts += ["Add --config VARIANT to --help to list that variant's fields and values."]
  return "\n".join(parts)


def _spelled(argv: list[str], names: set[str]) -> list[str]:
  """`--num-processes 2` as absl's `--num_processes 2` (flags are shown with dashes and
  accepted both ways); `--no-suggest` as `--nosuggest`."""
  out = []
  for a in argv:
    m = re.match(r"^(--?)([A-Za-z][\w-]*)(=.*)?$", a, re.S)
    if m and "-" in m.group(2):
      name, rest = m.group(2).replace("-", "_"), m.group(3) or ""
      if name in names:
        a = f"{m.group(1)}{name}{rest}"
      elif name.startswith("no_") and name[3:] in names:
        a = f"{m.group(1)}no{name[3:]}{rest}"
    out.append(a)
  return out


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

  User errors raise `bertjax.errors.UserError`s naming the flag or config field and the fix
  (`bertjax.cli` prints them as one line), before anything is written; the recipe read is
  printed as one line. `define_extra(fv)` adds a command's own flags; `flag_metavars` lists
  those the help shows (and those accepted with dashes).
  """
  names = {n for n, _ in flag_metavars} | {n for n, _ in _PRETRAIN_FLAGS}
  argv = _spelled(list(argv), names)
  if any(a in ("-h", "--help", "-help", "--helpfull", "--helpshort") for a in argv):
    fv = define_flags([prog] + argv)
    if define_extra:
      define_extra(fv)
    print(help_text(fv, doc, argv, flag_metavars))
    return None
  spec = _config_spec(argv)
  if not spec:
    raise errors.ConfigError(
        f"--config is required — a recipe, e.g. --config tiny (variants: {_valid_variants()}), "
        "or --config FILE:VARIANT"
    )
  recipe = resolve(spec)
  argv = _with_config(argv, recipe.flag_value)
  check_overrides(load_config(recipe), argv)
  fv = define_flags([prog] + argv)
  if define_extra:
    define_extra(fv)
  try:
    fv([prog] + argv)
  except flags.Error as e:
    msg = str(e)
    for name in names:
      msg = msg.replace(f"--{name}=", f"--{_dashed(name)}=")
    raise errors.UsageError(f"{msg} — see `{prog} --help`") from e
  except (KeyError, IndexError, AttributeError, TypeError, ValueError) as e:
    # ml_collections applying an override the checks above let through (`--config.a[0]=1`)
    raise errors.ConfigError(f"a --config.KEY override does not apply: {e}") from e
  budget = budget_follows_length(fv.config, argv)  # before the rule that budget <= length
  config_checks.validate(fv.config)
  print(recipe.source_line(fv.config.get("variant")), flush=True)
  for line in budget:
    print(f"{prog}: {line}", flush=True)
  return fv


def _check_multihost(fv: flags.FlagValues) -> None:
  given = {
      "--coordinator-address": fv.coordinator_address,
      "--num-processes": fv.num_processes,
      "--process-id": fv.process_id,
  }
  explicit = fv.coordinator_address is not None or (fv.num_processes or 1) > 1
  if explicit and any(v is None for v in given.values()):
    missing = ", ".join(k for k, v in given.items() if v is None)
    raise errors.ConfigError(
        f"multi-host: {missing} missing — give all of --coordinator-address, --num-processes "
        "and --process-id, or none (TPU pods and SLURM are found automatically)"
    )
  if explicit and not re.match(r"^[^\s:]+:\d+$", fv.coordinator_address):
    raise errors.ConfigError(
        f"--coordinator-address {fv.coordinator_address}: write HOST:PORT, e.g. 10.0.0.1:1234"
    )
  if fv.process_id is not None and fv.num_processes and fv.process_id >= fv.num_processes:
    raise errors.ConfigError(
        f"--process-id {fv.process_id}: must be below --num-processes {fv.num_processes} "
        f"(0..{fv.num_processes - 1})"
    )


def _define_init(fv: flags.FlagValues) -> None:
  flags.DEFINE_string(
      "init",
      None,
      "continue pretraining from this checkpoint: a bertjax run, a transformers directory "
      "(BERT, RoBERTa, XLM-R, ModernBERT) or a Google BERT checkpoint directory; its network "
      "replaces the recipe's (the same as --config.train.init_from)",
      flag_values=fv,
  )


def main(argv: list[str]) -> int:
  fv = parse(
      argv,
      "bertjax pretrain",
      define_extra=_define_init,
      flag_metavars=_PRETRAIN_FLAGS + (("init", "DIR"),),
  )
  if fv is None:
    return 0
  if not fv.workdir:
    raise errors.ConfigError(
        "--workdir is required (checkpoints, logs, metrics.jsonl), e.g. --workdir runs/tiny"
    )
  _check_multihost(fv)
  apply_init(fv)
  from bertjax.runtime import distributed

  distributed.initialize(fv.coordinator_address, fv.num_processes, fv.process_id)
  from bertjax.training import loop

  return loop.train_and_evaluate(fv.config, fv.workdir, explicit_model_fields(argv))


def apply_init(fv: flags.FlagValues) -> None:
  """--init DIR is --config.train.init_from=DIR; both, differing, is a mistake."""
  if not fv.init:
    return
  given = fv.config.train.get("init_from")
  if given and given != fv.init:
    raise errors.ConfigError(
        f"--init {fv.init} and --config.train.init_from={given} differ — give one of them"
    )
  fv.config.train.init_from = fv.init


def _overridden(argv: list[str]) -> set[str]:
  """The config paths set on the command line (`--config.a.b=...`)."""
  return {m.group(2) for m in map(_OVERRIDE.match, argv) if m}


def budget_follows_length(config: config_dict.ConfigDict, argv: list[str]) -> list[str]:
  """A length set on the command line without its prediction budget takes the budget the
  masking rate gives it (ceil(mask_prob x seq_len), as the recipes' comments compute theirs),
  instead of the recipe's, which was computed for the recipe's length. Returns what changed."""
  given, lines = _overridden(argv), []
  rate = config.data.mask_prob
  for section in ("data", "phase2"):
    length, budget = f"{section}.seq_len", f"{section}.max_predictions_per_seq"
    if length not in given or budget in given or section not in config:
      continue
    node = config[section]
    derived = max(1, math.ceil(rate * node.seq_len - 1e-9))
    if derived != node.max_predictions_per_seq:
      lines.append(
          f"config.{budget} {node.max_predictions_per_seq} -> {derived} "
          f"(ceil({rate:g} x config.{length}={node.seq_len}); set it to choose another)"
      )
      node.max_predictions_per_seq = derived
  return lines


def explicit_model_fields(argv: list[str]) -> frozenset[str]:
  """The config.model fields set on the command line (`--config.model.X=...`)."""
  out = set()
  for a in argv:
    m = _OVERRIDE.match(a)
    if m and m.group(2).startswith("model."):
      out.add(m.group(2)[len("model.") :])
  return frozenset(out)
