#!/usr/bin/env bash
# Start the workshop hub (make hub): JupyterHub and its proxy run here as root; each
# learner who signs in gets a JupyterLab that is a Slurm job of theirs.
#
#   HUB_CLASS=class.txt make hub        (see docs/instructors.md, "A workshop hub")
#
# In order: installs sudo and configurable-http-proxy if missing (install.sh); checks
# that the class can work (users exist, every learner can run the venv's Python, Slurm
# answers, the course and the exchange exist); starts JupyterHub in its own session
# with its state in $WORKBOOK_HUB_STATE (default /var/lib/workbook-hub: root's, writable
# by nobody else), and waits until it answers. Idempotent: a running hub is left as is.
# Stop it with `make hub-down` (stop.sh).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TOP=$(cd "$HERE/../.." && pwd)
source "$TOP/slurm/local/state_dir.sh"   # check_state_dir, make_state_dir (of $STATE)
STATE=${WORKBOOK_HUB_STATE:-/var/lib/workbook-hub}
export WORKBOOK_HUB_STATE=$STATE
PY=${HUB_PYTHON:-$TOP/.venv/bin/python}
URL=${HUB_URL:-http://127.0.0.1:8000}
TIMEOUT=${HUB_TIMEOUT:-60}
say() { echo "hub: $*"; }
die() { echo "hub: error: $*" >&2; exit 1; }

[[ $(id -u) == 0 ]] || die "needs root (PAM sign-in, and JupyterLab jobs submitted as each learner); try: sudo make hub"
[[ -n ${HUB_CLASS:-} ]] || die "set HUB_CLASS to the class list (one 'NAME learner' or 'NAME instructor' a line; see slurm/hub/class.example.txt)"
[[ -x $PY ]] || die "$PY is missing: run make setup first"
bash "$HERE/install.sh"
make_state_dir
mkdir -p "$STATE/run" "$STATE/log"
chmod 0755 "$STATE"   # the learners' Jupyter configuration lives under it (read-only to them)

pidfile=$STATE/run/jupyterhub.pid
if [[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
  say "already running (pid $(cat "$pidfile")) at $URL; make hub-down stops it"
  exit 0
fi
"$PY" -m helpers.course.hub check --python "$PY" || die "fix the above, then run make hub again"

log=$STATE/log/jupyterhub.log
echo "---- $(date -Is) make hub" >>"$log"
cd "$STATE"
# A session of its own (setsid), so that nothing from this shell reaches it; SIGINT
# back to its default: bash
# starts background commands with SIGINT ignored, and the hub stops its service
# with SIGINT (it would wait 30 s for it instead of 1).
"$PY" -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.setsid(); os.execv(sys.argv[1], sys.argv[1:])' \
  "$(dirname "$PY")/jupyterhub" -f "$HERE/jupyterhub_config.py" >>"$log" 2>&1 </dev/null &
launcher=$!
t0=$SECONDS
until curl -fsS -o /dev/null "$URL/hub/api/" 2>/dev/null; do
  if ! kill -0 "$launcher" 2>/dev/null; then
    tail -n 30 "$log" >&2
    die "JupyterHub exited while starting (log: $log)"
  fi
  ((SECONDS - t0 < TIMEOUT)) || { tail -n 30 "$log" >&2; die "JupyterHub did not answer at $URL in $TIMEOUT s (log: $log)"; }
  sleep 0.5
done
pgrep -P "$launcher" >"$STATE/run/children.pids" || true   # its proxy and service, for stop.sh
say "JupyterHub $("$PY" -c 'import jupyterhub; print(jupyterhub.__version__)') is up at $URL in $((SECONDS - t0)) s (log: $log)"
say "learners sign in with their Unix password; each JupyterLab is a Slurm job (squeue -n jupyterlab)"
