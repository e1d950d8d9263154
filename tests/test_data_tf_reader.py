"""The tf.data shard reader gives exactly the Python reader's documents, batches and resume."""

import itertools
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from bertjax.data import pretraining, records, tf_reader

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, prepare_austen) -> str:
  # ~400 KB of whole chapters (~40 documents): an epoch is ~10 batches, so tests cross epochs.
  return prepare_austen(tmp_path_factory.mktemp("small"), 400_000, num_shards=5)


def _cfg(data_dir, **kw) -> pretraining.InputConfig:
  base = dict(
      source="prepared",
      path=data_dir,
      seq_len=256,
      max_predictions_per_seq=40,
      seed=5,
      shuffle_buffer=8,
  )
  return pretraining.InputConfig(**{**base, **kw})


def _stream(cfg, batch=32, index=0, count=1, state=None):
  return pretraining.make_stream(
      cfg, global_batch_size=batch, process_index=index, process_count=count, state=state
  )


def _assert_same(got: dict, want: dict) -> None:
  for k in pretraining.FEATURES:
    assert got[k].dtype == want[k].dtype
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_default_reader_is_tf_data(data_dir):
  assert pretraining.InputConfig().reader == "tf.data"
  assert _stream(_cfg(data_dir)).reader == "tf.data"
  assert _stream(_cfg(data_dir, reader="python")).reader == "python"


@pytest.mark.parametrize("first_doc", [0, 3, 11])  # from the start, mid-shard, a later shard
def test_same_documents_in_the_same_order(data_dir, first_doc):
  streams = [_stream(_cfg(data_dir, reader=r), index=1, count=2) for r in ("tf.data", "python")]
  tf_docs, py_docs = (list(s._read_from(2, first_doc)) for s in streams)
  assert len(tf_docs) == len(py_docs) > 0
  for (s1, r1, d1), (s2, r2, d2) in zip(tf_docs, py_docs):
    assert (s1, r1) == (s2, r2) and len(d1) == len(d2)
    for x, y in zip(d1, d2):
      assert x.dtype == y.dtype == np.int32
      np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("pair_mode", ["nsp", "none"])
def test_identical_batches_across_an_epoch_boundary(data_dir, pair_mode):
  cfg = _cfg(data_dir, pair_mode=pair_mode, whole_word_mask=pair_mode == "none")
  tf_stream, py_stream = _stream(cfg, batch=48), _stream(
      pretraining.InputConfig(**{**cfg.__dict__, "reader": "python"}), batch=48
  )
  for _ in range(12):
    _assert_same(next(tf_stream), next(py_stream))
    assert tf_stream.get_state() == py_stream.get_state()
  assert tf_stream.get_state()["epoch"] >= 1  # the comparison went past an epoch's end


@pytest.mark.slow
@pytest.mark.parametrize("skip", [2, 16])  # mid-epoch; in the second epoch
def test_resume_is_identical_and_crosses_readers(data_dir, skip):
  cfgs = {r: _cfg(data_dir, reader=r) for r in ("tf.data", "python")}
  for saved_with, resumed_with in (
      ("tf.data", "tf.data"),
      ("python", "tf.data"),
      ("tf.data", "python"),
  ):
    stream = _stream(cfgs[saved_with])
    for _ in range(skip):
      next(stream)
    state = json.loads(json.dumps(stream.get_state()))
    assert state["epoch"] == (skip == 16)
    expected = [next(stream) for _ in range(3)]
    resumed = _stream(cfgs[resumed_with], state=state)
    for want in expected:
      _assert_same(next(resumed), want)


@pytest.mark.slow
def test_hosts_read_disjoint_blocks(data_dir):
  seen = []
  for index in range(2):
    stream = _stream(_cfg(data_dir), batch=4, index=index, count=2)
    blocks = range(index, stream.builder.blocks_per_epoch, 2)  # the hosts take turns
    seen.append({(s, r) for t in blocks for s, r, _ in stream.builder.documents(t)})
  assert not seen[0] & seen[1]
  assert {s for s, _ in seen[0] | seen[1]} == set(range(5))


def test_unknown_reader_is_a_clear_error(data_dir):
  with pytest.raises(ValueError, match="reader 'arrow': valid options are 'tf.data', 'python'"):
    _stream(_cfg(data_dir, reader="arrow"))


def test_corrupt_shard_is_a_one_line_error(data_dir, tmp_path):
  meta = records.load_metadata(data_dir)
  shard = records.split_shards(meta, data_dir, "train")[0]
  blob = bytearray(pathlib.Path(shard["path"]).read_bytes())
  blob[40] ^= 0xFF  # inside the first record's data: its CRC no longer matches
  path = tmp_path / "x.tfrecord"
  path.write_bytes(bytes(blob))
  blocks = tf_reader.read_blocks(
      [{**shard, "id": 0, "path": str(path)}], lambda e: [0], epoch=0, first_doc=0, block_size=4
  )
  with pytest.raises(ValueError, match=r"tf.data could not read the shards .*x\.tfrecord"):
    list(itertools.islice(blocks, 2))


@pytest.mark.slow
def test_falls_back_to_python_without_tensorflow(data_dir):
  code = (
      "import sys; sys.modules['tensorflow'] = None\n"
      "from bertjax.data import pretraining as p\n"
      f"cfg = p.InputConfig(path={data_dir!r}, seq_len=64, max_predictions_per_seq=10)\n"
      "s = p.make_stream(cfg, global_batch_size=4, process_index=0, process_count=1)\n"
      "assert s.reader == 'python' and next(s)['input_ids'].shape == (4, 64)\n"
  )
  run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
  assert run.returncode == 0, run.stderr
  assert "TensorFlow is not installed" in run.stderr


def test_prefetch_to_device_drives_the_tf_data_stream_from_its_thread(data_dir):
  import jax

  mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  want = list(itertools.islice(_stream(_cfg(data_dir, reader="python")), 3))
  prefetched = pretraining.prefetch_to_device(_stream(_cfg(data_dir)), sharding, size=2)
  for w in want:
    got = next(prefetched)
    for k in pretraining.FEATURES:
      np.testing.assert_array_equal(np.asarray(got[k]), w[k])
  assert prefetched.get_state()["step"] == 3
  prefetched.close()
