"""`bertjax compile`: the train step compiles ahead of time for a mesh and reports memory."""

from bertjax.commands import compile as compile_cmd
from tests.test_checkpoint import REPO

ARGS = ["--config", str(REPO / "experiments" / "pretrain.py") + ":tiny",
        "--config.data.source=synthetic", "--config.model.vocab_size=1000",
        "--config.data.seq_len=32", "--config.data.max_predictions_per_seq=5",
        "--config.train.batch_size=16"]


def test_compile_reports_memory_and_fails_when_too_big(capsys):
  assert compile_cmd.main(ARGS + ["--mesh", "data=1,fsdp=4,tensor=2", "--devices", "8"]) == 0
  out = capsys.readouterr().out
  assert "mesh {'data': 1, 'fsdp': 4, 'tensor': 2} on 8 x cpu" in out
  assert "per device:" in out and "peak ~" in out
  rc = compile_cmd.main(ARGS + ["--mesh", "data=8,fsdp=1", "--device_memory_gb", "0.0001"])
  assert rc == 1
  assert "DOES NOT FIT" in capsys.readouterr().err
