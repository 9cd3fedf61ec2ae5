#!/bin/sh
# mpirun's remote-shell agent for an emulated cluster (scripts/bench/cluster/cluster.py):
# "ssh HOST COMMAND" becomes "run COMMAND inside the network namespace HOST, with
# HOST as its hostname". The hostname matters: Open MPI takes processes that
# report the same hostname for one node and joins them with shared memory.
host=$1
shift
exec ip netns exec "$host" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$host" "$*"
