#!/usr/bin/env bash
# Stop the workshop hub (make hub-down): JupyterHub, its proxy and formgrader service,
# and every JupyterLab job it started, and nothing else.
#
# JupyterHub cancels its servers' jobs when it stops (SIGTERM); whatever is left
# afterwards is stopped by this script: the processes the hub started, then the
# Slurm jobs whose comment names this hub (pdl-hub-<id>, see job_script in
# helpers/course/hub/workshop.py). Other people's jobs are never touched. The learners' homes
# (their labs and notebooks) and the hub's state and logs are kept.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TOP=$(cd "$HERE/../.." && pwd)
source "$TOP/slurm/local/state_dir.sh"
STATE=${WORKBOOK_HUB_STATE:-/var/lib/workbook-hub}
say() { echo "hub-down: $*"; }
if ! why=$(check_state_dir "$STATE"); then
  echo "hub-down: error: unsafe state directory, not reading pid files from it: $why" >&2
  exit 1
fi
[[ -d $STATE ]] || { say "no hub state in $STATE: nothing to stop"; exit 0; }

wait_gone() {  # wait_gone SECONDS PID...: true once none of the pids is alive
  local t=$1 p alive i; shift
  for ((i = 0; i < t * 10; i++)); do
    alive=0
    for p in "$@"; do kill -0 "$p" 2>/dev/null && alive=1; done
    ((alive)) || return 0
    sleep 0.1
  done
  return 1
}

descendants() {  # every process below the given pids
  local p c
  for p in "$@"; do for c in $(pgrep -P "$p" || true); do echo "$c"; descendants "$c"; done; done
}
ours() {  # the pids that are still alive and still look like the hub's
  local p
  for p in "$@"; do
    if grep -qaE 'jupyter|configurable-http-proxy|ipykernel|batchspawner' "/proc/$p/cmdline" 2>/dev/null; then echo "$p"; fi
  done
}

# 1. JupyterHub: SIGTERM lets it cancel the jobs and stop its proxy and service.
run=$STATE/run
kids=$(cat "$run/children.pids" "$run/proxy.pid" 2>/dev/null || true)
if [[ -f $run/jupyterhub.pid ]]; then
  pid=$(cat "$run/jupyterhub.pid")
  if kill -0 "$pid" 2>/dev/null; then
    kids="$kids $(descendants "$pid")"
    kill -TERM "$pid"
    wait_gone 60 "$pid" || { say "JupyterHub (pid $pid) ignored SIGTERM for 60 s: killing it"; kill -KILL "$pid" 2>/dev/null || true; }
    say "stopped JupyterHub (pid $pid)"
  fi
fi
# 2. Whatever it started and left running (its proxy, its service and their kernels).
left=$(ours $kids)
if [[ -n $left ]]; then
  say "stopping what the hub left running: $(echo $left)"
  kill -TERM $left 2>/dev/null || true
  wait_gone 10 $left || kill -KILL $left 2>/dev/null || true
fi
rm -f "$run/jupyterhub.pid" "$run/children.pids" "$run/proxy.pid"
# 3. Jobs that carry this hub's comment and are still queued or running.
if [[ -f $STATE/hub-id ]] && command -v squeue >/dev/null; then
  tag="pdl-hub-$(cat "$STATE/hub-id")"
  hub_jobs() { squeue -h -o '%i %k' 2>/dev/null | awk -v t="$tag" '$2 == t {print $1}'; }
  ids=$(hub_jobs)
  if [[ -n $ids ]]; then
    say "cancelling the hub's jobs the hub did not: $(echo $ids)"
    scancel $ids || true
  fi
  for _ in $(seq 100); do [[ -z $(hub_jobs) ]] && break; sleep 0.2; done
  [[ -z $(hub_jobs) ]] || { echo "hub-down: error: jobs still in the queue: $(hub_jobs | tr '\n' ' ')" >&2; exit 1; }
fi
say "done; the learners' work and the hub's logs ($STATE/log) are kept"
