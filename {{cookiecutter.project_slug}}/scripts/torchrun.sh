#!/usr/bin/env bash
# Train with torchrun, one process per GPU, on one machine or many.
#
#   One machine, all its GPUs:   scripts/torchrun.sh
#   Two machines of 8 GPUs: run on each, with the address of the first machine:
#     NNODES=2 NPROC_PER_NODE=8 RDZV_ENDPOINT=node0.example:29400 scripts/torchrun.sh
#
# Arguments go on to `fit`, after the multinode preset (so --config configs/trainer/fsdp.yaml
# switches the strategy): scripts/torchrun.sh --trainer.max_epochs=50 --ckpt_path auto
# torchrun's elastic rendezvous assigns the ranks; Lightning reads them from its environment.
set -euo pipefail
cd "$(dirname "$0")/.."

NNODES="${NNODES:-1}"
NPROC_PER_NODE="${NPROC_PER_NODE:-gpu}"  # "gpu": one process per visible GPU
if [[ "$NNODES" != 1 && -z "${RDZV_ENDPOINT:-}" ]]; then
  echo "NNODES=$NNODES: set RDZV_ENDPOINT=<first machine's address>:29400 on every machine." >&2
  exit 2
fi
if [[ "$NPROC_PER_NODE" == gpu ]] && ! "${PYTHON:-python}" -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
  echo "error: no GPU is visible, and NPROC_PER_NODE=gpu starts one process per GPU. On CPUs, give the count and" \
    "the accelerator: NPROC_PER_NODE=2 scripts/torchrun.sh --trainer.accelerator cpu --trainer.precision 32-true" >&2
  exit 2
fi
if [[ "$NNODES" == 1 && -z "${RDZV_ENDPOINT:-}" ]]; then
  # A free port and a run id of its own: two runs on one machine (each on some of its GPUs) never meet.
  rendezvous=(--standalone)
else
  RDZV_ID="${RDZV_ID:-{{ cookiecutter.project_slug }}}"  # the same on every machine of one job
  JOIN_TIMEOUT="${JOIN_TIMEOUT:-600}"  # seconds to wait for every machine before giving up
  rendezvous=(--rdzv-backend=c10d --rdzv-endpoint="$RDZV_ENDPOINT" --rdzv-id="$RDZV_ID"
    --rdzv-conf="join_timeout=$JOIN_TIMEOUT")
fi
# Lightning checks these against torchrun's counts; "auto" takes every visible GPU.
DEVICES="$NPROC_PER_NODE"
[[ "$DEVICES" =~ ^[0-9]+$ ]] || DEVICES=auto

exec "${PYTHON:-python}" -m torch.distributed.run \
  --nnodes="$NNODES" --nproc-per-node="$NPROC_PER_NODE" "${rendezvous[@]}" \
  -m {{ cookiecutter.package_name }} fit --config configs/trainer/multinode.yaml "$@" \
  --trainer.num_nodes="$NNODES" --trainer.devices="$DEVICES"
