# Shared by the launch scripts (sourced, not run): quoting, a dry-run aware runner, errors.
#
#   DRY_RUN=1 run gcloud ...   prints the command (shell-quoted, one line) instead of running it
#   DRY_RUN=0 run gcloud ...   echoes "+ command" to stderr, then runs it
#
# Dry runs print exactly what would run, so `launch/X.sh --dry-run ... | bash` is the real thing.

DRY_RUN=${DRY_RUN:-0}

# shq ARG...: one line that a POSIX shell splits back into exactly these arguments.
shq() {
  local a out=()
  for a in "$@"; do
    if [[ -n "$a" && "$a" =~ ^[A-Za-z0-9_./:=,@%+^-]+$ ]]; then
      out+=("$a")
    else
      out+=("'${a//\'/\'\\\'\'}'")  # 'it'\''s' style: close, escaped quote, reopen
    fi
  done
  printf '%s' "${out[*]}"
}

run() {
  if [[ "$DRY_RUN" == 1 ]]; then
    printf '%s\n' "$(shq "$@")"
  else
    printf '+ %s\n' "$(shq "$@")" >&2
    "$@"
  fi
}

die() {
  printf '%s: %s\n' "$(basename "$0")" "$*" >&2
  exit 2
}

# need_value FLAG "$#": a flag that takes a value was given none.
need_value() {
  [[ "$2" -ge 2 ]] || die "$1 needs a value (see the usage at the top of $0)"
}

# The remote shell snippet that sets W (this TPU worker's index) and N (number of workers) from
# the TPU VM metadata server: the same source jax.distributed uses on Cloud TPU.
# C is worker 0's address (endpoints are "IP" or "name:id:IP").
TPU_WORKER_ENV='md() { curl -sf -H Metadata-Flavor:Google "http://metadata.google.internal/computeMetadata/v1/instance/attributes/$1"; }; W=$(md agent-worker-number); N=$(md worker-network-endpoints | tr , "\n" | grep -c .); C=$(md worker-network-endpoints | cut -d, -f1 | awk -F: "{print \$NF}")'
