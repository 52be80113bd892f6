#!/bin/sh
# Run one task of a hand-made cluster: on each machine, from the project folder,
#   examples/handmade/run-task.sh CLUSTER_JSON TASK_TYPE INDEX [train stage options...]
# e.g. on host-a:  examples/handmade/run-task.sh examples/handmade/cluster-multi-worker-mirrored.json worker 0 \
#                    --strategy multi_worker_mirrored --name multi_worker_mirrored --set mlflow.tracking_uri=http://mlflow:5000
# CLUSTER_JSON maps job names to host:port lists, the same file on every machine.
# Set PRINT_TF_CONFIG=1 to print the TF_CONFIG this task would get, and stop.
set -eu
if [ $# -lt 3 ]; then
    echo "usage: $0 CLUSTER_JSON TASK_TYPE INDEX [train stage options...]" >&2
    exit 2
fi
cluster_file=$1 task_type=$2 index=$3
shift 3
case $index in
    ''|*[!0-9]*) echo "error: INDEX must be a number, got '$index'" >&2; exit 2 ;;
esac
if [ ! -r "$cluster_file" ]; then
    echo "error: cluster file $cluster_file not found" >&2
    exit 2
fi
TF_CONFIG="{\"cluster\": $(cat "$cluster_file"), \"task\": {\"type\": \"$task_type\", \"index\": $index}}"
export TF_CONFIG
if [ "${PRINT_TF_CONFIG:-0}" = 1 ]; then
    printf '%s\n' "$TF_CONFIG"
    exit 0
fi
exec python -m stages.train "$@"
