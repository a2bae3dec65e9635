#!/usr/bin/env bash
# Hosts on one machine, for running zeroth across nodes: network namespaces ("nodes") joined by a
# bridge that lives in a namespace of its own, so the machine's own network is never touched.
# Addresses come from 198.18.0.0/15, the range set aside for tests (RFC 2544); no route leads out.
#   tools/cluster.sh up K [NAME]           K nodes: NAME-n0 .. NAME-n(K-1) at 198.18.0.1 .. 198.18.0.K
#   tools/cluster.sh run NODE CMD...       CMD inside node NODE (0-based) of NAME (CLUSTER_NAME)
#   tools/cluster.sh addr NODE             the node's address
#   tools/cluster.sh link NODE down|up     the node's link to the bridge down or up (a failed link)
#   tools/cluster.sh down [NAME]           every namespace of NAME and what runs in it, gone
# NAME (default: CLUSTER_NAME, else zeroth) keeps clusters of tests that run side by side apart.
# Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2; says so and exits 3 where
# namespaces cannot be made, so tests can skip with that reason.
set -euo pipefail

usage() { sed -n '2,12p' "$0" >&2; exit 2; }
name=${CLUSTER_NAME:-zeroth}
[[ $# -ge 1 ]] || usage
command=$1
shift

switch_ns() { echo "$name-sw"; }
node_ns() { echo "$name-n$1"; }
node_addr() { echo "198.18.0.$(($1 + 1))"; }
check_node() {
  [[ $1 =~ ^[0-9]+$ ]] || { echo "cluster.sh: node '$1' is not a number" >&2; exit 2; }
  ip netns list | grep -q "^$(node_ns "$1")\b" || { echo "cluster.sh: no node $1 in cluster '$name' (tools/cluster.sh up first)" >&2; exit 2; }
}

down() {
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$name-(sw|n[0-9]+)$" || true); do
    # A process left inside would keep the namespace, and its addresses, alive.
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns"
  done
}

case $command in
  up)
    [[ $# -ge 1 && $1 =~ ^[0-9]+$ && $1 -ge 1 && $1 -le 250 ]] || { echo "cluster.sh up: give a node count in 1..250" >&2; exit 2; }
    nodes=$1
    [[ $# -ge 2 ]] && name=$2
    [[ $name =~ ^[a-zA-Z0-9_-]{1,20}$ ]] || { echo "cluster.sh: name '$name' must be 1-20 letters, digits, - or _" >&2; exit 2; }
    if [[ $(id -u) -ne 0 ]] || ! command -v ip >/dev/null; then
      echo "cluster.sh: network namespaces need root and iproute2 (ip)" >&2
      exit 3
    fi
    down
    sw=$(switch_ns)
    if ! ip netns add "$sw" 2>/tmp/cluster-$$.err; then
      echo "cluster.sh: cannot make a network namespace here: $(cat /tmp/cluster-$$.err)" >&2
      rm -f /tmp/cluster-$$.err
      exit 3
    fi
    rm -f /tmp/cluster-$$.err
    # Whatever fails from here on leaves nothing behind.
    trap 'down' ERR
    ip -n "$sw" link set lo up
    ip -n "$sw" link add br0 type bridge
    ip -n "$sw" link set br0 up
    for ((i = 0; i < nodes; i++)); do
      ns=$(node_ns $i)
      ip netns add "$ns"
      ip -n "$ns" link set lo up
      ip -n "$sw" link add "n$i" type veth peer name eth0 netns "$ns"
      ip -n "$sw" link set "n$i" master br0
      ip -n "$sw" link set "n$i" up
      ip -n "$ns" addr add "$(node_addr $i)/15" dev eth0
      ip -n "$ns" link set eth0 up
    done
    trap - ERR
    echo "cluster $name: $nodes node(s), $(node_addr 0) .. $(node_addr $((nodes - 1)))"
    ;;
  run)
    [[ $# -ge 2 ]] || usage
    check_node "$1"
    ns=$(node_ns "$1")
    shift
    exec ip netns exec "$ns" "$@"
    ;;
  addr)
    [[ $# -eq 1 ]] || usage
    check_node "$1"
    node_addr "$1"
    ;;
  link)
    [[ $# -eq 2 && ($2 == down || $2 == up) ]] || usage
    check_node "$1"
    ip -n "$(switch_ns)" link set "n$1" "$2"
    ;;
  down)
    [[ $# -ge 1 ]] && name=$1
    down
    ;;
  *) usage ;;
esac
