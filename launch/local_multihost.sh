#!/usr/bin/env bash
# N processes on this machine that behave like N hosts of a pod: the way to test multi-host code
# (per-host input shards, global arrays, checkpoints written by every process) without a pod.
#
# usage: launch/local_multihost.sh N [--devices D] [--port P] [--log-dir DIR] [--dry-run] -- ARGS...
#
#   N              number of processes ("hosts")
#   --devices D    fake CPU devices per process (default 4, so N=2 gives an 8-device mesh)
#   --port P       coordinator port on localhost (default: a free one)
#   --log-dir DIR  also write process i's output to DIR/process_i.log
#   --dry-run      print the N commands instead of running them
#
# Process i runs `bertjax ARGS... --coordinator_address=localhost:P --num_processes=N
# --process_id=i` on CPU, with gloo for the cross-process collectives; its output lines are
# prefixed with [i]. If one process fails the others are stopped; the exit status is the first
# failure's. Set BERTJAX to the command to run (default `bertjax`; e.g. "python -m bertjax.cli").
#
# example:
#   launch/local_multihost.sh 2 -- pretrain --config experiments/pretrain.py:tiny \
#     --workdir runs/mh --config.data.source=synthetic --config.train.steps=20
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/lib.sh"

(( BASH_VERSINFO[0] > 5 || (BASH_VERSINFO[0] == 5 && BASH_VERSINFO[1] >= 1) )) ||
  die "needs bash >= 5.1 (this is $BASH_VERSION)"
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0
fi
[[ $# -ge 1 && "$1" =~ ^[0-9]+$ && "$1" -ge 1 ]] || die "first argument: number of processes N >= 1"
NPROC=$1; shift
DEVICES=4 PORT="" LOG_DIR=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --devices) need_value "$1" $#; DEVICES=$2; shift 2 ;;
    --port) need_value "$1" $#; PORT=$2; shift 2 ;;
    --log-dir) need_value "$1" $#; LOG_DIR=$2; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    *) die "unknown option $1; the bertjax arguments go after --" ;;
  esac
done
[[ $# -gt 0 ]] || die "no bertjax arguments after -- (e.g. -- pretrain --config ...)"
read -r -a CMD <<< "${BERTJAX:-bertjax}"
if [[ -z "$PORT" ]]; then
  if [[ "$DRY_RUN" == 1 ]]; then
    PORT=12355
  else  # ask the kernel for a free port; a race with another program is possible but rare
    PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("localhost",0)); print(s.getsockname()[1])')
  fi
fi
ENV=(env JAX_PLATFORMS=cpu JAX_CPU_COLLECTIVES_IMPLEMENTATION=gloo
     "XLA_FLAGS=--xla_force_host_platform_device_count=$DEVICES" CUDA_VISIBLE_DEVICES=)

proc_cmd() {  # proc_cmd I: the command line of process I
  P=("${ENV[@]}" "${CMD[@]}" "${ARGS[@]}" "--coordinator_address=localhost:$PORT"
     "--num_processes=$NPROC" "--process_id=$1")
}
ARGS=("$@")
if [[ "$DRY_RUN" == 1 ]]; then
  for ((i = 0; i < NPROC; i++)); do proc_cmd "$i"; run "${P[@]}"; done
  exit 0
fi

[[ -n "$LOG_DIR" ]] && mkdir -p "$LOG_DIR"
PIDS=()
cleanup() {  # stop the processes this script started, and only those
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT INT TERM
for ((i = 0; i < NPROC; i++)); do
  proc_cmd "$i"
  log=/dev/null
  [[ -n "$LOG_DIR" ]] && log="$LOG_DIR/process_$i.log"
  # exec: the recorded pid is the bertjax process itself, so cleanup reaches it.
  ( exec "${P[@]}" ) > >(tee "$log" | sed -u "s/^/[$i] /") 2>&1 &
  PIDS+=($!)
done

STATUS=0
LIVE=("${PIDS[@]}")
while [[ ${#LIVE[@]} -gt 0 ]]; do
  # React to whichever process ends first: a crash must stop the others at once, or they hang
  # in a collective that will never complete. (`wait -n -p` needs bash >= 5.1.)
  DONE=""
  if wait -n -p DONE "${LIVE[@]}"; then rc=0; else rc=$?; fi
  [[ -n "$DONE" ]] || break  # nothing left to wait for
  NEXT=()
  for pid in "${LIVE[@]}"; do [[ "$pid" == "$DONE" ]] || NEXT+=("$pid"); done
  LIVE=("${NEXT[@]}")
  if [[ $rc -ne 0 && $STATUS -eq 0 ]]; then
    STATUS=$rc
    echo "local_multihost: a process exited with status $rc; stopping the others" >&2
    cleanup
  fi
done
wait  # the output filters
exit $STATUS
