"""The `bertjax` console script: dispatches to one module per subcommand.

Each subcommand lives in `bertjax/commands/<name>.py` and exposes
`main(argv: list[str]) -> int`. Modules are imported only when their command runs,
so `bertjax --help` is instant and the model-only commands work without TensorFlow.
"""

from __future__ import annotations

import os
import sys

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
    lines += ["", "Run `bertjax COMMAND --help` for the options of one command."]
    return "\n".join(lines)


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
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] == "--version":
        from bertjax import __version__

        print(f"bertjax {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    # TensorFlow (used only for data) logs its CUDA probing at start-up on every machine; its
    # real errors still surface as Python exceptions. Set TF_CPP_MIN_LOG_LEVEL to see the logs.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if name not in COMMANDS:
        print(f"bertjax: unknown command {name!r}; valid commands: {', '.join(COMMANDS)}",
              file=sys.stderr)
        return 2
    if entry_point:
        # XLA's CPU runtime maps and zeroes each step's temporaries afresh under glibc's
        # default malloc settings; commands that run XLA re-execute once with settings that
        # reuse them (bertjax.host_malloc).
        from bertjax import host_malloc

        host_malloc.maybe_reexec(name, rest)
    return int(_load(name).main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
