"""The error contract, table-driven: a user mistake in any command prints one line
`bertjax COMMAND: ...`, exits 2, shows no traceback and writes nothing.

The rows live beside the commands they exercise (`mistakes_*.py` in this folder, one table per
group of commands); this file runs them all. Each row runs in-process (`bertjax.cli.main`) in a
fresh working directory, so relative paths are the user's, and the directory is compared file by
file before and after: no output, no partial file, no directory created.
"""

from __future__ import annotations

import os
import pathlib

import pytest

import mistakes_data
import mistakes_finetune
import mistakes_pretrain
import mistakes_tools
from mistakes_common import Mistake, REPO
from bertjax import cli

ROWS: list[Mistake] = [
    *mistakes_pretrain.ROWS,
    *mistakes_tools.ROWS,
    *mistakes_data.ROWS,
    *mistakes_finetune.ROWS,
]


def _snapshot(root: pathlib.Path) -> dict[str, tuple[int, int]]:
  out = {}
  for dirpath, dirnames, filenames in os.walk(root):
    for name in dirnames + filenames:
      p = pathlib.Path(dirpath) / name
      st = p.lstat()
      out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns) if p.is_file() else (-1, 0)
  return out


def test_the_table_is_large_and_distinct():
  ids = [r.id for r in ROWS]
  assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
  assert len(ROWS) >= 40, len(ROWS)
  commands = {r.argv[0] for r in ROWS}
  assert commands >= set(cli.COMMANDS) - {"demo"} | {"pretrain"}, set(cli.COMMANDS) - commands


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_mistake(row: Mistake, tmp_path, monkeypatch, capfd, request):
  work = tmp_path / "cwd"
  work.mkdir()
  monkeypatch.chdir(work)
  monkeypatch.delenv("BERTJAX_DEBUG", raising=False)
  values = {"repo": str(REPO), "tokenizer": str(REPO / "data" / "tokenizer.model")}
  for name in row.fixtures:  # session fixtures that build inputs once (a tiny run, shards)
    values[name] = str(request.getfixturevalue(name))
  if row.setup is not None:
    row.setup(work)
  argv = [a.format(**values) for a in row.argv]
  capfd.readouterr()  # what building the fixtures printed is not the command's output
  before = _snapshot(work)
  rc = cli.main(argv)
  captured = capfd.readouterr()
  lines = captured.err.strip().splitlines()
  assert rc == 2, (rc, captured.err[-2000:])
  assert len(lines) == 1, captured.err[-2000:]
  assert lines[0].startswith(f"bertjax {argv[0]}: "), lines[0]
  assert "Traceback" not in captured.err + captured.out
  for needle in row.needles:
    assert needle in lines[0], (needle, lines[0])
  assert _snapshot(work) == before, "the mistake wrote into the working directory"
