#!/usr/bin/env bash
# Reproduces the shipped pairs (assets/models/*): the target from scratch, then its draft.
# Written for one NVIDIA H200 with MLX CUDA (see ../shared/device/README.md); runs anywhere MLX
# does, slower. Training is scheduled by wall-clock (--minutes), so a slower machine trains less.
#   usage: scripts/train_shipped_pairs.sh coder|hybrid OUT_DIR
set -euo pipefail
pair=$1
out=$2
py=${PYTHON:-python3}
case "$pair" in
  coder)
    $py -m dflash_core.commands.train_target --out "$out/target" --arch qwen3 \
      --hidden 256 --layers 6 --heads 4 --kv-heads 2 --intermediate 768 --vocab-size 4096 \
      --seq-len 512 --batch-size 64 --lr 2e-3 --eval-every 200 --minutes "${TARGET_MIN:-1.5}"
    $py -m dflash_core.commands.train_draft --target "$out/target" --out "$out/draft" \
      --layers 2 --target-layers 1 3 5 --num-prompts 8000 --response-tokens 256 --gen-batch 2000 \
      --data-cache "$out/data.json" --batch-size 16 --anchors 64 --epochs 40 --lr 1.5e-3 \
      --eval-every 400 --minutes "${DRAFT_MIN:-3}"
    ;;
  hybrid)
    $py -m dflash_core.commands.train_target --out "$out/target" --arch qwen3_5 \
      --hidden 192 --layers 4 --heads 4 --kv-heads 2 --intermediate 576 --vocab-size 4096 \
      --seq-len 256 --batch-size 128 --lr 2e-3 --eval-every 200 --minutes "${TARGET_MIN:-1.5}"
    $py -m dflash_core.commands.train_draft --target "$out/target" --out "$out/draft" \
      --layers 2 --target-layers 0 1 3 --num-prompts 4000 --response-tokens 192 --gen-batch 2000 \
      --data-cache "$out/data.json" --batch-size 16 --anchors 64 --epochs 40 --lr 1.5e-3 \
      --eval-every 400 --minutes "${DRAFT_MIN:-2.5}"
    ;;
  *) echo "usage: $0 coder|hybrid OUT_DIR" >&2; exit 2 ;;
esac
