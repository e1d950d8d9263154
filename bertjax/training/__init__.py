"""Pretraining: the mesh and its rules, the train step, the loop, the optimizer, checkpoints.

sharding.py        the mesh and the one table of logical-axis rules
train_state.py     TrainState, its sharded creation and the step-jitting helper that
                   pretraining and fine-tuning share
train.py           pretraining's setup and its jitted train/eval steps
losses.py          MLM (fused with the tied decoder), NSP/SOP and classification losses
optim.py           BERT's AdamW, optax AdamW, layer-wise LAMB; the schedules
phases.py          the phases of a run (BERT's seq 128 then 512), read by the checks, loop and fit
loop.py            `train_and_evaluate`: the plan, then a run object stepped, drained,
                   evaluated and saved as a list
progress.py        the log interval's meter (throughput, MFU, ETA) and time to target
checkpoint.py      orbax checkpoints with digests, resume on any mesh, pretrained export
metrics_writer.py  metrics.jsonl and TensorBoard
config_checks.py   a config's checks before anything runs (`validate` without jax,
                   `preflight` with it) and the `Plan` the loop runs
flops.py           model FLOPs and MFU
tpu.py             Cloud TPU topologies for `bertjax compile` without a TPU
fit.py             `bertjax compile`: ahead-of-time compile of the steps on a slice or local
                   devices, memory per device, the fit report
fit_suggest.py     `bertjax compile --suggest`: the variants that fit
"""
