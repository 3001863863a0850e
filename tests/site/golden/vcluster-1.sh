#!/bin/bash
#SBATCH --cpus-per-task=1
#SBATCH --job-name=fs-demo-g1
#SBATCH --no-requeue
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --open-mode=append
#SBATCH --output=/shared/firescale/results/demo/g1/job.log
#SBATCH --partition=debug
#SBATCH --signal=B:USR1@60
#SBATCH --time=01:30:00
# firescale job for site vcluster (Slurm); generated, re-render instead of editing.
set -euo pipefail

# The environment the job started with, to tell what this script sets for the ranks (firescale_forwarded).
declare -A FIRESCALE_ENV_AT_START=()
while IFS= read -r -d '' kv; do FIRESCALE_ENV_AT_START[${kv%%=*}]=${kv#*=}; done < <(env -0)

FIRESCALE_JOB_NAME=fs-demo-g1
FIRESCALE_SCHEDULER=slurm
FIRESCALE_STATUS_FILE=/shared/firescale/results/demo/g1/status.json
FIRESCALE_JOB_ID="${SLURM_JOB_ID:-local-$$}"
FIRESCALE_START=$(date -u +%Y-%m-%dT%H:%M:%SZ)
FIRESCALE_SIGNAL=
FIRESCALE_SIGNAL_TIME=
FIRESCALE_REASON=
FIRESCALE_CHILD=
FIRESCALE_TIMER=
export FIRESCALE_JOB_NAME FIRESCALE_SCHEDULER FIRESCALE_JOB_ID FIRESCALE_STATUS_FILE

firescale_hosts() {
  scontrol show hostnames "${SLURM_JOB_NODELIST:-$(hostname)}"
}

# One JSON list of the allocation's hostnames (characters outside [A-Za-z0-9._-] dropped).
firescale_hosts_json() {
  local first=1 host
  printf '['
  while IFS= read -r host; do
    host=$(printf '%s' "$host" | tr -cd 'A-Za-z0-9._-')
    [ -n "$host" ] || continue
    [ "$first" = 1 ] || printf ', '
    printf '"%s"' "$host"
    first=0
  done < <(firescale_hosts 2>/dev/null || hostname)
  printf ']'
}

# Names of the variables every rank needs: those this script set or changed, and the search paths.
firescale_forwarded() {
  local kv name
  while IFS= read -r -d '' kv; do
    name=${kv%%=*}
    [[ $name =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || continue
    case $name in
      _|SHLVL|PWD|OLDPWD|OMPI_MCA_mca_base_env_list) ;;
      PATH|LD_LIBRARY_PATH|PYTHONPATH|VIRTUAL_ENV) printf '%s\n' "$name" ;;
      *) if [ -z "${FIRESCALE_ENV_AT_START[$name]+set}" ] || [ "${FIRESCALE_ENV_AT_START[$name]}" != "${kv#*=}" ]; then
           printf '%s\n' "$name"
         fi ;;
    esac
  done < <(env -0)
}

# After a failed launch: does every node find the ranks' program?  One step of one task per node asks,
# started as the ranks were; a node that does not find it is named in the reason, with its PATH.  Asked
# only after a failure, so a job that runs pays nothing for it.
firescale_program_missing() {
  local found first nodes
  found=$(FIRESCALE_HOSTS_SLOTS=$(firescale_hosts | sed 's/$/:1/' | paste -sd, -)
          timeout 60 srun --nodes=1 --ntasks=1 --ntasks-per-node=1 --cpus-per-task=1 --kill-on-bad-exit=1 --mpi=pmix /bin/sh -c 'command -v -- "$1" >/dev/null 2>&1 || { read -r host < /proc/sys/kernel/hostname; printf "firescale-missing %s %s\n" "$host" "$PATH"; }' firescale-probe firescale 2>/dev/null | sed -n 's/^.*firescale-missing //p')
  [ -n "$found" ] || return 1
  first=${found%%$'\n'*}
  nodes=$(printf '%s\n' "$found" | cut -d' ' -f1 | sort -u | grep -vxF -- "${first%% *}" | paste -sd' ' -)
  FIRESCALE_REASON=firescale" is not found on node ${first%% *}${nodes:+ (nor on $nodes)}, whose PATH is ${first#* }; put its folder on the PATH as an absolute path that every node mounts, or set the site's environment.venv"
  echo "firescale: $FIRESCALE_REASON" >&2
}

# A check before launch failed: record and print why, and end the job with 78 (EX_CONFIG: the site or
# the node is set up wrong, not the run).
firescale_refuse() {
  FIRESCALE_REASON=$1
  echo "firescale: $FIRESCALE_REASON" >&2
  exit 78
}

