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

# fit_check ACCEL ARGS...: when ARGS are `pretrain --config ...`, compile that train step for
# the slice ACCEL with the TPU compiler (`bertjax compile --accelerator ACCEL --quick`, no TPU
# needed) before a dry run prints its commands, so a config that does not fit fails before the
# slice is reserved. Its report goes to stderr (stdout stays the commands). Without libtpu it
# says so and skips. BERTJAX_PYTHON: the Python with bertjax (default: this checkout's .venv).
fit_check() {
  local accel=$1 src py
  shift
  [[ "${1:-}" == pretrain ]] || return 0
  [[ " $* " == *" --config "* || " $* " == *" --config="* ]] || return 0
  src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  py=${BERTJAX_PYTHON:-$src/.venv/bin/python}
  [[ -x "$py" ]] || py=python3
  local probe='import importlib.util as u, sys
sys.exit(not (u.find_spec("bertjax") and u.find_spec("libtpu")))'
  if ! "$py" -c "$probe" 2>/dev/null; then
    echo "# fit check skipped: no libtpu (or bertjax) for $py;" \
      "pip install -e '.[tpu]' to compile for $accel first" >&2
    return 0
  fi
  echo "# fit check: compiling the train step for $accel" \
    "(bertjax compile --quick; --no-fit-check skips)" >&2
  local rc=0
  (cd "$src" && "$py" -m bertjax.cli compile --accelerator "$accel" --quick "${@:2}") >&2 || rc=$?
  if [[ "$rc" != 0 ]]; then
    printf '%s: the fit check for %s failed (exit %s, above); no commands printed\n' \
      "$(basename "$0")" "$accel" "$rc" >&2
    exit "$rc"
  fi
}
