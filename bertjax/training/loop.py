"""`train_and_evaluate(config, workdir)`: the pretraining loop, top to bottom.

Sections: config and data, mesh and state (init / resume / init_from), input pipeline,
the loop (step, metrics one step late, guard, logs, evals, checkpoints, preemption), final
save. Two-phase runs (BERT's seq 128 -> 512) switch phase inside the loop: the pipeline is
rebuilt for the new length and batch, the state carries over, and a resume in either phase
restarts that phase's stream where the checkpoint left it.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import os
import sys
import time

import jax
import numpy as np

from bertjax import errors
from bertjax import model as model_lib
from bertjax.data import bundled, prefetch, pretraining, records
from bertjax.data.tokenizer import MASK_ID
from bertjax.runtime import distributed, fs, workdir_lock
from bertjax.training import (
    checkpoint,
    config_checks,
    flops,
    losses,
    metrics_writer,
    optim,
    sharding,
    train,
)
from bertjax.training.phases import Phase, phase_config, phases

# ----------------------------------------------------------------------------- config and data


def resolve_config(config, workdir: str):
  """Fill what the config leaves open: data path (bundled corpus), vocab size, tokenizer."""
  c = config.copy_and_resolve_references()
  with c.unlocked():
    if c.data.source == "prepared":
      if not c.data.path:
        c.data.path = bundled.prepared_dir(workdir)
      meta = config_checks.read_metadata(c.data.path)
      config_checks.check_data(c, meta)
      c.model.vocab_size = meta["tokenizer"]["vocab_size"]
      c.data.tokenizer = c.data.tokenizer or str(fs.path(c.data.path) / meta["tokenizer"]["file"])
    elif c.data.source == "synthetic":
      c.model.vocab_size = c.model.vocab_size or 8000
    else:
      raise errors.ConfigError(f"config.data.source={c.data.source!r}: valid: prepared, synthetic")
  return c


@functools.lru_cache(maxsize=None)  # said once per run
def input_workers(workers: int | None) -> int:
  """config.data.workers, or by default half the host's cores (the rest run the loop, tf.data's
  reader and XLA's host work), at most 32; 0 or 1 builds the examples in this process."""
  if workers is None:
    cores = os.cpu_count() or 1
    workers = min(32, cores // 2)
    print(
        f"data: {workers} input worker process(es) (half of {cores} cores; "
        "config.data.workers sets it)",
        flush=True,
    )
  return workers


def _held_out(config, split: str, name: str, default):
  """config.eval.NAME for the held-out stream when set, else the training data's value: runs
  that train on different data (masking rate, pairs, packing, seed) can then be scored on the
  same masked examples (experiments/modern.py)."""
  value = config.eval.get(name) if split == "eval" else None
  return default if value is None else value


def make_stream(config, phase: Phase, state: dict | None, split: str = "train"):
  d = config.data
  seed = _held_out(config, split, "seed", config.seed)
  seed += 1000 if split == "eval" and d.source == "synthetic" else 0
  cfg = pretraining.InputConfig(
      source=d.source,
      path=d.path or "",
      seq_len=phase.seq_len,
      max_predictions_per_seq=phase.max_predictions,
      pair_mode=_held_out(config, split, "pair_mode", d.pair_mode),
      mask_prob=_held_out(config, split, "mask_prob", d.mask_prob),
      seed=seed,
      vocab_size=config.model.vocab_size,
      packing=_held_out(config, split, "packing", d.get("packing", False)),
      max_examples_per_row=d.get("max_examples_per_row", 8),
      # Evaluation streams are short: worker processes would cost more to start than they save.
      workers=input_workers(d.get("workers")) if split == "train" else 0,
  )
  stream = pretraining.make_stream(
      cfg,
      global_batch_size=phase.batch_size if split == "train" else config.eval.batch_size,
      process_index=jax.process_index(),
      process_count=jax.process_count(),
      state=state,
      split=split,
  )
  return stream


# ----------------------------------------------------------------------------- helpers


def _meta(
    config,
    setup: train.Setup,
    step: int,
    tokenizer_rel: str | None,
    metrics_partial: dict,
    progress: dict | None = None,
) -> dict:
  return dict(
      bert_config=setup.bert_config.to_dict(),
      step=int(step),
      tokenizer=tokenizer_rel,
      optimizer=config.train.optimizer,
      config=json.loads(config.to_json_best_effort()),
      metrics_partial=metrics_partial,
      progress=progress,
  )


def _copy_tokenizer(config, workdir: str) -> str | None:
  if not config.data.tokenizer:
    return None
  src = fs.path(config.data.tokenizer)
  rel = f"tokenizer/{src.name}"
  if jax.process_index() == 0:
    (fs.path(workdir) / "tokenizer").mkdir(parents=True, exist_ok=True)
    src.copy(fs.path(workdir) / rel, overwrite=True)
    # A WordPiece vocab.txt does not record its casing; prepare writes it beside the vocab.
    casing = src.parent / "tokenizer_config.json"
    if src.suffix == ".txt" and casing.exists():
      casing.copy(fs.path(workdir) / "tokenizer" / casing.name, overwrite=True)
  return rel


def _init_from(setup: train.Setup, state: train.TrainState, path: str) -> train.TrainState:
  """Replace freshly initialised params with a pretrained checkpoint's (continue pretraining)."""
  pre = checkpoint.load_pretrained(path)
  checkpoint.check_compatible(
      dict(pre.config.to_dict(), scan_layers=setup.bert_config.scan_layers), setup.bert_config, path
  )
  params = pre.params
  if setup.bert_config.scan_layers:
    params = model_lib.stack_layer_params(params, setup.bert_config.num_layers)
  params = jax.device_put(jax.tree.map(np.asarray, params), setup.state_shardings.params)
  return state.replace(params=params)


def _data_state(config, saved: list | None, writer) -> dict | None:
  """This process's saved input position; adapted when the number of processes changed."""
  if not saved:
    return None
  first = saved[0]
  # States of several processes saved before the hosts shared blocks out go to resume_states,
  # which says why they cannot carry over.
  if len(saved) == jax.process_count() and (len(saved) == 1 or "untouched_from" in first["stream"]):
    return saved[jax.process_index()]
  if config.data.source == "synthetic":  # batch s is f(seed, s) for any host count
    return {"phase": first["phase"], "stream": {"step": first["stream"]["step"]}}
  try:
    states, what = pretraining.resume_states([s["stream"] for s in saved], jax.process_count())
  except errors.ConfigError as e:
    writer.log(
        f"warning: the checkpoint's input position was saved by {len(saved)} processes "
        f"and cannot carry over to {jax.process_count()} ({e}); the input stream restarts"
    )
    return None
  writer.log(
      f"input: the position saved by {len(saved)} process(es) carries over to "
      f"{jax.process_count()}: {what}"
  )
  return {"phase": first["phase"], "stream": states[jax.process_index()]}


def evaluate(config, setup: train.Setup, params, phase: Phase) -> dict[str, float]:
  """Held-out MLM/NSP metrics over config.eval.steps batches, `eval_` prefixed."""
  stream = make_stream(config, phase, None, split="eval")
  mask_id = _mask_id(config)
  totals, target_counts = None, collections.Counter()
  for _ in range(config.eval.steps):
    host_batch = next(stream)
    host_batch["at_mask"] = np.asarray(losses.at_mask_token(host_batch, mask_id))
    # This process's targets there, for the best constant guess below.
    target_counts.update(host_batch["masked_ids"][host_batch["at_mask"] > 0].tolist())
    sums = setup.eval_step(params, prefetch.global_batch(host_batch, setup.batch_sharding))
    totals = sums if totals is None else jax.tree.map(lambda a, b: a + b, totals, sums)
  out = {f"eval_{k}": float(v) for k, v in losses.finalize(jax.device_get(totals)).items()}
  # The best constant guess at the same positions: the most frequent target there. A model
  # that has not learned to use context (the unigram plateau) scores about this.
  n = sum(target_counts.values())
  out["eval_mask_constant_accuracy"] = target_counts.most_common(1)[0][1] / n if n else 0.0
  return out


def _has_eval_data(config, writer) -> bool:
  """False (with one warning) when the prepared data holds no held-out documents. Any number
  of held-out files serves any number of processes (each reads blocks of all of them)."""
  if config.data.source != "prepared":
    return True

  if records.split_shards(records.load_metadata(config.data.path), config.data.path, "eval"):
    return True
  writer.log(
      f"warning: {config.data.path} holds no held-out documents: training without held-out "
      "evaluation. `bertjax prepare --eval-fraction F` writes them; "
      "--config.eval.every_steps=0 silences this"
  )
  return False


def _mask_id(config) -> int:
  """The [MASK] id of the stream: the prepared data's tokenizer's, or SentencePiece's."""
  if config.data.source != "prepared":
    return MASK_ID

  return records.special_ids(records.load_metadata(config.data.path))["mask"]


class _Meter:
  """Host-side averages over one log interval, plus throughput, MFU and ETA.

  Every step's metrics count, the first after a (re)compile included; only the timing leaves
  that step out. The running sums travel in the checkpoint (`partial`), so after a resume an
  interval averages the same steps as in an uninterrupted run.
  """

  def __init__(self, config, bert_config, phase: Phase, partial: dict | None = None):
    self.peak = config.peak_flops_per_device or flops.peak_flops_per_device()
    self.sums = dict(partial["sums"]) if partial else {}
    self.count = int(partial["count"]) if partial else 0
    self.set_phase(bert_config, phase)

  def set_phase(self, bert_config, phase: Phase) -> None:
    self.phase = phase
    self.flops = flops.pretraining_flops_per_step(
        bert_config, phase.batch_size, phase.seq_len, phase.max_predictions
    )
    self.t0, self.timed = None, 0

  def add(self, m: dict) -> None:
    for k, v in m.items():
      self.sums[k] = self.sums.get(k, 0.0) + v
    self.count += 1
    if self.t0 is None:  # the first step's time is mostly compilation: start timing after it
      self.t0 = time.perf_counter()
    else:
      self.timed += 1

  def partial(self) -> dict:
    return {"sums": dict(self.sums), "count": self.count}

  def exclude(self, seconds: float) -> None:
    """Leave time spent outside training steps (evals) out of the throughput."""
    if self.t0 is not None:
      self.t0 += seconds

  def summary(self, step: int, total: int) -> dict:
    if not self.count:
      return {}
    out = {k: v / self.count for k, v in self.sums.items()}
    self.sums, self.count = {}, 0
    if self.timed:
      now = time.perf_counter()
      dt = (now - self.t0) / self.timed
      self.t0, self.timed = now, 0
      ph = self.phase
      # Examples (not rows) and real tokens (not padding): packed and unpacked runs compare.
      out.update(
          seq_per_sec=ph.batch_size * out.get("examples_per_row", 1.0) / dt,
          tokens_per_sec=ph.batch_size * ph.seq_len * out.get("real_token_fraction", 1.0) / dt,
          step_time_sec=dt,
          eta_sec=(total - step) * dt,
      )
      out["mfu"] = self.flops / dt / (jax.device_count() * self.peak) if self.peak else None
    return out


class _TimeToTarget:
  """Tokens trained and wall time so far (summed over resumes), and the first evaluation whose
  held-out MLM accuracy reaches `config.eval.target_mlm_accuracy`: MLPerf's time to train.

  Tokens are real (not padding) tokens of the steps applied; wall time runs from the start of
  the loop (the first step's compilation and the evaluations included) to the end of the
  evaluation that reached the target. Both travel in the checkpoint (`progress`).
  """

  def __init__(self, config, plan: list[Phase], saved: dict | None):
    self.target = config.eval.get("target_mlm_accuracy")
    self.stop = bool(config.eval.get("stop_at_target", False)) and self.target is not None
    self.plan = plan
    saved = saved or {}
    self.tokens = float(saved.get("tokens", 0.0))
    self.wall0 = float(saved.get("wall_s", 0.0))
    self.reached = saved.get("time_to_target")
    self.t0 = time.perf_counter()

  def start(self) -> None:
    self.t0 = time.perf_counter()

  def wall_s(self) -> float:
    return self.wall0 + time.perf_counter() - self.t0

  def add(self, at: int, m: dict) -> None:
    """Step `at` (1-based) was applied: count its real tokens at its phase's shape."""
    ph = next((ph for ph in self.plan if ph.start < at <= ph.end), self.plan[-1])
    self.tokens += ph.batch_size * ph.seq_len * m.get("real_token_fraction", 1.0)

  def state(self) -> dict:
    return {"tokens": self.tokens, "wall_s": self.wall_s(), "time_to_target": self.reached}

  def check(self, step: int, ev: dict) -> bool:
    """True the first time an evaluation reaches the target."""
    if self.target is None or self.reached is not None:
      return False
    if ev.get("eval_mlm_accuracy", -1.0) < self.target:
      return False
    self.reached = {
        "step": int(step),
        "wall_s": round(self.wall_s(), 3),
        "tokens": int(self.tokens),
    }
    return True

  def line(self) -> str:
    return metrics_writer.time_to_target_line(self.target, self.reached)


# ----------------------------------------------------------------------------- the loop


def train_and_evaluate(config, workdir: str) -> int:
  """Pretrain per `config` in `workdir`, resuming from its latest checkpoint. Exit status.

  The config and the files it names are checked first (`bertjax.errors.UserError`s, nothing
  written, no directory created), then the workdir's lock is taken (one run per workdir) for
  the whole run.
  """
  config_checks.validate(config)
  config_checks.preflight(config)
  workdir = str(fs.absolute(workdir))  # orbax writes only to absolute paths; gs:// stays
  config_checks.check_inputs(config, workdir)
  with workdir_lock.Lock(workdir, "bertjax pretrain", enabled=jax.process_index() == 0):
    try:
      return _train_and_evaluate(config, workdir)
    except checkpoint.DiskFullError as e:
      print(f"bertjax pretrain: {e}", file=sys.stderr, flush=True)
      return 1


def _train_and_evaluate(config, workdir: str) -> int:
  # --- config, mesh --------------------------------------------------------------------------
  config = resolve_config(config, workdir)
  mesh = sharding.mesh_from_config(config.mesh)
  plan = phases(config)
  total = config.train.steps
  for ph in plan:
    sharding.check_batch_size(
        ph.batch_size,
        mesh,
        ph.microbatches,
        "config.train.batch_size" if ph.index == 0 else "config.phase2.batch_size",
    )
  is_main = jax.process_index() == 0
  setups = {ph.index: train.setup(phase_config(config, ph), mesh) for ph in plan}
  setup0 = setups[0]

  # --- a resume must match the checkpoint before anything of this run is written ------------
  ck = config.checkpoint
  mngr = checkpoint.Manager(workdir, ck.every_steps, ck.max_to_keep, ck.keep_period, ck.async_save)

  def check(meta: dict, where: str) -> None:
    checkpoint.check_compatible(
        meta["bert_config"],
        setup0.bert_config,
        where,
        meta.get("optimizer"),
        config.train.optimizer,
    )

  restored = mngr.restore_newest_good(
      setup0.abstract_state, check, log=print if is_main else lambda _: None
  )
  latest = restored.step if restored else None
  # metrics.jsonl keeps exactly the records of the steps the checkpoint holds.
  writer = metrics_writer.MetricsWriter(
      workdir,
      enabled=is_main,
      tensorboard=config.get("tensorboard", True),
      keep_through=latest or 0,
  )
  if is_main:
    (fs.path(workdir) / "config.json").write_text(config.to_json_best_effort(indent=2))
  writer.log(
      f"model: {config.model.preset} {model_lib.count_params(setup0.abstract_state.params):,} "
      f"params | mesh {dict(mesh.shape)} on {jax.device_count()} {jax.devices()[0].platform} "
      f"devices, {jax.process_count()} process(es) | workdir {workdir}"
  )

  # --- state: resume, init_from, or fresh ------------------------------------------------
  tokenizer_rel = _copy_tokenizer(config, workdir)
  data_state = None
  if restored:
    state = restored.state
    data_state = _data_state(config, restored.data_states, writer)
    writer.log(f"resumed from {mngr.directory / str(latest)}")
  else:
    state = setup0.init_state(config.seed)
    if config.train.init_from:
      state = _init_from(setup0, state, config.train.init_from)
      writer.log(f"initialised params from {config.train.init_from}")
  step = int(jax.device_get(state.step))

  # --- input pipeline for the current phase ----------------------------------------------
  def open_phase(ph: Phase, saved: dict | None):
    s = saved["stream"] if saved and saved.get("phase") == ph.index else None
    stream = make_stream(config, ph, s)
    return prefetch.prefetch_to_device(
        stream, setups[ph.index].batch_sharding, config.data.prefetch
    )

  phase = next((ph for ph in plan if ph.start <= step < ph.end), plan[-1])
  batches = open_phase(phase, data_state)
  meter = _Meter(
      config,
      setups[phase.index].bert_config,
      phase,
      restored.meta.get("metrics_partial") if restored else None,
  )
  eval_on = config.eval.every_steps > 0 and config.eval.steps > 0 and _has_eval_data(config, writer)
  clock = _TimeToTarget(config, plan, restored.meta.get("progress") if restored else None)
  watcher = distributed.PreemptionWatcher()
  bad_steps, pending, last_saved, start_step = 0, None, step, step
  log_at = {1, total} | {ph.end for ph in plan}  # besides every log_every_steps

  def save(at: int, force: bool) -> None:
    nonlocal last_saved
    if at == last_saved:
      return
    last_saved = at
    writer.flush()  # the records of the steps this checkpoint holds are stored before it
    data = checkpoint.gather_json({"phase": phase.index, "stream": batches.get_state()})
    mngr.save(
        at,
        state,
        data,
        _meta(config, setups[phase.index], at, tokenizer_rel, meter.partial(), clock.state()),
        force=force,
    )

  def read(p) -> bool:  # metrics of the previous step; False stops the run
    nonlocal bad_steps
    at, m = p[0], {k: float(v) for k, v in jax.device_get(p[1]).items()}
    if not m.pop("finite"):
      bad_steps += 1
      writer.log(
          f"step {at}: non-finite loss {m['loss']} or gradient norm {m['grad_norm']}: "
          f"update skipped ({bad_steps}/{config.train.max_bad_steps} allowed)"
      )
      if bad_steps > config.train.max_bad_steps:
        writer.log(
            f"stopping: {bad_steps} non-finite step(s); nothing after the last "
            f"checkpoint ({mngr.latest_step()}) was saved. Lower "
            "config.train.learning_rate, check the data, or allow skips with "
            "config.train.max_bad_steps=K"
        )
        return False
      return True
    meter.add(m)
    clock.add(at, m)
    if at % config.log_every_steps == 0 or at in log_at:
      s = meter.summary(at, total)
      if s:
        writer.log(metrics_writer.progress_line(at, total, _shown(s)))
        writer.write(at, s)
    return True

  def _shown(m: dict, split: str = "train") -> dict:  # printed lines leave out a pair task
    # the run does not train (or, for held-out lines, does not evaluate: config.eval.pair_mode)
    if _held_out(config, split, "pair_mode", config.data.pair_mode) != "none":
      return m
    return {k: v for k, v in m.items() if not k.removeprefix("eval_").startswith("nsp_")}

  def stop(status: int) -> int:
    batches.close()
    mngr.close()
    writer.close()
    return status

  def run_eval() -> bool:  # held-out metrics now; True when they first reach the target
    ev = evaluate(config, setups[phase.index], state.params, phase)
    writer.log(
        f"eval step {step}: "
        + " | ".join(f"{k[5:]} {v:.4f}" for k, v in _shown(ev, "eval").items())
    )
    reached = clock.check(step, ev)
    if reached:
      writer.log(clock.line())
      ev = dict(ev, time_to_target=clock.reached)
    writer.write(step, ev)
    return reached

  # --- the loop ---------------------------------------------------------------------------
  writer.log(
      f"training steps {step}..{total} | phase {phase.index}: seq {phase.seq_len}, "
      f"batch {phase.batch_size}"
  )
  if clock.stop and clock.reached is not None:
    writer.log(f"{clock.line()}; config.eval.stop_at_target: nothing left to train")
  clock.start()
  while step < total and not (clock.stop and clock.reached is not None):
    if step >= phase.end:  # phase switch: new length and batch, same state
      batches.close()
      phase = plan[phase.index + 1]
      batches = open_phase(phase, None)
      meter.set_phase(setups[phase.index].bert_config, phase)
      writer.log(
          f"phase {phase.index}: seq {phase.seq_len}, batch {phase.batch_size}, "
          f"{phase.max_predictions} predictions, from step {step}"
      )
    state, metrics = setups[phase.index].train_step(state, next(batches))
    step += 1
    if pending is not None and not read(pending):  # one step late: the device stays busy
      return stop(1)
    pending = (step, metrics)
    if eval_on and step % config.eval.every_steps == 0:
      if clock.target is not None:  # this step's tokens count toward the target: read it now
        ok, pending = pending is None or read(pending), None
        if not ok:
          return stop(1)
      t_eval = time.perf_counter()
      if run_eval() and clock.stop:
        writer.log(f"stopping at step {step}: config.eval.stop_at_target")
        break
      meter.exclude(time.perf_counter() - t_eval)
    checkpoint_now = step % ck.every_steps == 0 and step < total
    preempted = watcher.should_stop(step)
    if checkpoint_now or preempted:
      # The checkpoint holds this step's metrics too: a resume neither repeats nor loses them
      # (already read when an evaluation timed to a target ran at this step).
      ok, pending = pending is None or read(pending), None
      if not ok:
        return stop(1)
      save(step, force=True)
    if preempted:
      mngr.wait()
      writer.log(
          f"preempted: saved step {step} to {mngr.directory}; rerun the same command " "to resume"
      )
      return stop(0)
  ok = pending is None or read(pending)
  if ok:
    save(step, force=True)
  mngr.wait()
  if ok and eval_on and step % config.eval.every_steps and step > start_step:
    run_eval()
  if clock.target is not None and step > start_step:
    writer.write(step, {"time_to_target": clock.reached})  # null: not reached
  writer.log(
      f"done: checkpoints in {mngr.directory}, TensorBoard logs in "
      f"{fs.path(workdir) / 'tensorboard'}, metrics in "
      f"{fs.path(workdir) / 'metrics.jsonl'}"
      + (f" | {clock.line()}" if clock.target is not None else "")
  )
  return stop(0 if ok else 1)
