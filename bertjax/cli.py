"""The `bertjax` console script: dispatches to one module per subcommand.

Each subcommand lives in `bertjax/commands/<name>.py` and exposes
`main(argv: list[str]) -> int`. Modules are imported only when their command runs,
so `bertjax --help` is instant and the model-only commands work without TensorFlow.

Errors in what the user asked for (a flag, a config field or value, a variant, a path, a
checkpoint that does not match the config) are `bertjax.errors.UserError`s: they print one line,
`bertjax COMMAND: MESSAGE`, and exit with status 2; any other exception is a bug and keeps its
traceback (exit 1). `--debug` (anywhere on the command line)
or `BERTJAX_DEBUG=1` shows the full traceback instead.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import logging
import os
import sys
import tempfile
import traceback

# The library is imported inside the functions below, not at the top: `--help` and flag
# errors answer before JAX and TensorFlow load (a fraction of a second instead of seconds).

# name -> one-line description, in the order a user meets them.
COMMANDS: dict[str, str] = {
    "demo": "train a tiny BERT on the bundled corpus end to end (the README's main job)",
    "tokenizer": "train or inspect a SentencePiece tokenizer with BERT's special tokens",
    "prepare": "tokenize raw text or a TFDS corpus into TFRecord shards of documents",
    "data": "inspect the MLM/NSP example stream: `data preview`, `data stats`",
    "pretrain": "pretrain BERT (MLM + NSP/SOP) from an ml_collections config",
    "compile": "ahead-of-time compile the train step for a mesh and print its memory",
    "glue": "fine-tune and evaluate a checkpoint on GLUE or a custom TSV task",
    "convert": "convert checkpoints between Google BERT, Hugging Face and bertjax",
    "extract": "extract per-token features (e.g. the last four layers) to .jsonl/.npy",
    "embed": "embed texts as a sentence-transformers model does (pooling, normalisation) to .npy",
    "retrieval": "score retrieval on a BEIR-format task (nDCG@10, MRR@10, Recall@100, MAP@100)",
    "squad": "fine-tune and evaluate a checkpoint on SQuAD v1.1/v2.0 (official EM/F1)",
    "ner": "fine-tune a checkpoint for token classification (CoNLL NER, entity F1)",
    "bench": "benchmark the train step (tokens/s, MFU) or the input pipeline",
}


def _usage() -> str:
  width = max(len(n) for n in COMMANDS)
  lines = [
      "usage: bertjax COMMAND [ARGS...]",
      "",
      "BERT pretraining and evaluation in JAX/Flax.",
      "",
      "commands:",
  ]
  lines += [f"  {name:<{width}}  {text}" for name, text in COMMANDS.items()]
  lines += [
      "",
      "Run `bertjax COMMAND --help` for the options of one command. An error in the",
      "arguments prints one line and exits 2; --debug or BERTJAX_DEBUG=1 shows its",
      "traceback.",
  ]
  return "\n".join(lines)


# ----------------------------------------------------------------------------- quiet start-up

# TensorFlow's CUDA probe logs through absl's C++ logging (`cudart_stub.cc`), which ignores
# TF_CPP_MIN_LOG_LEVEL, twice per `import tensorflow` on every machine without an NVIDIA driver.
_TF_NOISE = (
    b"Could not find cuda drivers on your machine, GPU will not be used.",
    b"WARNING: All log messages before absl::InitializeLog() is called are written to " b"STDERR",
)


@contextlib.contextmanager
def _filtered_stderr(drop: tuple[bytes, ...]):
  """File descriptor 2 (C++ and Python writes alike) minus the lines containing `drop`."""
  sys.stderr.flush()
  try:
    saved = os.dup(2)
  except OSError:  # no stderr at all: nothing to filter
    yield
    return
  with tempfile.TemporaryFile() as tmp:
    os.dup2(tmp.fileno(), 2)
    try:
      yield
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      tmp.seek(0)
      kept = [
          line for line in tmp.read().splitlines(keepends=True) if not any(d in line for d in drop)
      ]
      if kept:
        os.write(2, b"".join(kept))


class _QuietLoader(importlib.abc.Loader):

  def __init__(self, loader):
    self.loader = loader

  def create_module(self, spec):
    return self.loader.create_module(spec)

  def exec_module(self, module):
    module.__loader__ = self.loader  # the real loader, for whatever reads it later
    if module.__spec__ is not None:
      module.__spec__.loader = self.loader
    with _filtered_stderr(_TF_NOISE):
      self.loader.exec_module(module)


class _QuietTensorFlowImport(importlib.abc.MetaPathFinder):
  """Runs the first `import tensorflow` with TensorFlow's CUDA-probe lines dropped."""

  _busy = False

  def find_spec(self, fullname, path=None, target=None):
    # Stays installed until TensorFlow is really imported: `importlib.util.find_spec`
    # probes ("is TensorFlow installed?") come here too and load nothing.
    if fullname != "tensorflow" or self._busy or "tensorflow" in sys.modules:
      return None
    self._busy = True
    try:
      spec = importlib.util.find_spec(fullname)
    finally:
      self._busy = False
    if spec is not None and spec.loader is not None:
      spec.loader = _QuietLoader(spec.loader)
    return spec


