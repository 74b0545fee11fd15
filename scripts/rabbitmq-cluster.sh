#!/usr/bin/env bash
# A 3-node RabbitMQ cluster on this host, beside the machine's own broker
# (rabbit@..., AMQP 5672, distribution 25672, management 15672), for the
# cluster integration test and the reliability profile. It never touches the
# machine's broker: each node has its own name, AMQP and distribution port,
# data and log folders, config file, environment file (the shared
# /etc/rabbitmq/rabbitmq-env.conf may pin NODENAME and is not read) and an
# empty plugins file (the management plugin would clash on 15672).
#
# Usage: scripts/rabbitmq-cluster.sh COMMAND
#   start            start the nodes not running and join 2..N to node 1 (idempotent)
#   stop             stop every node of the cluster (the data folders stay)
#   destroy          stop and delete the data folder
#   status           one line per node: name, AMQP port, running or down
#   urls             the AMQP URLs, comma-separated, in node order
#   stop-node N      stop node N gracefully (rabbitmqctl stop)
#   kill-node N      kill node N's Erlang VM with SIGKILL (a crash)
#   start-node N     start node N again (it rejoins the cluster by itself)
#   leader QUEUE     the number of the node that leads quorum queue QUEUE
#   ctl N ARGS...    rabbitmqctl ARGS on node N
#
# Settings (environment):
#   BAREWIRE_CLUSTER_DIR    data, logs and config (default /var/tmp/barewire-cluster)
#   BAREWIRE_CLUSTER_NODES  node count (default 3)
#   BAREWIRE_CLUSTER_PORT   AMQP port of node 1; node N listens on PORT+N-1 (default 5681);
#                           the distribution port is the AMQP port + 20000
#   BAREWIRE_CLUSTER_PREFIX node names are PREFIX<N>@localhost (default bwc)
#   BAREWIRE_CLUSTER_USER   the user the nodes run as (default rabbitmq); its
#                           ~/.erlang.cookie is the cookie of every node and CLI call
set -euo pipefail

DIR=${BAREWIRE_CLUSTER_DIR:-/var/tmp/barewire-cluster}
NODES=${BAREWIRE_CLUSTER_NODES:-3}
PORT=${BAREWIRE_CLUSTER_PORT:-5681}
PREFIX=${BAREWIRE_CLUSTER_PREFIX:-bwc}
RUSER=${BAREWIRE_CLUSTER_USER:-rabbitmq}
SBIN=${RABBITMQ_SBIN:-/usr/lib/rabbitmq/bin}
RHOME=$(getent passwd "$RUSER" | cut -d: -f6)

die() { echo "rabbitmq-cluster: $*" >&2; exit 1; }
[ -n "$RHOME" ] || die "user $RUSER does not exist (set BAREWIRE_CLUSTER_USER)"
[ -x "$SBIN/rabbitmq-server" ] || die "$SBIN/rabbitmq-server not found (set RABBITMQ_SBIN)"

name() { echo "${PREFIX}$1@localhost"; }
amqp_port() { echo $((PORT + $1 - 1)); }
dist_port() { echo $(($(amqp_port "$1") + 20000)); }
ndir() { echo "$DIR/${PREFIX}$1"; }

# as_user runs a command as the nodes' user with node N's environment.
as_user() {
  local n=$1; shift
  local d; d=$(ndir "$n")
  local envs=(
    HOME="$RHOME"
    RABBITMQ_CONF_ENV_FILE="$d/rabbitmq-env.conf"
    RABBITMQ_NODENAME="$(name "$n")"
    RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
    RABBITMQ_NODE_PORT="$(amqp_port "$n")"
    RABBITMQ_DIST_PORT="$(dist_port "$n")"
    RABBITMQ_MNESIA_BASE="$d/mnesia"
    RABBITMQ_LOG_BASE="$d/log"
    RABBITMQ_CONFIG_FILE="$d/rabbitmq.conf"
    RABBITMQ_ADVANCED_CONFIG_FILE="$d/advanced.config"
    RABBITMQ_ENABLED_PLUGINS_FILE="$d/enabled_plugins"
    RABBITMQ_PID_FILE="$d/pid"
    ERL_EPMD_ADDRESS=127.0.0.1
    ERL_FLAGS="-kernel inet_dist_use_interface {127,0,0,1}"
  )
  if [ "$(id -u)" = 0 ] && [ "$RUSER" != root ]; then
    (cd "$d" && runuser -u "$RUSER" -- env "${envs[@]}" "$@")
  elif [ "$(id -un)" = "$RUSER" ]; then
    (cd "$d" && env "${envs[@]}" "$@")
  else
    die "run as root or as $RUSER"
  fi
}

ctl() { local n=$1; shift; as_user "$n" "$SBIN/rabbitmqctl" -n "$(name "$n")" "$@"; }

prepare() {
  local n=$1 d; d=$(ndir "$n")
  mkdir -p "$d/mnesia" "$d/log"
  # Our own environment file, so that /etc/rabbitmq/rabbitmq-env.conf
  # (which may pin NODENAME or ports) is not read.
  echo "# barewire cluster node $n: settings come from the environment" >"$d/rabbitmq-env.conf"
  echo "[]." >"$d/enabled_plugins"
  cat >"$d/rabbitmq.conf" <<CONF
listeners.tcp.local = 127.0.0.1:$(amqp_port "$n")
log.file.level = info
log.console = false
CONF
  [ "$(id -u)" = 0 ] && chown -R "$RUSER:" "$DIR"
  return 0
}

