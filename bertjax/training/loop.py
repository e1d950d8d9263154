"""`train_and_evaluate(config, workdir)`: the pretraining loop, top to bottom.

`config_checks.preflight` checks the config and the files it names and returns a `Plan` (the
resolved config, the mesh, the phases, the data's metadata); `_train_and_evaluate` runs it in
its banner sections — data, the resume check, state and stream, the loop, the final save — on a
`_Run` that owns the state, the batch stream, the metrics not read yet, the meter and the clock
(`step`, `drain`, `evaluate`, `save`). Metrics are read one step late so the device stays busy.
Two-phase runs (BERT's seq 128 -> 512) switch phase inside `step`: the stream is rebuilt for
the new length and batch, the state carries over, and a resume in either phase restarts that
phase's stream where the checkpoint left it.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

import jax

from bertjax import errors
from bertjax import model as model_lib
from bertjax.data import bundled, mixture, pairs, prefetch, pretraining
from bertjax.runtime import distributed, fs, workdir_lock
from bertjax.training import (
    checkpoint,
    config_checks,
    init_from as init_from_lib,
    metrics_writer,
    objective as objective_lib,
    pretrained,
    progress,
    streams,
    train,
)
from bertjax.training.phases import Phase, phase_config

# ----------------------------------------------------------------------------- config and data


def make_stream(config, phase: Phase, state: dict | None, split: str = "train"):
  """config.objective's stream of `phase` (`Objective.stream`), train or held out."""
  c = config
  if not config.model.get("vocab_size"):  # the stream reads no network: a stand-in width
    c = config.copy_and_resolve_references()
    with c.unlocked():
      c.model.vocab_size = 8000
  return objective_lib.make(c, train.model_config(c)).stream(config, phase, state, split)


def evaluate(config, setup: train.Setup, params, phase: Phase, meta: dict | None) -> dict:
  """The objective's held-out metrics, `eval_` prefixed (`Objective.evaluate`)."""
  return setup.objective.evaluate(config, setup, params, phase, meta)


_held_out = streams.held_out  # the names the tests read them by
_has_eval_data = streams.mlm_has_eval_data

# ----------------------------------------------------------------------------- helpers


def source_names(config) -> list[str]:
  """The names `tokens_by_source` counts under: a mixture's sources, else the one dataset's
  directory name ("bundled": the bundled corpus; "synthetic")."""
  sources = mixture.parse_sources(config.data.get("sources"))
  if sources:
    return [s.name for s in sources]
  if config.data.source == "synthetic":
    return ["synthetic"]
  return [fs.path(config.data.path).name if config.data.path else "bundled"]


