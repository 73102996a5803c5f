# Sourced by start.sh and stop.sh: the local cluster's private state directory.
#
# slurmctld and slurmd run as root and read their configuration, and stop.sh
# kills the pids it finds, under this directory. A directory another user could
# create or write first (a fixed name under /tmp) would let that user run code
# as root, so it lives under /var/lib by default and is refused unless it is a
# real directory owned by root and writable by nobody else.

STATE=${WORKBOOK_SLURM_STATE:-/var/lib/workbook-slurm}

check_state_dir() {
  local dir=$1 parent
  parent=$(dirname "$dir")
  [[ -d "$parent" && ! -L "$parent" ]] || { echo "state directory's parent '$parent' is not a directory"; return 1; }
  # A sticky world-writable parent (/tmp) is fine only if the directory itself checks out.
  if [[ -e "$dir" || -L "$dir" ]]; then
    [[ -d "$dir" && ! -L "$dir" ]] || { echo "'$dir' exists and is not a plain directory"; return 1; }
    [[ $(stat -c %u "$dir") == 0 ]] || { echo "'$dir' is owned by uid $(stat -c %u "$dir"), not root: remove it, or set WORKBOOK_SLURM_STATE to a directory of root's"; return 1; }
    local mode; mode=$(stat -c %a "$dir")
    (( (8#$mode & 8#022) == 0 )) || { echo "'$dir' is writable by group or others (mode $mode): chmod go-w it, or choose another WORKBOOK_SLURM_STATE"; return 1; }
  fi
  return 0
}

make_state_dir() {
  local why
  why=$(check_state_dir "$STATE") || { echo "${0##*/}: error: unsafe state directory: $why" >&2; exit 1; }
  install -d -m 0755 -o root -g root "$STATE"
}