# Fast checks that need no CLI call (each rabbitmqctl call starts an Erlang
# VM: seconds on a busy machine).
# vm_up: node N's Erlang VM is registered with epmd.
vm_up() { epmd -names 2>/dev/null | grep -q "^name ${PREFIX}$1 at port"; }
# amqp_up: node N accepts AMQP connections (the rabbit app runs).
amqp_up() { (exec 3<>"/dev/tcp/127.0.0.1/$(amqp_port "$1")") 2>/dev/null; }
running() { amqp_up "$1"; }
# vm_pid: the pid of node N's VM, found by its distribution port.
vm_pid() {
  ss -ltnpH "sport = :$(dist_port "$1")" 2>/dev/null | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2
}

await() {
  local n=$1
  for _ in $(seq 1 180); do
    # await_startup fails at once until the node has registered: wait for
    # the AMQP listener first, then confirm.
    if amqp_up "$n" && ctl "$n" -q await_startup --timeout 30 >/dev/null 2>&1; then return 0; fi
    sleep 1
  done
  die "node $(name "$n") did not start; see $(ndir "$n")/log"
}

start_node() {
  local n=$1
  if amqp_up "$n"; then return 0; fi
  prepare "$n"
  if vm_up "$n"; then
    echo "starting the rabbit app of $(name "$n")"
    ctl "$n" -q start_app
  else
    echo "starting $(name "$n") on AMQP port $(amqp_port "$n")"
    as_user "$n" "$SBIN/rabbitmq-server" -detached
  fi
  await "$n"
}

# Nodes 2..N remember that they joined node 1's cluster (a marker in their
# folder; destroy removes it); a restarted node rejoins by itself.
join() {
  local n=$1 mark; mark="$(ndir "$n")/joined"
  if [ -e "$mark" ]; then return 0; fi
  echo "joining $(name "$n") to $(name 1)"
  ctl "$n" -q stop_app
  ctl "$n" -q reset
  ctl "$n" -q join_cluster "$(name 1)"
  ctl "$n" -q start_app
  await "$n"
  touch "$mark"
}

urls() {
  local out="" n
  for n in $(seq 1 "$NODES"); do
    out+="${out:+,}amqp://guest:guest@127.0.0.1:$(amqp_port "$n")/"
  done
  echo "$out"
}

check_n() {
  [[ "${1:-}" =~ ^[0-9]+$ ]] && [ "$1" -ge 1 ] && [ "$1" -le "$NODES" ] || die "node number 1..$NODES expected, got '${1:-}'"
}

cmd=${1:-}
shift || true
case "$cmd" in
start)
  mkdir -p "$DIR"
  for n in $(seq 1 "$NODES"); do start_node "$n"; done
  for n in $(seq 2 "$NODES"); do join "$n"; done
  echo "cluster up: $(urls)"
  ;;
stop)
  # Every VM, whether or not its rabbit app runs.
  for n in $(seq "$NODES" -1 1); do
    if vm_up "$n"; then echo "stopping $(name "$n")"; ctl "$n" -q stop || true; fi
  done
  ;;
destroy)
  # A node that cannot stop cleanly (its peers gone) must not keep its
  # data: remove the folder whatever stop says.
  "$0" stop || true
  for n in $(seq 1 "$NODES"); do p=$(vm_pid "$n" || true); if [ -n "$p" ]; then kill -9 "$p" 2>/dev/null || true; fi; done
  rm -rf "$DIR"
  ;;
status)
  for n in $(seq 1 "$NODES"); do
    if amqp_up "$n"; then s=running; elif vm_up "$n"; then s="vm up, app stopped"; else s=down; fi
    echo "$(name "$n") amqp=$(amqp_port "$n") dist=$(dist_port "$n") $s"
  done
  ;;
urls) urls ;;
stop-node)
  check_n "${1:-}"
  if vm_up "$1"; then ctl "$1" -q stop; fi
  ;;
kill-node)
  check_n "${1:-}"
  pid=$(vm_pid "$1")
  [ -n "$pid" ] || die "node $1: no VM listens on distribution port $(dist_port "$1") (not running?)"
  kill -KILL "$pid"
  for _ in $(seq 1 50); do
    if ! amqp_up "$1"; then exit 0; fi
    sleep 0.1
  done
  die "node $1 still answers after SIGKILL"
  ;;
start-node)
  check_n "${1:-}"
  start_node "$1"
  ;;
leader)
  q=${1:?queue name}
  for n in $(seq 1 "$NODES"); do
    amqp_up "$n" || continue
    l=$(ctl "$n" -q list_queues name leader --no-table-headers 2>/dev/null | awk -v q="$q" '$1 == q {print $2}')
    [ -n "$l" ] || die "queue $q not found (or not a quorum queue)"
    l=${l#"$PREFIX"}
    echo "${l%%@*}"
    exit 0
  done
  die "no node is running"
  ;;
ctl)
  check_n "${1:-}"
  n=$1; shift
  ctl "$n" "$@"
  ;;
*)
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit 2
  ;;
esac
