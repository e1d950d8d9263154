"""A local Google Cloud Storage for tests: `gs://` paths served from memory, no network.

`server(tmp_path)` starts, in a child process, the `gcp-storage-emulator` package's server (the
GCS JSON API, objects kept in memory) and, in front of it, a small HTTP proxy:

* TensorFlow's GCS file system (tf.io.gfile, tf.data, etils.epath on gs://) has its endpoints
  built in (https://www.googleapis.com, https://storage.googleapis.com), so it is sent to the
  proxy with `https_proxy`. The proxy answers `CONNECT` for those two hosts itself, ends TLS
  with a certificate made for this run (`openssl`; TensorFlow is pointed at it by
  `CURL_CA_BUNDLE`) and forwards the decrypted requests to the emulator. `CONNECT` to any other
  host is refused (403) and logged.
* tensorstore (orbax's array data) takes its endpoint from `TENSORSTORE_GCS_HTTP_URL`: plain
  HTTP requests to the proxy are forwarded the same way.
* google-cloud-storage (orbax asks it whether a bucket has a hierarchical namespace) takes its
  endpoint from `STORAGE_EMULATOR_HOST`, the proxy again, and then sends no credentials.

TensorFlow and tensorstore are given a fixed bearer token (`GOOGLE_AUTH_TOKEN_FOR_TESTING`), no
credentials file and no metadata server probe, so nothing reaches for the network. Every request
the proxy forwards or refuses is logged (`Gcs.requests()`), and `Gcs.objects()` / `Gcs.read()`
ask the emulator directly, so a test can prove that a path really went to the fake bucket.

The proxy also makes up for what the emulator lacks: it checks the generation preconditions
(`ifGenerationMatch`, `ifGenerationNotMatch`: 412 / 304, as GCS answers; tensorstore's
conditional writes and so the workdir lock rely on them) and adds `x-goog-generation` to reads;
an empty simple upload (which the emulator rejects) is sent as a multipart one; a listing by key
range (`startOffset`/`endOffset`) is cut to that range. Still unlike GCS: a resumable upload's
precondition is checked when it starts, not when it completes, and listings come in one page.

    with gcs_fake.server(tmp_path) as gcs:
      subprocess.run(argv, env=gcs.environ(), check=True)  # a child process
      with gcs.patch_environ():                            # or this process, before TF's
        ...                                                # GCS file system starts
      assert "run/checkpoints/3/_CHECKPOINT_METADATA" in gcs.objects()

TensorFlow reads some of these variables (GCS_*, the token) once, when its GCS file system
first starts in a process: in a process that has already touched gs:// they come too late, so
tests run such code in a subprocess. The `gcs` fixture below wraps `server` for pytest.

Run as a script (`python gcs_fake.py --log FILE --cert CERT --key KEY`) it is the child
process: it prints its ports as one JSON line, then serves until its standard input closes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import http.client
import http.server
import json
import os
import pathlib
import re
import shutil
import socketserver
import ssl
import subprocess
import sys
import threading
import urllib.parse
import urllib.request

# The hosts TensorFlow's GCS client calls (JSON API, uploads; media downloads).
HOSTS = ("www.googleapis.com", "storage.googleapis.com")
BUCKET = "bertjax-test"
TOKEN = "fake-token-for-tests"
# Request and response headers that belong to one connection, not to the message.
_HOP = {
    "connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-connection",
    "transfer-encoding",
    "expect",
    "te",
    "upgrade",
    "content-length",
}


# ------------------------------------------------------------------------------ the child process


class _Proxy(socketserver.ThreadingMixIn, http.server.HTTPServer):
  daemon_threads = True
  request_queue_size = 64

  def __init__(self, emulator_port: int, tls: ssl.SSLContext, log: pathlib.Path):
    super().__init__(("127.0.0.1", 0), _Handler)
    self.emulator_port = emulator_port
    self.tls = tls
    self.log = log.open("a", buffering=1)
    # The emulator's server is single-threaded and its store is not thread-safe: one request
    # at a time, from here.
    self.upstream = threading.Lock()
    self.log_lock = threading.Lock()

  def note(self, line: str) -> None:
    with self.log_lock:
      self.log.write(line + "\n")


class _Handler(http.server.BaseHTTPRequestHandler):
  protocol_version = "HTTP/1.1"
  scheme = "http"

  def log_message(self, format, *args):  # noqa: A002 (the base class's name)
    pass

  def do_CONNECT(self):
    host, _, port = self.path.rpartition(":")
    if host not in HOSTS or port != "443":
      self.server.note(f"refused CONNECT {self.path}")
      self.send_error(403, f"the test proxy serves only {', '.join(HOSTS)}")
      self.close_connection = True
      return
    self.send_response(200, "Connection established")
    self.end_headers()
    self.wfile.flush()
    try:
      tls = self.server.tls.wrap_socket(self.connection, server_side=True)
    except (ssl.SSLError, OSError) as e:
      self.server.note(f"TLS handshake for {host} failed: {e}")
      self.close_connection = True
      return
    _TunnelHandler(tls, self.client_address, self.server)
    self.close_connection = True

  def _body(self) -> bytes:
    if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
      parts = []
      while True:
        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
        if size == 0:
          while self.rfile.readline().strip():  # trailers, then the empty line
            pass
          return b"".join(parts)
        parts.append(self.rfile.read(size))
        self.rfile.readline()
    return self.rfile.read(int(self.headers.get("Content-Length") or 0))

  def _forward(self):
    body = self._body()
    headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
    host = self.headers.get("Host", "")
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
    if self.command == "POST" and not body and query.get("uploadType") == ["media"]:
      # The emulator fails on an empty simple upload (tf.io.gfile.makedirs writes "dir/"
      # that way); the same object as a multipart upload with an empty part works.
      path, body, headers = _as_multipart(self.path, query, headers)
    else:
      path = self.path
    target = _object_of(self.command, path, query)
    extra = []
    try:
      with self.server.upstream:  # one request at a time: a precondition holds until the write
        current = self._generation(*target) if target else None
        status = _precondition(self.command, query, current)
        if status:
          reason, response_headers = http.HTTPStatus(status).phrase, []
          data = b"" if status == 304 else json.dumps({"error": {"code": status}}).encode()
        else:
          status, reason, response_headers, data = self._upstream(self.command, path, body, headers)
          if target and query.get("alt") == ["media"] and status in (200, 206):
            # What a read returns in GCS and the emulator leaves out; tensorstore takes the
            # generation a conditional write is made against from it.
            extra = [("x-goog-generation", str(current)), ("x-goog-metageneration", "1")]
    except (OSError, http.client.HTTPException) as e:  # the emulator failed on this request
      status, reason, data, response_headers = 502, "Bad Gateway", str(e).encode(), []
    if status == 200 and ("startOffset" in query or "endOffset" in query):
      data = _key_range(data, query)
    self.server.note(f"{self.scheme} {self.command} {host}{self.path} {status}")
    self.send_response(status, reason)
    for k, v in response_headers + extra:
      if k.lower() in _HOP:
        continue
      if k.lower() == "location" and self.scheme == "https":
        # The emulator builds upload session URLs from the Host header, as plain http.
        v = v.replace(f"http://{host}/", f"https://{host}/", 1)
      self.send_header(k, v)
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    if self.command != "HEAD":
      self.wfile.write(data)

  def _upstream(self, command: str, path: str, body: bytes | None, headers: dict):
    """One request to the emulator: (status, reason, headers, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", self.server.emulator_port, timeout=120)
    try:
      conn.request(command, path, body=body, headers=headers)
      response = conn.getresponse()
      return response.status, response.reason, response.getheaders(), response.read()
    finally:
      conn.close()

  def _generation(self, bucket: str, name: str) -> int:
    """The generation of object `name` now, 0 when there is none (GCS's number for absent)."""
    quoted = urllib.parse.quote(name, safe="")
    status, _, _, data = self._upstream("GET", f"/storage/v1/b/{bucket}/o/{quoted}", None, {})
    return int(json.loads(data)["generation"]) if status == 200 else 0

  do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _forward


_OBJECT = re.compile(r"/storage/v1/b/(?P<bucket>[^/]+)/o/(?P<name>[^/]+)")
_UPLOAD = re.compile(r"/upload/storage/v1/b/(?P<bucket>[^/]+)/o")


def _object_of(command: str, path: str, query: dict) -> tuple[str, str] | None:
  """(bucket, object name) of a JSON API read, delete, patch or upload start, else None."""
  url_path = urllib.parse.urlsplit(path).path
  if m := _OBJECT.fullmatch(url_path):
    return m["bucket"], urllib.parse.unquote(m["name"])
  m = _UPLOAD.fullmatch(url_path)
  if m and command == "POST" and "name" in query and "upload_id" not in query:
    return m["bucket"], query["name"][0]
  return None


def _precondition(command: str, query: dict, generation: int | None) -> int | None:
  """The status GCS answers when `ifGenerationMatch` / `ifGenerationNotMatch` fail (412, or
  304 for a read), which the emulator does not check; None when they hold."""
  if generation is None:
    return None
  if "ifGenerationMatch" in query and int(query["ifGenerationMatch"][0]) != generation:
    return 412
  if "ifGenerationNotMatch" in query and int(query["ifGenerationNotMatch"][0]) == generation:
    return 304 if command == "GET" else 412
  return None


def _key_range(listing: bytes, query: dict) -> bytes:
  """An object listing cut to [startOffset, endOffset), which the emulator ignores (tensorstore
  lists a key range that way)."""
  start = query.get("startOffset", [""])[0]
  end = query.get("endOffset", [None])[0]
  inside = lambda name: start <= name and (end is None or name < end)
  out = json.loads(listing)
  out["items"] = [item for item in out.get("items") or [] if inside(item["name"])]
  out["prefixes"] = [p for p in out.get("prefixes") or [] if inside(p)]
  return json.dumps(out).encode()


def _as_multipart(path: str, query: dict, headers: dict) -> tuple[str, bytes, dict]:
  """An empty `uploadType=media` upload as the same upload of type multipart."""
  boundary = "gcs-fake-boundary"
  types = [v for k, v in headers.items() if k.lower() == "content-type"]
  content_type = types[0] if types else "application/octet-stream"
  meta = json.dumps({"name": query["name"][0]})
  body = (
      f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{meta}\r\n"
      f"--{boundary}\r\nContent-Type: {content_type}\r\n\r\n\r\n--{boundary}--\r\n"
  ).encode()
  headers = {k: v for k, v in headers.items() if k.lower() != "content-type"}
  headers["Content-Type"] = f"multipart/related; boundary={boundary}"
  return path.replace("uploadType=media", "uploadType=multipart", 1), body, headers


class _TunnelHandler(_Handler):
  scheme = "https"


def _serve(argv: list[str]) -> None:
  import argparse

  from gcp_storage_emulator.server import RequestHandler
  from gcp_storage_emulator.storage import Storage

  p = argparse.ArgumentParser()
  p.add_argument("--log", required=True)
  p.add_argument("--cert", required=True)
  p.add_argument("--key", required=True)
  args = p.parse_args(argv)

  # Objects live in memory: on disk the emulator stores "a/" (a directory marker, as
  # tf.io.gfile.makedirs writes one) and "a/b" as a file and a folder of the same name.
  storage = Storage(use_memory_fs=True, data_dir=str(pathlib.Path(args.log).parent))
  emulator = http.server.HTTPServer(("127.0.0.1", 0), functools.partial(RequestHandler, storage))
  tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
  tls.load_cert_chain(args.cert, args.key)
  proxy = _Proxy(emulator.server_address[1], tls, pathlib.Path(args.log))
  for s in (emulator, proxy):
    threading.Thread(target=s.serve_forever, daemon=True).start()
  print(json.dumps({"emulator": emulator.server_address[1], "proxy": proxy.server_address[1]}))
  sys.stdout.flush()
  sys.stdin.read()  # until the parent closes the pipe (or dies); the serving threads end with it


# ------------------------------------------------------------------------------ the test side


def _certificate(directory: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
  """A self-signed certificate (its own CA) for HOSTS: (cert.pem, key.pem)."""
  openssl = shutil.which("openssl")
  if openssl is None:
    raise RuntimeError("gcs_fake needs the openssl command to make a TLS certificate")
  cert, key = directory / "cert.pem", directory / "key.pem"
  subprocess.run(
      [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
      + ["-nodes", "-days", "2", "-subj", "/CN=gcs-fake", "-keyout", str(key), "-out", str(cert)]
      + ["-addext", "subjectAltName=" + ",".join(f"DNS:{h}" for h in HOSTS)]
      + ["-addext", "basicConstraints=critical,CA:TRUE"],
      check=True,
      capture_output=True,
  )
  return cert, key


@dataclasses.dataclass
class Gcs:
  """A running fake GCS with one bucket.

  url: "gs://BUCKET" (no trailing slash). env: the variables to set (for a child process,
  `environ()` also drops the ones in `UNSET`). emulator_url: the emulator's own address
  (http://127.0.0.1:PORT), for looking at what was stored.
  """

  bucket: str
  env: dict[str, str]
  emulator_url: str
  log: pathlib.Path
  pid: int  # the server process's

  # Credentials a developer's machine may carry, which would win over the test token.
  UNSET = ("GOOGLE_APPLICATION_CREDENTIALS",)

  @property
  def url(self) -> str:
    return f"gs://{self.bucket}"

  def environ(self, base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (default os.environ) with `env` set and `UNSET` removed: a child's `env=`."""
    out = dict(os.environ if base is None else base)
    for k in self.UNSET:
      out.pop(k, None)
    out.update(self.env)
    return out

  @contextlib.contextmanager
  def patch_environ(self):
    """Set `env` (and remove `UNSET`) in os.environ for the block, then restore it."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(self.environ(saved))
    try:
      yield self
    finally:
      os.environ.clear()
      os.environ.update(saved)

  def _get(self, path: str, **query) -> bytes:
    url = f"{self.emulator_url}{path}"
    if query:
      url += "?" + urllib.parse.urlencode(query)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=30) as r:
      return r.read()

  def objects(self, prefix: str = "") -> list[str]:
    """The names of the objects in the bucket under `prefix`, as the emulator lists them."""
    listing = json.loads(self._get(f"/storage/v1/b/{self.bucket}/o", prefix=prefix))
    return sorted(item["name"] for item in listing.get("items") or [])

  def read(self, name: str) -> bytes:
    """The bytes of object `name`, straight from the emulator."""
    return self._get(
        f"/storage/v1/b/{self.bucket}/o/{urllib.parse.quote(name, safe='')}", alt="media"
    )

  def requests(self) -> list[str]:
    """One line per request the proxy forwarded or refused: "https GET host/path 200"."""
    return self.log.read_text().splitlines() if self.log.exists() else []


@contextlib.contextmanager
def server(directory: os.PathLike | str, bucket: str = BUCKET):
  """Start a fake GCS with `bucket` (its certificate and log go in `directory`); yield `Gcs`."""
  directory = pathlib.Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  cert, key = _certificate(directory)
  log = directory / "gcs_requests.log"
  with (directory / "gcs_server.log").open("ab") as errors:  # the child keeps its own copy
    proc = subprocess.Popen(
        [sys.executable, __file__, "--log", str(log), "--cert", str(cert), "--key", str(key)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=errors,
        text=True,
    )
  try:
    line = proc.stdout.readline()
    if not line:
      raise RuntimeError(
          f"the fake GCS server did not start (exit {proc.wait(timeout=10)}): "
          + (directory / "gcs_server.log").read_text()[-2000:]
      )
    ports = json.loads(line)
    emulator_url = f"http://127.0.0.1:{ports['emulator']}"
    proxy = f"http://127.0.0.1:{ports['proxy']}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    opener.open(
        urllib.request.Request(
            f"{emulator_url}/storage/v1/b?project=test",
            data=json.dumps({"name": bucket}).encode(),
            headers={"Content-Type": "application/json"},
        ),
        timeout=30,
    ).close()
    empty = directory / "gcloud-config"  # no gcloud application default credentials
    empty.mkdir(exist_ok=True)
    env = {
        # TensorFlow's GCS file system (libcurl): through the proxy, trusting its certificate.
        "https_proxy": proxy,
        "HTTPS_PROXY": proxy,
        "no_proxy": "127.0.0.1,localhost",
        "NO_PROXY": "127.0.0.1,localhost",
        "CURL_CA_BUNDLE": str(cert),
        "NO_GCE_CHECK": "true",
        "CLOUDSDK_CONFIG": str(empty),
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": TOKEN,
        # A failing request fails within a second or so instead of after TF's ~10 retries
        # with backoff up to 32 s.
        "GCS_RETRY_CONFIG_MAX_RETRIES": "2",
        "GCS_RETRY_CONFIG_INIT_DELAY_TIME_US": "10000",
        "GCS_RETRY_CONFIG_MAX_DELAY_TIME_US": "200000",
        # tensorstore (orbax's arrays): plain HTTP to the proxy.
        "TENSORSTORE_GCS_HTTP_URL": proxy,
        # google-cloud-storage (orbax asks it whether a bucket has a hierarchical namespace):
        # anonymous, plain HTTP to the proxy.
        "STORAGE_EMULATOR_HOST": proxy,
    }
    yield Gcs(bucket=bucket, env=env, emulator_url=emulator_url, log=log, pid=proc.pid)
  finally:
    proc.stdin.close()
    try:
      proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
    proc.stdout.close()


try:
  import pytest
except ImportError:  # the child process does not need it
  pytest = None

if pytest is not None:

  @pytest.fixture
  def gcs(tmp_path_factory):
    """A fresh fake GCS (see `server`) for one test: the `Gcs` object."""
    with server(tmp_path_factory.mktemp("gcs")) as g:
      yield g


if __name__ == "__main__":
  _serve(sys.argv[1:])
