"""Where the repository's own files are: the one locator for recipes and bundled data.

    locations.DATA_DIR           data/ (the bundled corpus, its tokenizer, movie_snippets/)
    locations.experiments_dir()  experiments/ (the recipes `--config NAME` reads)
    locations.REPO_ROOT          the clone bertjax runs from (benchmarks start peers there)

The files live beside the `bertjax` package in a clone: an editable install (`pip install -e .`,
what `make demo` does) finds them there. A wheel carries `bertjax` and `experiments` but not
data/, so the users of `DATA_DIR` say where they looked when a file is missing.
"""

from __future__ import annotations

import importlib.util
import pathlib

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA_DIR = REPO_ROOT / "data"


def experiments_dir() -> pathlib.Path | None:
  """experiments/ installed with bertjax (the repository's, in a clone); None when absent."""
  # Beside the package first: `find_spec("experiments")` would import whatever package of
  # that common name the working directory holds.
  beside = REPO_ROOT / "experiments"
  if (beside / "pretrain.py").is_file():
    return beside
  spec = importlib.util.find_spec("experiments.pretrain")
  if spec is None or not spec.origin:
    return None
  return pathlib.Path(spec.origin).parent
