#!/usr/bin/env bash
# Start a small, real Slurm cluster on this machine (for tests and laptops).
#
#   slurm/local/start.sh              one node  (node1, 4 fake H200 GPUs)
#   slurm/local/start.sh --nodes 2    two nodes on one host (node1, node2)
#   slurm/local/stop.sh               stop what this script started
#
# What it does, in order:
#   1. installs Debian's slurmctld, slurmd, slurm-client and munge if missing
#      (needs root and the package registry);
#   2. writes slurm.conf and gres.conf under $STATE (not in the repository) and
#      links them from /etc/slurm so plain `sbatch`, `squeue`, `srun` find them;
#   3. creates fake GPUs: gres.conf needs File= entries that are character
#      devices, so we make /dev/null-like nodes with `mknod PATH c 1 3`;
#   4. starts munged, slurmctld and one slurmd per node (slurmd -N NODE, since
#      this host is not called node1), recording every pid it started;
#   5. waits until sinfo shows every node idle.
#
# Idempotent: with the cluster already up in the requested mode it does nothing.
# Asking for the other mode rewrites the configuration and restarts the Slurm
# daemons (munge keeps running). Job ids keep increasing across restarts
# because the controller's state directory is kept.
#
# Environment: WORKBOOK_SLURM_STATE (default /var/lib/workbook-slurm; must be root's
#              and writable by nobody else, see state_dir.sh),
#              WORKBOOK_SLURM_TIMEOUT seconds to wait for idle nodes (default 60).
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/state_dir.sh"   # sets STATE, make_state_dir
TIMEOUT=${WORKBOOK_SLURM_TIMEOUT:-60}
NODES=1
PARTITION=workbook          # the partition slurm/profiles/local.toml submits to
CTLD_PORT=6817
GPUS_PER_NODE=4
CPUS_PER_NODE=4             # declared, not detected: config_overrides lets 2 cores pose as 4

