"""The fake GCS of gcs_fake.py: it starts and stops cleanly, and TensorFlow's GCS file system,
tf.data, etils.epath and orbax (tensorstore) all reach it on gs:// paths, and nothing else.

The client checks run in one subprocess (this file run as a script), so that the environment is
in place before TensorFlow's GCS file system starts.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

import gcs_fake
from gcs_fake import gcs  # noqa: F401  (the fixture)

# The fake is a server process; these tests start it or a client process of their own.
pytestmark = pytest.mark.process

HERE = pathlib.Path(__file__).resolve().parent


def _refused(port: int) -> bool:
  with socket.socket() as s:
    s.settimeout(2)
    return s.connect_ex(("127.0.0.1", port)) != 0


def test_server_starts_fast_and_stops_without_leftovers(tmp_path):
  t = time.monotonic()
  with gcs_fake.server(tmp_path) as g:
    started = time.monotonic() - t
    proxy_port = int(g.env["https_proxy"].rsplit(":", 1)[1])
    emulator_port = int(g.emulator_url.rsplit(":", 1)[1])
    assert g.url == f"gs://{gcs_fake.BUCKET}"
    assert g.objects() == []
    os.kill(g.pid, 0)  # running
  assert started < 5, f"the fake GCS took {started:.1f} s to start"
  with pytest.raises(ProcessLookupError):  # exited and reaped
    os.kill(g.pid, 0)
  assert _refused(proxy_port) and _refused(emulator_port)


def test_proxy_forwards_plain_http_and_refuses_other_hosts(gcs):
  proxy = gcs.env["TENSORSTORE_GCS_HTTP_URL"]
  opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
  # A simple upload, the way tensorstore writes, through the proxy's plain HTTP side.
  request = urllib.request.Request(
      f"{proxy}/upload/storage/v1/b/{gcs.bucket}/o?uploadType=media&name=dir%2Fobj",
      data=b"payload",
      headers={"Content-Type": "application/octet-stream"},
  )
  with opener.open(request, timeout=30) as r:
    assert json.loads(r.read())["name"] == "dir/obj"
  # An empty one (as tf.io.gfile.makedirs writes "dir/"), which the emulator alone rejects.
  request = urllib.request.Request(
      f"{proxy}/upload/storage/v1/b/{gcs.bucket}/o?uploadType=media&name=empty%2F", data=b""
  )
  with opener.open(request, timeout=30) as r:
    assert json.loads(r.read())["size"] == "0"
  assert gcs.objects() == ["dir/obj", "empty/"]
  assert gcs.read("dir/obj") == b"payload"
  # Listing a key range (tensorstore's way) gives only the keys in it.
  for name in ("a/x", "ab", "b"):
    upload = f"{proxy}/upload/storage/v1/b/{gcs.bucket}/o?uploadType=media&name={name}"
    opener.open(urllib.request.Request(upload, data=b"1"), timeout=30).close()
  listing = f"{proxy}/storage/v1/b/{gcs.bucket}/o?startOffset=a%2F&endOffset=a0"
  with opener.open(listing, timeout=30) as r:
    assert [i["name"] for i in json.loads(r.read())["items"]] == ["a/x"]
  # CONNECT to a host other than Google's storage endpoints is refused, and logged.
  port = int(proxy.rsplit(":", 1)[1])
  with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
    s.sendall(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
    assert s.recv(100).split(b"\r\n")[0].split()[1] == b"403"
  assert "refused CONNECT example.com:443" in gcs.requests()
  assert any(line.startswith("http POST ") for line in gcs.requests())


def test_generation_preconditions_hold_as_on_gcs(gcs):
  """ifGenerationMatch / ifGenerationNotMatch (tensorstore's conditional writes, which the
  workdir lock relies on) are checked, and reads carry x-goog-generation."""
  proxy = gcs.env["TENSORSTORE_GCS_HTTP_URL"]
  base = f"{proxy}/storage/v1/b/{gcs.bucket}/o/lock"
  opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

  def call(method, url, data=None):
    try:
      with opener.open(urllib.request.Request(url, data=data, method=method), timeout=30) as r:
        return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
      return e.code, dict(e.headers), e.read()

  create = f"{proxy}/upload/storage/v1/b/{gcs.bucket}/o?uploadType=media&name=lock"
  status, _, body = call("POST", create + "&ifGenerationMatch=0", b"first")
  assert status == 200
  generation = json.loads(body)["generation"]
  assert call("POST", create + "&ifGenerationMatch=0", b"second")[0] == 412
  assert call("POST", create + "&ifGenerationMatch=1", b"second")[0] == 412
  status, headers, body = call("GET", base + "?alt=media")
  assert (status, body, headers["x-goog-generation"]) == (200, b"first", generation)
  assert call("GET", f"{base}?alt=media&ifGenerationNotMatch={generation}")[0] == 304
  assert call("DELETE", f"{base}?ifGenerationMatch=1")[0] == 412
  assert gcs.objects() == ["lock"]
  status, _, body = call("POST", f"{create}&ifGenerationMatch={generation}", b"second")
  assert status == 200 and gcs.read("lock") == b"second"
  assert call("DELETE", f"{base}?ifGenerationMatch={json.loads(body)['generation']}")[0] in (
      200,
      204,
  )
  assert gcs.objects() == []


def test_environment_for_a_child_process(gcs):
  env = gcs.environ({"PATH": "/bin", "GOOGLE_APPLICATION_CREDENTIALS": "/nonexistent.json"})
  assert "GOOGLE_APPLICATION_CREDENTIALS" not in env
  assert env["PATH"] == "/bin"
  assert env["TENSORSTORE_GCS_HTTP_URL"] == env["https_proxy"] == env["STORAGE_EMULATOR_HOST"]
  assert pathlib.Path(env["CURL_CA_BUNDLE"]).read_text().startswith("-----BEGIN CERTIFICATE")
  saved = dict(os.environ)
  with gcs.patch_environ():
    assert os.environ["https_proxy"] == gcs.env["https_proxy"]
  assert dict(os.environ) == saved


@pytest.mark.slow
def test_tensorflow_epath_and_orbax_reach_the_fake_bucket(gcs, tmp_path):
  cwd = tmp_path / "cwd"
  cwd.mkdir()
  t = time.monotonic()
  r = subprocess.run(  # the script's folder (tests/) comes first on its sys.path
      [sys.executable, str(HERE / "test_gcs_fake.py"), gcs.url],
      cwd=cwd,
      env=gcs.environ(),
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
  print(f"client checks: {time.monotonic() - t:.1f} s; {r.stdout.strip().splitlines()[-1]}")

  objects = gcs.objects()
  # What each client left, as the emulator itself lists and serves it.
  assert gcs.read("gf/keep.txt") == b"kept"
  assert {"gf/", "gf/sub/"} <= set(objects)
  assert not [o for o in objects if o.startswith(("gf/tree", "gf/sub/a.txt", "gf/sub/b.txt"))]
  assert gcs.read("data/r.tfrecord")[12:16] == b"rec0"  # after length and its crc
  assert gcs.read("ep/d/one.txt") == b"uno" and gcs.read("ep/two.txt") == b"dos"
  assert not [o for o in objects if o.startswith("ep/gone")]
  for step in (1, 2):
    assert f"ckpt/{step}/_CHECKPOINT_METADATA" in objects
    assert any(o.startswith(f"ckpt/{step}/default/") and "/d/" in o for o in objects)
  # TensorFlow came through the TLS tunnel (JSON API, uploads and media reads), tensorstore
  # and google-cloud-storage by plain HTTP; no request for another host.
  log = gcs.requests()
  for prefix in (
      "https GET www.googleapis.com/storage/v1/",
      "https PUT www.googleapis.com/upload/storage/v1/",
      "https POST www.googleapis.com/storage/v1/b/bertjax-test/o/gf%2Fsub%2Fa.txt/rewriteTo/",
      "https GET storage.googleapis.com/bertjax-test/",
      "http POST 127.0.0.1:",
  ):
    assert any(line.startswith(prefix) for line in log), prefix
  assert not [line for line in log if line.startswith("refused")]
  # Nothing landed on the local disk under the gs:// names.
  assert list(cwd.iterdir()) == []


# ------------------------------------------------------------------ the subprocess's checks


def _client_checks(url: str) -> dict[str, float]:
  """tf.io.gfile, tf.data, etils.epath and orbax on `url` (gs://BUCKET); seconds for each."""
  seconds = {}
  t = time.monotonic()
  import tensorflow as tf

  seconds["import tensorflow"] = time.monotonic() - t
  gf = tf.io.gfile

  t = time.monotonic()
  d = f"{url}/gf"
  gf.makedirs(f"{d}/sub")
  assert gf.isdir(f"{d}/sub")
  a = f"{d}/sub/a.txt"
  with gf.GFile(a, "w") as f:
    f.write("alpha")
  assert gf.exists(a)
  with gf.GFile(a) as f:
    assert f.read() == "alpha"
  assert gf.stat(a).length == 5
  assert gf.listdir(f"{d}/sub") == ["a.txt"]
  assert gf.listdir(d) == ["sub/"]
  assert gf.glob(f"{d}/sub/*.txt") == [a]
  gf.rename(a, f"{d}/sub/b.txt")
  assert not gf.exists(a)
  with gf.GFile(f"{d}/sub/b.txt") as f:
    assert f.read() == "alpha"
  gf.remove(f"{d}/sub/b.txt")
  assert not gf.exists(f"{d}/sub/b.txt")
  for name in ("x", "y/z"):
    with gf.GFile(f"{d}/tree/{name}", "w") as f:
      f.write(name)
  assert sorted(gf.listdir(d)) == ["sub/", "tree/"]
  gf.rmtree(f"{d}/tree")
  # (gf.exists(tree) may still say True for a few seconds: TF caches a folder's stat.)
  assert gf.listdir(d) == ["sub/"]
  with gf.GFile(f"{d}/keep.txt", "w") as f:
    f.write("kept")
  seconds["tf.io.gfile"] = time.monotonic() - t

  t = time.monotonic()
  records = f"{url}/data/r.tfrecord"
  with tf.io.TFRecordWriter(records) as w:
    for i in range(3):
      w.write(b"rec%d" % i)
  assert [x.numpy() for x in tf.data.TFRecordDataset([records])] == [b"rec0", b"rec1", b"rec2"]
  seconds["tf.data"] = time.monotonic() - t

  t = time.monotonic()
  from etils import epath

  p = epath.Path(url) / "ep"
  (p / "d").mkdir(parents=True, exist_ok=True)
  (p / "d" / "one.txt").write_text("uno")
  (p / "two.txt").write_text("dos")
  assert (p / "d" / "one.txt").read_text() == "uno"
  assert (p / "two.txt").exists() and not (p / "three.txt").exists()
  assert sorted(x.name for x in p.iterdir()) == ["d", "two.txt"]
  assert [str(x) for x in p.glob("*/*.txt")] == [f"{url}/ep/d/one.txt"]
  (p / "gone").mkdir()
  (p / "gone" / "g.txt").write_text("g")
  (p / "gone").rmtree()
  assert sorted(x.name for x in p.iterdir()) == ["d", "two.txt"]
  seconds["etils.epath"] = time.monotonic() - t

  t = time.monotonic()
  import jax
  import jax.numpy as jnp
  import numpy as np
  import orbax.checkpoint as ocp

  tree = {"w": jnp.arange(12, dtype=jnp.float32).reshape(3, 4), "b": {"c": jnp.ones(5, jnp.int32)}}
  options = ocp.CheckpointManagerOptions(max_to_keep=2)
  with ocp.CheckpointManager(f"{url}/ckpt", options=options) as m:
    for step in (1, 2):
      m.save(step, args=ocp.args.StandardSave(jax.tree.map(lambda x: x * step, tree)))
    m.wait_until_finished()
  with ocp.CheckpointManager(f"{url}/ckpt") as m:  # a fresh manager: read back from the bucket
    assert m.all_steps() == [1, 2]
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
    restored = m.restore(2, args=ocp.args.StandardRestore(abstract))
  for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(tree)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want) * 2)
  seconds["orbax"] = time.monotonic() - t
  return seconds


if __name__ == "__main__":
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
  print(json.dumps({k: round(v, 1) for k, v in _client_checks(sys.argv[1]).items()}))
