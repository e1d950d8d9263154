"""The CLI's glibc allocator settings: when they apply, the re-exec, and that they stop the
page faults they are for (fresh mmap'd buffers for XLA's large allocations on every run)."""

import json
import os
import platform
import subprocess
import sys

import pytest

from bertjax import cli
from bertjax.runtime import host_malloc

LINUX = dict(system="Linux", libc="glibc", accelerator_present=False)


@pytest.mark.parametrize(
    "env, kw, expected",
    [
        ({}, {}, True),
        ({"JAX_PLATFORMS": "cpu"}, {"accelerator_present": True}, True),
        ({}, {"accelerator_present": True}, False),
        ({"JAX_PLATFORMS": "cuda"}, {}, False),
        ({"JAX_PLATFORMS": "tpu,cpu"}, {}, False),
        ({"BERTJAX_MALLOC_TUNING": "1"}, {"accelerator_present": True}, True),
        ({"BERTJAX_MALLOC_TUNING": "0"}, {}, False),
        ({"BERTJAX_MALLOC_TUNING": "off"}, {}, False),
        ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"}, {}, False),
        ({"BERTJAX_MALLOC_TUNING": "1", "GLIBC_TUNABLES": "x"}, {}, False),
        ({}, {"system": "Darwin", "libc": ""}, False),
        ({}, {"libc": "musl"}, False),
    ],
)
def test_decide(env, kw, expected):
  apply, why = host_malloc.decide(env, **{**LINUX, **kw})
  assert apply is expected, why
  assert why


def test_decide_rejects_an_unknown_switch_value():
  with pytest.raises(ValueError, match="BERTJAX_MALLOC_TUNING='maybe'; valid: auto, 0, 1"):
    host_malloc.decide({"BERTJAX_MALLOC_TUNING": "maybe"}, **LINUX)


def _fake_execv(monkeypatch):
  calls = []
  monkeypatch.setattr(host_malloc, "_accelerator_present", lambda: False)
  monkeypatch.setattr(host_malloc.platform, "system", lambda: "Linux")
  monkeypatch.setattr(host_malloc.platform, "libc_ver", lambda: ("glibc", "2.36"))
  monkeypatch.setattr(host_malloc.os, "execv", lambda path, args: calls.append((path, args)))
  for k in ("GLIBC_TUNABLES", "BERTJAX_MALLOC_TUNING", "JAX_PLATFORMS"):
    monkeypatch.setenv(k, "")  # records the old state, so teardown restores it
    monkeypatch.delenv(k)
  return calls


def test_the_console_entry_point_reexecutes_with_the_tunables(monkeypatch):
  calls = _fake_execv(monkeypatch)
  monkeypatch.setattr(sys, "argv", ["bertjax", "bench", "--help"])
  with pytest.raises(SystemExit):  # the (not replaced) process goes on to print the help
    cli.main()
  assert calls == [(sys.executable, [sys.executable, *sys.orig_argv[1:]])]
  assert os.environ["GLIBC_TUNABLES"] == host_malloc.TUNABLES


def test_only_commands_that_run_xla_qualify():
  assert host_malloc.runs_xla("pretrain", []) and host_malloc.runs_xla("bench", ["--json"])
  assert not host_malloc.runs_xla("bench", ["input", "--copies", "2"])
  assert not host_malloc.runs_xla("tokenizer", [])


@pytest.mark.parametrize("argv", [["bench", "--help"], ["tokenizer", "--help"]])
def test_calls_from_python_and_data_commands_never_reexecute(monkeypatch, argv):
  calls = _fake_execv(monkeypatch)
  with pytest.raises(SystemExit):
    cli.main(argv)  # called from Python code (tests, notebooks): never replace the process
  monkeypatch.setattr(sys, "argv", ["bertjax", "tokenizer", "--help"])
  with pytest.raises(SystemExit):
    cli.main()  # a data-only command from the console: glibc's defaults
  assert calls == []
  assert "GLIBC_TUNABLES" not in os.environ


CHILD = r"""
import json, os, resource
from bertjax.runtime import host_malloc
host_malloc.maybe_reexec("bench", [])
import jax, jax.numpy as jnp
x = jnp.ones((4096, 4096), jnp.float32)
v = jnp.ones((4096,), jnp.float32)
# The flipped copy is a 64 MiB temporary of the program, allocated afresh on every run (as a
# train step's activations are); glibc maps anything this big from a fresh mmap by default.
f = jax.jit(lambda x, v: jnp.flip(x * 2.0, 0) @ v)
for _ in range(3):
  f(x, v).block_until_ready()
faults = []
for _ in range(12):
  r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  f(x, v).block_until_ready()
  faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0)
print(json.dumps({"tunables": os.environ.get("GLIBC_TUNABLES"), "faults": faults}))
"""


@pytest.mark.slow
@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc tunables only"
)
def test_the_tunables_stop_the_page_faults_of_large_buffers():
  pages = 4096 * 4096 * 4 // os.sysconf("SC_PAGE_SIZE")
  results = {}
  for switch in ("auto", "0"):
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "XLA_FLAGS")}
    env.update(BERTJAX_MALLOC_TUNING=switch, JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    results[switch] = json.loads(out.stdout.strip().splitlines()[-1])
  assert results["auto"]["tunables"] == host_malloc.TUNABLES  # the child re-executed itself
  assert results["0"]["tunables"] is None
  # glibc's defaults: the 64 MiB temporary is mapped and faulted in afresh on every run. With
  # the tunables the freed buffer stays in the heap and is reused (the first few runs can still
  # grow the heap while its free chunks settle; a train step showed no faults after two steps).
  assert min(results["0"]["faults"]) > 0.9 * pages, results
  assert min(results["auto"]["faults"]) < 0.05 * pages, results
