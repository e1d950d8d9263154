"""One writer per workdir: a second run is refused with who holds the lock, a dead holder's
lock is taken over, and `bertjax pretrain` takes it before writing anything."""

import json
import os
import socket
import subprocess
import sys

import pytest

from bertjax.runtime import workdir_lock


def test_second_writer_is_refused_with_the_holder(tmp_path):
  with workdir_lock.Lock(str(tmp_path), "bertjax pretrain"):
    holder = json.loads((tmp_path / workdir_lock.LOCK_NAME).read_text())
    assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
    with pytest.raises(
        workdir_lock.WorkdirBusyError,
        match=rf"in use by `bertjax pretrain` \(pid {os.getpid()} on ",
    ):
      workdir_lock.Lock(str(tmp_path), "bertjax pretrain").acquire()
  assert not (tmp_path / workdir_lock.LOCK_NAME).exists()  # released at the end


def _write_lock(d, **holder):
  (d / workdir_lock.LOCK_NAME).write_text(
      json.dumps(
          dict(host=socket.gethostname(), started="then", command="bertjax pretrain") | holder
      )
  )


@pytest.mark.process
def test_stale_locks_are_taken_over(tmp_path, capsys):
  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()
  _write_lock(tmp_path, pid=dead.pid)
  with workdir_lock.Lock(str(tmp_path), "bertjax pretrain"):
    assert json.loads((tmp_path / workdir_lock.LOCK_NAME).read_text())["pid"] == os.getpid()
  assert f"taking over the stale lock" in capsys.readouterr().err
  # A live pid whose start time differs is a reused pid: the holder is gone too.
  _write_lock(tmp_path, pid=os.getpid(), start_ticks="1")
  with workdir_lock.Lock(str(tmp_path), "bertjax pretrain"):
    pass
  # Another host's lock cannot be checked from here: refused.
  _write_lock(tmp_path, pid=1, host="elsewhere")
  with pytest.raises(workdir_lock.WorkdirBusyError, match="on elsewhere"):
    workdir_lock.Lock(str(tmp_path), "bertjax pretrain").acquire()


@pytest.mark.slow
def test_pretrain_on_a_busy_workdir_is_one_line_and_writes_nothing(tmp_path):
  """The CLI's answer to a held lock: exit 2, one line, no config.json or metrics written."""
  wd = tmp_path / "run"
  wd.mkdir()
  with workdir_lock.Lock(str(wd), "bertjax pretrain"):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "bertjax.cli",
            "pretrain",
            "--config",
            "experiments/pretrain.py:tiny",
            "--workdir",
            str(wd),
            "--config.data.source=synthetic",
            "--config.train.steps=2",
        ],
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
  assert r.returncode == 2, r.stderr[-2000:]
  last = r.stderr.strip().splitlines()[-1]
  assert last.startswith("bertjax pretrain: ") and "is in use by `bertjax pretrain`" in last
  assert "Traceback" not in r.stderr
  assert sorted(p.name for p in wd.iterdir()) == []


def test_prepare_into_a_directory_being_prepared_is_refused(tmp_path):
  from bertjax.data import prepare

  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  corpus = tmp_path / "c.txt"
  corpus.write_text("One sentence here. And another one.\n\nA second document. It ends.\n")
  cfg = prepare.PrepareConfig(
      output=str(tmp_path / "out"),
      inputs=(str(corpus),),
      tokenizer=os.path.join(repo, "data", "tokenizer.model"),
      processes=1,
      progress=False,
  )
  with workdir_lock.Lock(cfg.output, "bertjax prepare", name=".prepare-0.lock"):
    with pytest.raises(workdir_lock.WorkdirBusyError, match="in use by `bertjax prepare`"):
      prepare.prepare(cfg)
  assert prepare.prepare(cfg)["documents"] == 2
  assert not (tmp_path / "out" / ".prepare-0.lock").exists()


# Object stores: the same lock through tensorstore's conditional writes. Its `file://` driver
# keeps the generations GCS keeps (a write conditioned on "absent" or on the generation read),
# so these tests run the object-store code path on a local directory.