def _meta(
    config,
    setup: train.Setup,
    step: int,
    tokenizer_rel: str | None,
    metrics_partial: dict,
    progress: dict | None = None,
    untrained_heads=(),
    data_meta: dict | None = None,
) -> dict:
  return dict(
      untrained_heads=sorted(untrained_heads),  # never exported as trained (`bertjax convert`)
      bert_config=setup.bert_config.to_dict(),
      **setup.objective.record(),  # `objective`, and ELECTRA's `generator_config`
      # the pair data's prompts (None: not pairs), which the exported embedder applies
      prompts=pairs.prompts_of(data_meta),
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
    # A WordPiece vocab.txt does not record its casing, a tokenizer.json not which of its
    # tokens are [CLS], [SEP], ...: the tokenizer_config.json beside them does.
    casing = src.parent / "tokenizer_config.json"
    if src.suffix in (".txt", ".json") and casing.exists():
      casing.copy(fs.path(workdir) / "tokenizer" / casing.name, overwrite=True)
  return rel


def _data_state(config, saved: list | None, writer) -> dict | None:
  """This process's saved input position; adapted when the number of processes changed."""
  if not saved:
    return None
  first = saved[0]
  if pairs.is_state(first["stream"]):  # the same global state on every host, whatever their count
    try:
      state, what = pairs.resume_state([s["stream"] for s in saved])
    except errors.ConfigError as e:
      writer.log(f"warning: {e}; the input stream restarts")
      return None
    if len(saved) != jax.process_count():
      writer.log(
          f"input: the position saved by {len(saved)} process(es) carries over to "
          f"{jax.process_count()}: {what}"
      )
    return {"phase": first["phase"], "stream": state}
  # States of several processes saved before the hosts shared blocks out go to resume_states,
  # which says why they cannot carry over.
  shared_out = "untouched_from" in first["stream"] or "sources" in first["stream"]
  if len(saved) == jax.process_count() and (len(saved) == 1 or shared_out):
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


# ----------------------------------------------------------------------------- the loop


def train_and_evaluate(config, workdir: str, explicit: frozenset[str] = frozenset()) -> int:
  """Pretrain per `config` in `workdir`, resuming from its latest checkpoint. Exit status.

  The config and the files it names are checked first (`bertjax.errors.UserError`s, nothing
  written, no directory created), then the workdir's lock is taken (one run per workdir) for
  the whole run.
  """
  config_checks.validate(config)
  plan = config_checks.preflight(config, workdir, explicit)
  with workdir_lock.Lock(plan.workdir, "bertjax pretrain", enabled=jax.process_index() == 0):
    try:
      return _train_and_evaluate(plan)
    except checkpoint.DiskFullError as e:
      print(f"bertjax pretrain: {e}", file=sys.stderr, flush=True)
      return 1


class _Run:
  """One run's moving parts: the train state and its step, the phase and its batch stream, the
  metrics of the last step (read one step late, so the device stays busy), the meter and the
  time-to-target clock. `step`, `drain`, `evaluate` and `save` are the loop's verbs; `step` and
  `drain` return False when the run must stop (too many non-finite steps)."""

  def __init__(self, plan, setups, mngr, writer, restored, tokenizer_rel: str | None):
    config = self.config = plan.config
    self.plan, self.phases, self.setups = plan, plan.phases, setups
    self.mngr, self.writer, self.tokenizer_rel = mngr, writer, tokenizer_rel
    data_state = None
    self.untrained = set(train.HEAD_PARAMS)  # a fresh network: no head trained yet
    if restored:
      self.state = restored.state
      data_state = _data_state(config, restored.data_states, writer)
      self.untrained = set(pretrained.untrained_heads(restored.meta))
      writer.log(f"resumed from {mngr.directory / str(restored.step)}")
    else:
      self.state = setups[0].init_state(config.seed)
      if config.train.init_from:
        self.state, fresh = init_from_lib.start(setups[0], self.state, config.train.init_from)
        self.untrained = set(init_from_lib.head_ids(fresh))
        if not setups[0].objective.keeps_source_heads:  # its training leaves them stale
          self.untrained = set(train.HEAD_PARAMS)
        writer.log(
            f"initialised params from {config.train.init_from}"
            + (f" ({', '.join(fresh)} start fresh)" if fresh else "")
            + "; the optimizer and the step start fresh"
        )
    warm_steps, warm_heads = plan.head_warmup
    if warm_heads and int(jax.device_get(self.state.step)) < warm_steps:
      writer.log(
          f"head warm-up: untrained head(s) {', '.join(warm_heads)} train alone until step "
          f"{warm_steps}, then the whole network (config.train.head_warmup_steps; 0: off)"
      )
    self.at = self.start = self.last_saved = int(jax.device_get(self.state.step))
    self.phase = next((ph for ph in self.phases if ph.start <= self.at < ph.end), self.phases[-1])
    self.batches = self._open(self.phase, data_state)
    meta = restored.meta if restored else {}
    self.meter = progress.Meter(
        config, setups[self.phase.index].objective, self.phase, meta.get("metrics_partial")
    )
    self.clock = progress.TimeToTarget(
        config, list(self.phases), meta.get("progress"), source_names(config)
    )
    self.pending, self.bad_steps = None, 0
    self.log_at = {1, config.train.steps} | {ph.end for ph in self.phases}

  @property
  def finished(self) -> bool:
    stopped = self.clock.stop and self.clock.reached is not None
    return self.at >= self.config.train.steps or stopped

  def _open(self, ph: Phase, saved: dict | None):
    s = saved["stream"] if saved and saved.get("phase") == ph.index else None
    stream = self.setups[ph.index].objective.stream(self.config, ph, s)
    for line in streams.describe(stream, self.config, ph):
      self.writer.log(line)
    return prefetch.prefetch_to_device(
        stream, self.setups[ph.index].batch_sharding, self.config.data.prefetch
    )

  def step(self) -> bool:
    """One train step (switching phase first at a phase's end), then the previous step's
    metrics read."""
    if self.at >= self.phase.end:  # phase switch: new length and batch, same state
      self.batches.close()
      self.phase = ph = self.phases[self.phase.index + 1]
      self.batches = self._open(ph, None)
      self.meter.set_phase(self.setups[ph.index].objective, ph)
      self.writer.log(
          f"phase {ph.index}: seq {ph.seq_len}, batch {ph.batch_size}, "
          f"{ph.max_predictions} predictions, from step {self.at}"
      )
    self.state, metrics = self.setups[self.phase.index].train_step(self.state, next(self.batches))
    self.at += 1
    ok = self.drain()
    self.pending = (self.at, metrics)
    return ok

  def drain(self) -> bool:
    """Read the metrics not read yet: logged, metered, a non-finite step counted."""
    if self.pending is None:
      return True
    (at, m), self.pending = self.pending, None
    m = jax.device_get(m)
    by_source = m.pop("tokens_by_source", None)  # a mixture's [N] real tokens per source
    m = {k: float(v) for k, v in m.items()}
    if not m.pop("finite"):
      return self._skipped(at, m)
    self.meter.add(m)
    self.clock.add(at, m, by_source)
    if at % self.config.log_every_steps == 0 or at in self.log_at:
      s = self.meter.summary(at, self.config.train.steps)
      held = (self.batches.get_state() or {}).get("held_back")
      if s and held is not None:  # pairs: rows whose text the batch already held
        state = self.batches.get_state()
        s = dict(s, rows_held_back=float(held), rows_dropped=float(state["dropped"]))
      if s:
        self.writer.log(metrics_writer.progress_line(at, self.config.train.steps, self._shown(s)))
        self.writer.write(at, dict(s, tokens_by_source=self.clock.tokens_by_source()))
    return True

  def _skipped(self, at: int, m: dict) -> bool:
    self.bad_steps += 1
    allowed = self.config.train.max_bad_steps
    self.writer.log(
        f"step {at}: non-finite loss {m['loss']} or gradient norm {m['grad_norm']}: "
        f"update skipped ({self.bad_steps}/{allowed} allowed)"
    )
    if self.bad_steps <= allowed:
      return True
    self.writer.log(
        f"stopping: {self.bad_steps} non-finite step(s); nothing after the last checkpoint "
        f"({self.mngr.latest_step()}) was saved. Lower config.train.learning_rate, check the "
        "data, or allow skips with config.train.max_bad_steps=K"
    )
    return False

  def _shown(self, m: dict, split: str = "train") -> dict:
    """Printed lines leave out a pair task the run does not train (or, for held-out lines,
    does not evaluate: config.eval.pair_mode)."""
    if streams.held_out(self.config, split, "pair_mode", self.config.data.pair_mode) != "none":
      return m
    return {k: v for k, v in m.items() if not k.removeprefix("eval_").startswith("nsp_")}

  def evaluate(self) -> bool:
    """Held-out metrics now, their time left out of the throughput; True when they first reach
    the target."""
    t0 = time.perf_counter()
    ev = evaluate(
        self.config, self.setups[self.phase.index], self.state.params, self.phase, self.plan.meta
    )
    shown = self._shown(ev, "eval")
    self.writer.log(
        f"eval step {self.at}: " + " | ".join(f"{k[5:]} {v:.4f}" for k, v in shown.items())
    )
    reached = self.clock.check(self.at, ev)
    if reached:
      self.writer.log(self.clock.line())
      ev = dict(ev, time_to_target=self.clock.reached)
    self.writer.write(self.at, dict(ev, tokens_by_source=self.clock.tokens_by_source()))
    self.meter.exclude(time.perf_counter() - t0)
    return reached

  def save(self) -> None:
    """Checkpoint this step (once), with the input position, partial metrics and progress."""
    if self.at == self.last_saved:
      return
    self.last_saved = self.at
    self.writer.flush()  # the records of the steps this checkpoint holds are stored before it
    data = distributed.gather_json({"phase": self.phase.index, "stream": self.batches.get_state()})
    meta = _meta(
        self.config,
        self.setups[self.phase.index],
        self.at,
        self.tokenizer_rel,
        self.meter.partial(),
        self.clock.state(),
        self.untrained - set(self.setups[0].objective.trained_heads()),  # it trained a step
        self.plan.meta,
    )
    self.mngr.save(self.at, self.state, data, meta, force=True)

  def close(self, status: int) -> int:
    self.batches.close()
    self.mngr.close()
    self.writer.close()
    return status


def _train_and_evaluate(plan: config_checks.Plan) -> int:
  # --- data: the bundled corpus is prepared into the workdir on first use --------------------
  if plan.config.data.source == "prepared" and plan.meta is None:
    plan = config_checks.with_data(plan, bundled.prepared_dir(plan.workdir))
  config, workdir, is_main = plan.config, plan.workdir, jax.process_index() == 0
  plan = dataclasses.replace(plan, head_warmup=init_from_lib.head_warmup(config))
  setups = {
      ph.index: train.setup(phase_config(config, ph), plan.mesh, plan.head_warmup)
      for ph in plan.phases
  }

  # --- a resume must match the checkpoint before anything of this run is written ------------
  ck = config.checkpoint
  mngr = checkpoint.Manager(workdir, ck.every_steps, ck.max_to_keep, ck.keep_period, ck.async_save)
  check = lambda meta, where: checkpoint.check_compatible(
      meta["bert_config"],
      setups[0].bert_config,
      where,
      meta.get("optimizer"),
      config.train.optimizer,
      meta.get("objective"),
      setups[0].objective.name,
  )
  restored = mngr.restore_newest_good(
      setups[0].abstract_state, check, log=print if is_main else lambda _: None
  )
  # metrics.jsonl keeps exactly the records of the steps the checkpoint holds.
  writer = metrics_writer.MetricsWriter(
      workdir,
      enabled=is_main,
      tensorboard=config.tensorboard,
      keep_through=restored.step if restored else 0,
  )
  if is_main:
    (fs.path(workdir) / "config.json").write_text(config.to_json_best_effort(indent=2))
  for note in plan.notes:
    writer.log(note)
  bc = setups[0].bert_config  # the network built: a preset's, or with --init the checkpoint's
  built = (
      f"the network of {config.train.init_from}" if config.train.init_from else config.model.preset
  )
  writer.log(
      f"model: {built}: {bc.num_layers} layers x {bc.hidden_size}, {bc.num_heads} heads, "
      f"{model_lib.count_params(setups[0].abstract_state.params):,} "
      f"params{setups[0].objective.note()} | mesh {dict(plan.mesh.shape)} on {jax.device_count()} "
      f"{jax.devices()[0].platform} devices, {jax.process_count()} process(es) | workdir {workdir}"
  )

  # --- state (resume, init_from or fresh) and the input stream of its phase ----------------
  run = _Run(plan, setups, mngr, writer, restored, _copy_tokenizer(config, workdir))
  eval_every = config.eval.every_steps if config.eval.steps else 0
  eval_every = (
      eval_every
      if eval_every > 0 and setups[0].objective.has_eval_data(config, plan.meta, writer)
      else 0
  )
  watcher = distributed.PreemptionWatcher()
  if eval_every and config.train.init_from and not restored:
    run.evaluate()  # continued pretraining: the checkpoint's own held-out loss, to compare with

  # --- the loop ---------------------------------------------------------------------------
  writer.log(
      f"training steps {run.at}..{config.train.steps} | phase {run.phase.index}: "
      f"seq {run.phase.seq_len}, batch {run.phase.batch_size}"
  )
  if run.finished and run.clock.stop:
    writer.log(f"{run.clock.line()}; config.eval.stop_at_target: nothing left to train")
  run.clock.start()
  while not run.finished:
    if not run.step():
      return run.close(1)
    if eval_every and run.at % eval_every == 0:
      # This step's tokens count toward a target: its metrics are read before the evaluation.
      if run.clock.target is not None and not run.drain():
        return run.close(1)
      if run.evaluate() and run.clock.stop:
        writer.log(f"stopping at step {run.at}: config.eval.stop_at_target")
        break
    preempted = watcher.should_stop(run.at)
    if (run.at % ck.every_steps == 0 and run.at < config.train.steps) or preempted:
      # The checkpoint holds this step's metrics too: a resume neither repeats nor loses them.
      if not run.drain():
        return run.close(1)
      run.save()
    if preempted:
      mngr.wait()
      writer.log(
          f"preempted: saved step {run.at} to {mngr.directory}; rerun the same command to resume"
      )
      return run.close(0)

  # --- final save, evaluation and summary ----------------------------------------------------
  ok = run.drain()
  if ok:
    run.save()
  mngr.wait()
  trained = run.at > run.start
  if ok and eval_every and run.at % eval_every and trained:
    run.evaluate()
  if run.clock.target is not None and trained:
    writer.write(  # null: not reached
        run.at,
        {"time_to_target": run.clock.reached, "tokens_by_source": run.clock.tokens_by_source()},
    )
  writer.log(
      f"done: checkpoints in {mngr.directory}, TensorBoard logs in "
      f"{fs.path(workdir) / 'tensorboard'}, metrics in {fs.path(workdir) / 'metrics.jsonl'}"
      + (f" | {run.clock.line()}" if run.clock.target is not None else "")
  )
  return run.close(0 if ok else 1)