def _quiet_tensorflow() -> None:
  # TensorFlow's Python-visible start-up logs obey TF_CPP_MIN_LOG_LEVEL; its CUDA probe does
  # not, so it is dropped unless that level asks for INFO lines (TF_CPP_MIN_LOG_LEVEL=0).
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  if os.environ["TF_CPP_MIN_LOG_LEVEL"].strip() in ("", "0") or "tensorflow" in sys.modules:
    return
  if not any(isinstance(f, _QuietTensorFlowImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _QuietTensorFlowImport())


class _StepMetadataFilter(logging.Filter):
  """Drops orbax's warning that a pytree inside a step dir has no `_CHECKPOINT_METADATA`.

  `bertjax.training.pretrained.load_pretrained` reads `checkpoints/<step>/state` directly; that file
  belongs to the step directory, not to its items, so its absence there is expected.
  """

  def filter(self, record: logging.LogRecord) -> bool:
    return not (
        record.msg == "Metadata file does not exist: %s"
        and record.args
        and str(record.args[0]).endswith("/_CHECKPOINT_METADATA")
    )


def _quiet_orbax() -> None:
  try:  # absl's own logger: orbax logs through absl.logging
    from absl import logging as absl_logging
  except ImportError:
    return
  logger = absl_logging.get_absl_logger()
  if not any(isinstance(f, _StepMetadataFilter) for f in logger.filters):
    logger.addFilter(_StepMetadataFilter())


# ----------------------------------------------------------------------------- errors


def _user_errors() -> tuple[type[BaseException], ...]:
  """What means "the user asked for something wrong": `UserError` and the flag parsers' errors.

  Nothing else: a ValueError raised by a bug keeps its traceback (exit 1).
  """
  from bertjax import errors

  kinds: list[type[BaseException]] = [errors.UserError]
  absl_flags = sys.modules.get("absl.flags")  # only a command that imported it can raise it
  if absl_flags is not None:
    kinds.append(absl_flags.Error)
  return tuple(kinds)


def _one_line(e: BaseException) -> str:
  return " ".join(line.strip() for line in str(e).splitlines() if line.strip()) or repr(e)


def _load(name: str):
  # Explicit imports (no importlib on a config string) so grep and IDEs follow them.
  if name == "demo":
    from bertjax.commands import demo as mod
  elif name == "tokenizer":
    from bertjax.commands import tokenizer as mod
  elif name == "prepare":
    from bertjax.commands import prepare as mod
  elif name == "data":
    from bertjax.commands import data as mod
  elif name == "pretrain":
    from bertjax.commands import pretrain as mod
  elif name == "compile":
    from bertjax.commands import compile as mod
  elif name == "glue":
    from bertjax.commands import glue as mod
  elif name == "convert":
    from bertjax.commands import convert as mod
  elif name == "extract":
    from bertjax.commands import extract as mod
  elif name == "embed":
    from bertjax.commands import embed as mod
  elif name == "retrieval":
    from bertjax.commands import retrieval as mod
  elif name == "squad":
    from bertjax.commands import squad as mod
  elif name == "ner":
    from bertjax.commands import ner as mod
  elif name == "bench":
    from bertjax.commands import bench as mod
  else:
    raise KeyError(name)
  return mod


def main(argv: list[str] | None = None) -> int:
  entry_point = argv is None  # the process's own command line, not a call from Python code
  argv = list(sys.argv[1:] if argv is None else argv)
  # --debug, before or after the command (no command has a flag of that name): tracebacks
  debug = "--debug" in argv or os.environ.get("BERTJAX_DEBUG", "").strip() not in ("", "0")
  argv = [a for a in argv if a != "--debug"]
  if not argv or argv[0] in ("-h", "--help", "help"):
    print(_usage())
    return 0
  if argv[0] == "--version":
    from bertjax import __version__

    print(f"bertjax {__version__}")
    return 0
  name, rest = argv[0], argv[1:]
  if name not in COMMANDS:
    print(
        f"bertjax: unknown command {name!r}; valid commands: {', '.join(COMMANDS)}", file=sys.stderr
    )
    return 2
  if entry_point:
    # XLA's CPU runtime maps and zeroes each step's temporaries afresh under glibc's
    # default malloc settings; commands that run XLA re-execute once with settings that
    # reuse them (bertjax.runtime.host_malloc).
    from bertjax.runtime import host_malloc

    host_malloc.maybe_reexec(name, rest)
  # TensorFlow (used only for data) logs its CUDA probing at start-up on every machine, and
  # orbax a missing-metadata warning on every checkpoint load; real errors still surface as
  # exceptions. TF_CPP_MIN_LOG_LEVEL=0 shows TensorFlow's lines.
  _quiet_tensorflow()
  _quiet_orbax()
  # Compiled steps persist across processes (bertjax.runtime.compile_cache; off with
  # BERTJAX_COMPILE_CACHE=off), so a rerun or the next run of a sweep skips compiling.
  from bertjax.runtime import compile_cache

  compile_cache.configure()
  try:
    return int(_load(name).main(rest) or 0)
  except _user_errors() as e:
    sys.stdout.flush()
    if debug:  # the traceback, and still the user error's exit status
      traceback.print_exc()
      return 2
    print(f"bertjax {name}: {_one_line(e)}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  sys.exit(main())
