"""A checkpoint step's digest: `<step>/sha256.json` holds the size and SHA-256 of every file
of the step (orbax stores no checksum of its array files, so a flipped bit would restore as a
changed weight). `checkpoint.Manager` writes it when a step is finished and checks it before a
restore; `checkpoint` re-exports these names."""

from __future__ import annotations

import hashlib
import json

from etils import epath

from bertjax.runtime import fs

DIGEST_NAME = "sha256.json"


def _files(step_dir: epath.Path) -> dict[str, epath.Path]:
  """{path relative to `step_dir` ("state/d/abc"): path} of every file under it, any scheme."""
  out = {}
  for root, _, names in step_dir.walk():
    for name in names:
      full = epath.Path(root) / name
      out[str(full.relative_to(step_dir))] = full
  return out


def write_digest(step_dir: epath.Path) -> None:
  """`step_dir/sha256.json`: {relative path: [size, sha256]} of every file of the step."""
  step_dir = fs.path(step_dir)
  files = {}
  for rel, full in sorted(_files(step_dir).items()):
    if rel != DIGEST_NAME:
      files[rel] = [full.stat().length, _sha256(full)]
  fs.write_atomic(step_dir / DIGEST_NAME, json.dumps({"files": files}, indent=0))


def _sha256(path: epath.Path) -> str:
  h = hashlib.sha256()
  with path.open("rb") as f:
    for block in iter(lambda: f.read(1 << 22), b""):
      h.update(block)
  return h.hexdigest()


def verify_digest(step_dir: epath.Path) -> str | None:
  """What differs from the step's digest ("state/d/abc: 3 bytes, 4,096 recorded"), or None
  (also when the step has no digest: a run killed right after orbax finished the step, or a
  step saved to an object store)."""
  step_dir = fs.path(step_dir)
  digest = step_dir / DIGEST_NAME
  if not digest.exists():
    return None
  try:
    files = json.loads(digest.read_text())["files"]
  except (ValueError, KeyError) as e:
    return f"{digest}: unreadable ({e})"
  for rel, (size, sha) in sorted(files.items()):
    full = step_dir / rel
    if not full.exists():
      return f"{full}: missing"
    found = full.stat().length
    if found != size:
      return f"{full}: {found:,} bytes, {size:,} recorded"
    if _sha256(full) != sha:
      return f"{full}: contents changed since it was saved (SHA-256 differs)"
  return None
