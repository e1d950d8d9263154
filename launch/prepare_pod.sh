#!/usr/bin/env bash
# Prepare a corpus on all workers of a TPU slice at once, each worker tokenizing its share.
#
# usage: launch/prepare_pod.sh --name NAME --zone ZONE --out gs://BUCKET/DIR [options] -- ARGS...
#
#   --name NAME, --zone ZONE, --project PROJECT   the slice (already up, code set up by
#                        `launch/tpu_pod.sh --keep` or --reuse; see launch/README.md)
#   --raw gs://...       raw text to copy to every worker first (each worker reads all of it
#                        but tokenizes only its round-robin share of the chunks)
#   --out gs://...       where the prepared shards and metadata parts of all workers go
#   --download DIR       afterwards, copy the complete prepared set to DIR on every worker
#                        (training hosts then read it locally: --config.data.path=DIR)
#   --dry-run            print the commands instead of running them
#
# ARGS are `bertjax prepare` arguments (inputs, tokenizer, shards, ...); the script adds the
# output directory and `--worker-index W --num-workers N`, W and N read on each worker from the
# TPU metadata server. Shard names and `metadata-0000W-of-0000N.json` parts never collide, and
# `bertjax prepare`'s readers merge the parts, so the workers need no coordination.
#
# example (raw text already split into files under gs://BUCKET/raw/):
#   launch/prepare_pod.sh --name bert-base --zone us-central2-b --raw gs://BUCKET/raw \
#     --out gs://BUCKET/wiki-prepared --download '~/data/wiki' -- \
#     --input '../raw/*.txt' --tokenizer data/tokenizer.model --num-shards 64
#
# (ARGS run in ~/bertjax, so ../raw is where --raw put the text; prepare expands the glob.)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/lib.sh"

NAME="" ZONE="" PROJECT="" RAW="" OUT="" DOWNLOAD=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) need_value "$1" $#; NAME=$2; shift 2 ;;
    --zone) need_value "$1" $#; ZONE=$2; shift 2 ;;
    --project) need_value "$1" $#; PROJECT=$2; shift 2 ;;
    --raw) need_value "$1" $#; RAW=$2; shift 2 ;;
    --out) need_value "$1" $#; OUT=$2; shift 2 ;;
    --download) need_value "$1" $#; DOWNLOAD=$2; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    *) die "unknown option $1; the prepare arguments go after --" ;;
  esac
done
ARGS=("$@")
[[ -n "$NAME" && -n "$ZONE" ]] || die "--name and --zone are required"
[[ "$OUT" == gs://* ]] || die "--out must be a gs:// directory that all workers can write"

LOC=(--zone "$ZONE")
[[ -n "$PROJECT" ]] && LOC+=(--project "$PROJECT")
SSH=(gcloud compute tpus tpu-vm ssh "$NAME" "${LOC[@]}" --worker=all)

# On each worker: find W and N, fetch the raw text, prepare this worker's share, upload it.
STEPS="set -euo pipefail; $TPU_WORKER_ENV; echo \"worker \$W of \$N\""
if [[ -n "$RAW" ]]; then
  STEPS+="; mkdir -p ~/raw && gcloud storage cp -r $(shq "${RAW%/}/*") ~/raw/"
fi
STEPS+="; rm -rf ~/prepared; cd ~/bertjax && .venv/bin/bertjax prepare $(shq "${ARGS[@]}") \
--output ~/prepared --worker-index \$W --num-workers \$N"
STEPS+="; gcloud storage cp -r ~/prepared/* $(shq "${OUT%/}/")"
run "${SSH[@]}" --command "$STEPS"

if [[ -n "$DOWNLOAD" ]]; then
  # After every worker has uploaded (the ssh above returns when all are done).
  run "${SSH[@]}" --command "mkdir -p $DOWNLOAD && gcloud storage rsync -r $(shq "${OUT%/}") $DOWNLOAD"
fi