# Whatever ends the job, write its status file atomically: a temporary name, then a rename.
firescale_finish() {
  local rc=$?
  trap - EXIT
  # Only the job's own shell writes the status (a subshell killed early may still run inherited traps).
  if [ "$BASHPID" != "$$" ]; then exit "$rc"; fi
  set +e
  if [ -n "$FIRESCALE_TIMER" ]; then kill "$FIRESCALE_TIMER" 2>/dev/null; fi
  local tmp="${FIRESCALE_STATUS_FILE}.tmp.$$"
  mkdir -p -- "$(dirname -- "$FIRESCALE_STATUS_FILE")"
  {
    printf '{\n'
    printf '  "job_name": "%s",\n' "$FIRESCALE_JOB_NAME"
    printf '  "scheduler": "%s",\n' "$FIRESCALE_SCHEDULER"
    printf '  "job_id": "%s",\n' "$(printf '%s' "$FIRESCALE_JOB_ID" | tr -cd 'A-Za-z0-9._\[\]-')"
    printf '  "exit_code": %d,\n' "$rc"
    printf '  "signal": "%s",\n' "$FIRESCALE_SIGNAL"
    printf '  "signal_time": "%s",\n' "$FIRESCALE_SIGNAL_TIME"
    printf '  "reason": "%s",\n' "$(printf '%s' "$FIRESCALE_REASON" | tr -d '\000-\037' | sed 's/[\\"]/\\&/g')"
    printf '  "start": "%s",\n' "$FIRESCALE_START"
    printf '  "end": "%s",\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    printf '  "ranks": %d,\n' 1
    printf '  "hosts": %s\n' "$(firescale_hosts_json)"
    printf '}\n'
  } > "$tmp" && mv -f -- "$tmp" "$FIRESCALE_STATUS_FILE"
  exit "$rc"
}
trap firescale_finish EXIT

# The scheduler's warning before walltime, a cancel or a preemption reaches the ranks as SIGUSR1,
# which every launcher forwards (mpirun would kill its ranks on SIGTERM before they snapshot); USR2
# where NCCL runs, which may take USR1 for itself.  status.json records the first signal and when it
# came: the runner resubmits only for the walltime signal near the walltime's end, never for a cancel.
firescale_forward() {
  if [ -z "$FIRESCALE_SIGNAL" ]; then
    FIRESCALE_SIGNAL=$1
    FIRESCALE_SIGNAL_TIME=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  fi
  echo "firescale: received SIG$1, asking the ranks to snapshot and stop (SIGUSR1)" >&2
  if [ -n "$FIRESCALE_CHILD" ]; then kill -s USR1 "$FIRESCALE_CHILD" 2>/dev/null || true; fi
}
trap 'firescale_forward USR1' USR1
trap 'firescale_forward USR2' USR2
trap 'firescale_forward TERM' TERM
trap 'firescale_forward INT' INT

# --- environment (module and activate scripts are not written for `set -u`)
set +u
export GLOO_SOCKET_IFNAME=eth0
export OMPI_MCA_btl_tcp_if_include=eth0
export OMPI_MCA_mpi_yield_when_idle=1
export OMPI_MCA_oob_tcp_if_include=eth0
export TF_CPP_MIN_LOG_LEVEL=2
set -u

# --- MPI, Horovod and threads
export FIRESCALE_ALLREDUCE=tree
export FIRESCALE_ALLREDUCE_TREE=binomial
export FIRESCALE_RUN_DIR=/shared/firescale/results/demo/g1
export HOROVOD_CYCLE_TIME=0.1
export HOROVOD_STALL_CHECK_TIME_SECONDS=60
export HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=600
export OMP_NUM_THREADS=1
export OMPI_MCA_coll_tuned_allreduce_algorithm=2
export OMPI_MCA_coll_tuned_bcast_algorithm=6
export OMPI_MCA_coll_tuned_reduce_algorithm=5
export OMPI_MCA_coll_tuned_use_dynamic_rules=1
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
FIRESCALE_HOSTS_SLOTS=$(firescale_hosts | sed 's/$/:1/' | paste -sd, -)
export FIRESCALE_HOSTS_SLOTS

# --- what every rank on every node gets: the variables set above, the venv's and modules' paths
FIRESCALE_FORWARD="FIRESCALE_FORWARD $(firescale_forwarded | sort -u | paste -sd' ' -)"
export FIRESCALE_FORWARD
# srun must have the MPI plugin the site names, else no rank could start
if ! srun --mpi=list 2>&1 | tr -s ' \t,:' '\n' | grep -qxF -- pmix; then
  firescale_refuse "srun on $(hostname) has no MPI plugin "pmix" (srun --mpi=list offers: $(srun --mpi=list 2>&1 | grep -E '^[[:space:]]' | tr -d ' \t' | paste -sd, -)); set srun_mpi in the site profile to one of them"
fi

# --- launch 1 rank(s) on 1 node(s)
mkdir -p -- /shared/firescale/results/demo/g1
cd -- /shared/firescale/results/demo/g1
echo "firescale: job $FIRESCALE_JOB_NAME ($FIRESCALE_JOB_ID) starts $FIRESCALE_START on $(hostname)"
set +e
srun --nodes=1 --ntasks=1 --ntasks-per-node=1 --cpus-per-task=1 --kill-on-bad-exit=1 --mpi=pmix firescale train --net nin --out /shared/firescale/results/demo/g1 &
FIRESCALE_CHILD=$!
# A signal that came before the ranks existed is passed on now that they do.
if [ -n "$FIRESCALE_SIGNAL" ]; then kill -s USR1 "$FIRESCALE_CHILD" 2>/dev/null || true; fi
while :; do
  wait "$FIRESCALE_CHILD"
  rc=$?
  # wait returns early (status > 128) when a trapped signal arrives; keep waiting for the ranks.
  if [ "$rc" -gt 128 ] && kill -0 "$FIRESCALE_CHILD" 2>/dev/null; then continue; fi
  break
done
echo "firescale: job $FIRESCALE_JOB_NAME ended with exit code $rc"
# 127: a shell's "command not found"
if [ "$rc" -ne 0 ] && [ -z "$FIRESCALE_SIGNAL" ] && firescale_program_missing; then rc=127; fi
exit "$rc"