def _url(d) -> str:
  return f"file://{d}"


def _read_remote(d) -> dict:
  return json.loads((d / workdir_lock.LOCK_NAME).read_text())


def test_an_object_store_lock_is_created_once_and_removed(tmp_path):
  with workdir_lock.Lock(_url(tmp_path), "bertjax pretrain"):
    holder = _read_remote(tmp_path)
    assert holder["pid"] == os.getpid() and holder["renewed"] > 0
    with pytest.raises(workdir_lock.WorkdirBusyError, match=r"in use by `bertjax pretrain` \("):
      workdir_lock.Lock(_url(tmp_path), "bertjax pretrain").acquire()
  assert not (tmp_path / workdir_lock.LOCK_NAME).exists()


def test_of_many_racing_for_an_object_store_lock_exactly_one_wins(tmp_path):
  import threading

  locks = [workdir_lock.Lock(_url(tmp_path), f"run {i}") for i in range(8)]
  results, start = [None] * len(locks), threading.Barrier(len(locks))

  def take(i):
    start.wait()
    try:
      locks[i].acquire()
      results[i] = "won"
    except workdir_lock.WorkdirBusyError:
      results[i] = "refused"

  threads = [threading.Thread(target=take, args=(i,)) for i in range(len(locks))]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert sorted(results) == ["refused"] * (len(locks) - 1) + ["won"], results
  winner = locks[results.index("won")]
  assert _read_remote(tmp_path)["command"] == winner.command
  winner.release()
  assert not (tmp_path / workdir_lock.LOCK_NAME).exists()


@pytest.mark.process
def test_object_store_locks_of_the_dead_and_of_silent_hosts_are_taken_over(tmp_path, capsys):
  import time

  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()
  _write_lock(tmp_path, pid=dead.pid, renewed=time.time())
  with workdir_lock.Lock(_url(tmp_path), "bertjax pretrain"):
    assert _read_remote(tmp_path)["pid"] == os.getpid()
  assert "taking over the stale lock" in capsys.readouterr().err
  # Another host, renewed lately: refused; not renewed for longer than STALE_S: taken over.
  _write_lock(tmp_path, pid=1, host="elsewhere", renewed=time.time() - 5)
  with pytest.raises(workdir_lock.WorkdirBusyError, match="on elsewhere.*renewed 5s ago"):
    workdir_lock.Lock(_url(tmp_path), "bertjax pretrain").acquire()
  _write_lock(tmp_path, pid=1, host="elsewhere", renewed=time.time() - workdir_lock.STALE_S - 60)
  with workdir_lock.Lock(_url(tmp_path), "bertjax pretrain"):
    assert _read_remote(tmp_path)["host"] == socket.gethostname()
  assert "not renewed for 11 min" in capsys.readouterr().err


def test_an_object_store_lock_is_renewed_and_a_lost_one_is_not_removed(tmp_path, monkeypatch):
  import time

  monkeypatch.setattr(workdir_lock, "RENEW_S", 0.05)
  lock = workdir_lock.Lock(_url(tmp_path), "bertjax pretrain")
  lock.acquire()
  first = _read_remote(tmp_path)["renewed"]
  deadline = time.time() + 30
  while _read_remote(tmp_path)["renewed"] == first and time.time() < deadline:
    time.sleep(0.05)
  assert _read_remote(tmp_path)["renewed"] > first
  monkeypatch.setattr(workdir_lock, "RENEW_S", 3600.0)
  time.sleep(0.5)  # the renewer finishes its round and waits
  # Another process takes it over (as after a long network outage): the release leaves its lock.
  import tensorstore as ts

  other = dict(host="elsewhere", pid=1, started="then", command="bertjax pretrain")
  store = ts.KvStore.open(_url(tmp_path) + "/").result()
  store.write(workdir_lock.LOCK_NAME, json.dumps(dict(other, renewed=time.time()))).result()
  lock.release()
  assert _read_remote(tmp_path)["host"] == "elsewhere"
