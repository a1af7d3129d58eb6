#!/usr/bin/env bash
# Spark's GPU discovery script (spark.worker.resource.gpu.discoveryScript): print the
# GPUs this worker may hand out, as Spark's ResourceInformation JSON:
#   {"name": "gpu", "addresses": ["0", "1"]}
# Addresses are the indexes nvidia-smi reports; with CUDA_VISIBLE_DEVICES set (a
# container given some GPUs), only those are offered. Spark then gives each task
# spark.task.resource.gpu.amount of them, and HorovodRunner pins each rank to its
# task's GPU (CUDA_VISIBLE_DEVICES).
set -euo pipefail

if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu_discovery: nvidia-smi not found: this worker has no NVIDIA driver (run the container with GPUs, e.g. compose's deploy.resources.reservations.devices)" >&2
    exit 1
fi
if ! indexes=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>&1); then
    echo "gpu_discovery: nvidia-smi failed: $indexes" >&2
    exit 1
fi
indexes=$(echo "$indexes" | tr -d ' ' | grep -E '^[0-9]+$' || true)
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
    visible=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | tr -d ' ')
    indexes=$(echo "$indexes" | grep -Fx -f <(echo "$visible") || true)
fi
if [ -z "$indexes" ]; then
    echo "gpu_discovery: no GPU visible to this worker" >&2
    exit 1
fi
addresses=$(echo "$indexes" | sed 's/.*/"&"/' | paste -sd, -)
echo "{\"name\": \"gpu\", \"addresses\": [$addresses]}"
