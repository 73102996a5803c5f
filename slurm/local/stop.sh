#!/usr/bin/env bash
# Stop the local cluster started by slurm/local/start.sh.
#
# Only processes whose pid files start.sh wrote under $STATE/run are stopped
# (slurmd per node, slurmctld, and munged if start.sh was the one to start it);
# a munged or Slurm that was already running on this machine is left alone.
# The state directory is kept, so the next start continues the job ids; pass
# --purge to delete it as well (and the /etc/slurm links pointing into it).
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/state_dir.sh"   # sets STATE
if ! why=$(check_state_dir "$STATE"); then
  echo "stop.sh: error: unsafe state directory, not reading pid files from it: $why" >&2
  exit 1
fi
PURGE=0
case "${1:-}" in
  "") ;;
  --purge) PURGE=1 ;;
  *) echo "stop.sh: error: unknown option '$1' (only --purge)" >&2; exit 1 ;;
esac

stop_pidfile() {
  local f=$1 pid
  [[ -f "$f" ]] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    echo "stop.sh: stopped $(basename "$f" .pid) (pid $pid)"
  fi
  rm -f "$f"
}

# Nodes first, then the controller, then munge (which they all use).
for f in "$STATE"/run/slurmd-*.pid; do stop_pidfile "$f"; done
stop_pidfile "$STATE/run/slurmctld.pid"
stop_pidfile "$STATE/run/munged.pid"
rm -f "$STATE/mode"

if [[ $PURGE == 1 ]]; then
  for f in slurm.conf gres.conf; do
    if [[ -L /etc/slurm/$f && $(readlink /etc/slurm/$f) == "$STATE"/* ]]; then rm -f "/etc/slurm/$f"; fi
  done
  hosts=$(grep -v '# workbook-slurm$' /etc/hosts || true)
  printf '%s\n' "$hosts" >/etc/hosts  # rewrite in place: /etc/hosts may be a bind mount
  rm -rf "$STATE"
  echo "stop.sh: removed $STATE"
fi