die() { echo "start.sh: error: $*" >&2; exit 1; }
say() { echo "start.sh: $*"; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --nodes) [[ $# -ge 2 ]] || die "--nodes needs a value (1 or 2)"; NODES=$2; shift 2 ;;
    --nodes=*) NODES=${1#--nodes=}; shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) die "unknown option '$1' (use --nodes 1 or --nodes 2)" ;;
  esac
done
[[ "$NODES" == 1 || "$NODES" == 2 ]] || die "--nodes must be 1 or 2, got '$NODES'"
[[ $(id -u) == 0 ]] || die "needs root (it installs packages and starts system daemons); try: sudo $0 --nodes $NODES"

node_names() { local i; for ((i = 1; i <= NODES; i++)); do echo "node$i"; done; }

# ----------------------------------------------------------------- 1. packages
install_packages() {
  local missing=()
  for cmd in slurmctld slurmd sbatch munged; do
    command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
  done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  say "installing slurmctld slurmd slurm-client munge (missing: ${missing[*]})"
  local t0=$SECONDS
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -q slurmctld slurmd slurm-client munge >"$STATE/apt.log" 2>&1; then
    say "install failed; running apt-get update and retrying"
    apt-get update -q >>"$STATE/apt.log" 2>&1 || true
    apt-get install -y -q slurmctld slurmd slurm-client munge >>"$STATE/apt.log" 2>&1 \
      || die "apt-get install failed, see $STATE/apt.log"
  fi
  say "installed in $((SECONDS - t0)) s"
}

# ------------------------------------------------------------------ helpers
alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

nodes_idle() {
  # True when every configured node reports idle (or mixed/allocated: busy is up too).
  local want got
  want=$(node_names | sort | tr '\n' ' ')
  got=$(sinfo -h -N -p "$PARTITION" -o '%N %t' 2>/dev/null \
        | awk '$2 ~ /^(idle|mix|alloc)$/ {print $1}' | sort -u | tr '\n' ' ')
  [[ -n "$got" && "$got" == "$want" ]]
}

cluster_up_in_mode() {
  [[ -f "$STATE/mode" && "$(cat "$STATE/mode")" == "$NODES" ]] || return 1
  alive "$STATE/run/slurmctld.pid" || return 1
  local n; for n in $(node_names); do alive "$STATE/run/slurmd-$n.pid" || return 1; done
  nodes_idle
}

stop_slurm_daemons() {
  # Only daemons whose pid files we wrote; munge stays up.
  local f pid
  for f in "$STATE"/run/slurmd-*.pid "$STATE/run/slurmctld.pid"; do
    [[ -f "$f" ]] || continue
    pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then kill "$pid"; fi
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    rm -f "$f"
  done
}

# ------------------------------------------------------------- 2. configuration
write_config() {
  local host; host=$(hostname -s)
  local conf="$STATE/etc/slurm.conf" gres="$STATE/etc/gres.conf"
  mkdir -p "$STATE/etc" "$STATE/run" "$STATE/log" "$STATE/ctld" "$STATE/dev"
  {
    echo "# Written by slurm/local/start.sh --nodes $NODES: a throwaway test cluster."
    echo "ClusterName=workbook"
    echo "SlurmctldHost=$host(127.0.0.1)"
    echo "SlurmctldPort=$CTLD_PORT"
    echo "SlurmUser=root"
    echo "AuthType=auth/munge"
    echo "StateSaveLocation=$STATE/ctld"
    echo "SlurmctldPidFile=$STATE/run/slurmctld.pid"
    echo "SlurmctldLogFile=$STATE/log/slurmctld.log"
    echo "# %n expands to the node name, so two slurmd on one host keep separate files."
    echo "SlurmdSpoolDir=$STATE/spool/%n"
    echo "SlurmdPidFile=$STATE/run/slurmd-%n.pid"
    echo "SlurmdLogFile=$STATE/log/slurmd-%n.log"
    echo "# No cgroups in containers: track processes by parent pid, no task binding."
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "SlurmdParameters=config_overrides"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core"
    echo "GresTypes=gpu"
    echo "ReturnToService=2"
    echo "# Start jobs as soon as they arrive (about 0.3-1.3 s instead of 3 s)."
    echo "SchedulerParameters=batch_sched_delay=0"
    echo "# An impossible request fails at submission instead of pending forever."
    echo "EnforcePartLimits=ALL"
    echo "AccountingStorageType=accounting_storage/none"
    echo "# Completed jobs stay visible to 'sacct -c' without a database."
    echo "JobCompType=jobcomp/filetxt"
    echo "JobCompLoc=$STATE/log/jobcomp.txt"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "MinJobAge=3600"
    echo "MailProg=/bin/true"
    echo "SlurmctldTimeout=30"
    echo "SlurmdTimeout=60"
    local i=1 n
    for n in $(node_names); do
      echo "NodeName=$n NodeHostname=localhost Port=$((17000 + i)) CPUs=$CPUS_PER_NODE RealMemory=4000 Gres=gpu:h200:$GPUS_PER_NODE State=UNKNOWN"
      i=$((i + 1))
    done
    echo "PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=02:00:00 State=UP"
  } >"$conf"

  {
    echo "# Fake GPUs: character devices (mknod c 1 3, like /dev/null). Jobs get"
    echo "# CUDA_VISIBLE_DEVICES, torch sees no GPU and programs use gloo on CPU."
    local n k dev
    for n in $(node_names); do
      for ((k = 0; k < GPUS_PER_NODE; k++)); do
        dev="$STATE/dev/$n-gpu$k"
        [[ -c "$dev" ]] || mknod "$dev" c 1 3
      done
      echo "NodeName=$n Name=gpu Type=h200 File=$STATE/dev/$n-gpu[0-$((GPUS_PER_NODE - 1))]"
    done
  } >"$gres"

  # Clients (sbatch, srun inside jobs) read /etc/slurm: link our files there, but
  # never replace a configuration that someone else wrote.
  mkdir -p /etc/slurm
  local f target
  for f in slurm.conf gres.conf; do
    target="$STATE/etc/$f"
    if [[ -e /etc/slurm/$f && ! -L /etc/slurm/$f ]]; then
      die "/etc/slurm/$f exists and was not written by this script; move it away or stop that cluster first"
    fi
    ln -sfn "$target" "/etc/slurm/$f"
  done
  # Node names must resolve, as on a real cluster (helpers.dist uses the first
  # node of SLURM_JOB_NODELIST as MASTER_ADDR for `srun python prog.py`).
  local names; names=$(node_names | tr '\n' ' ')
  hosts=$(grep -v '# workbook-slurm$' /etc/hosts || true)
  printf '%s\n' "$hosts" >/etc/hosts  # rewrite in place: /etc/hosts may be a bind mount
  echo "127.0.0.1 ${names}# workbook-slurm" >>/etc/hosts
  echo "$NODES" >"$STATE/mode"
}

# ---------------------------------------------------------------- 4. daemons
start_munge() {
  if munge -n </dev/null >/dev/null 2>&1; then return 0; fi  # already running (ours or the system's)
  mkdir -p /run/munge "$STATE/munge"
  chown munge:munge /run/munge "$STATE/munge"
  [[ -f /etc/munge/munge.key ]] || { mungekey --create 2>/dev/null || create-munge-key; chown munge:munge /etc/munge/munge.key; }
  runuser -u munge -- munged --pid-file="$STATE/munge/munged.pid" --log-file="$STATE/munge/munged.log"
  for _ in $(seq 50); do munge -n </dev/null >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n </dev/null >/dev/null 2>&1 || die "munged did not start, see $STATE/munge/munged.log"
  cp "$STATE/munge/munged.pid" "$STATE/run/munged.pid"
}

start_slurm() {
  slurmctld || die "slurmctld did not start, see $STATE/log/slurmctld.log"
  local n
  for n in $(node_names); do
    mkdir -p "$STATE/spool/$n"
    slurmd -N "$n" || die "slurmd -N $n did not start, see $STATE/log/slurmd-$n.log"
  done
}

wait_idle() {
  local t0=$SECONDS
  until nodes_idle; do
    if ((SECONDS - t0 > TIMEOUT)); then
      sinfo -N -l >&2 || true
      die "nodes not idle after ${TIMEOUT}s; logs in $STATE/log/"
    fi
    # A node that registered before the controller knew its gres may sit DOWN: resume it.
    local n; for n in $(sinfo -h -N -o '%N %t' 2>/dev/null | awk '$2 ~ /down|drain|inval/ {print $1}'); do
      scontrol update NodeName="$n" State=RESUME >/dev/null 2>&1 || true
    done
    sleep 0.5
  done
}

main() {
  make_state_dir
  mkdir -p "$STATE/run"
  install_packages
  if cluster_up_in_mode; then
    say "already up with $NODES node(s): nothing to do"
    sinfo -N
    exit 0
  fi
  local t0=$SECONDS
  stop_slurm_daemons
  write_config
  start_munge
  start_slurm
  wait_idle
  say "cluster up with $NODES node(s) in $((SECONDS - t0)) s (partition '$PARTITION', state in $STATE)"
  sinfo -N
}

main
