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
      --seq-len 512 --batch-size 64 --lr 2e-3 --eval-every 200 --minutes "${TARGET_MIN:-1.2}"
    $py -m dflash_core.commands.train_draft --target "$out/target" --out "$out/draft-1" \
      --layers 2 --target-layers 1 3 5 --num-prompts 8000 --response-tokens 256 --gen-batch 2000 \
      --data-cache "$out/data.json" --batch-size 16 --anchors 64 --epochs 40 --lr 1.5e-3 \
      --eval-every 400 --minutes "${DRAFT_MIN:-2}"
    # stage 2: more data (regenerated once, in batches of 8000), 8x larger steps, from stage 1
    $py -m dflash_core.commands.train_draft --target "$out/target" --out "$out/draft" --data-only \
      --num-prompts 24000 --response-tokens 256 --gen-batch 8000 --data-cache "$out/data24k.json"
    $py -m dflash_core.commands.train_draft --target "$out/target" --out "$out/draft" \
      --resume "$out/draft-1" --num-prompts 24000 --data-cache "$out/data24k.json" --batch-size 64 \
      --anchors 128 --epochs 400 --eval-every 400 --eval-prompts 8 --lr 1e-3 --minutes "${DRAFT2_MIN:-6.1}"
    ;;
  hybrid)
    $py -m dflash_core.commands.train_target --out "$out/target" --arch qwen3_5 \
      --hidden 192 --layers 4 --heads 4 --kv-heads 2 --intermediate 576 --vocab-size 4096 \
      --seq-len 256 --batch-size 128 --lr 2e-3 --eval-every 200 --minutes "${TARGET_MIN:-1.5}"
    # the shipped hybrid draft was trained on a 2-core CPU (batched generation of qwen3_5 failed
    # on MLX CUDA 0.32.4 with a CUDA-graph error), in two runs: 600 prompts, then 1500 more
    $py -m dflash_core.commands.train_draft --target "$out/target" --out "$out/draft-a" \
      --layers 1 --target-layers 1 3 --num-prompts 600 --response-tokens 128 --max-prompt-tokens 128 \
      --gen-batch 300 --data-cache "$out/data600.json" --batch-size 8 --anchors 48 --epochs 200 \
      --lr 2e-3 --eval-every 150 --eval-prompts 3 --eval-tokens 96 --minutes "${DRAFT_MIN:-14}"
    $py -m dflash_core.commands.train_draft --target "$out/target" --out "$out/draft" \
      --resume "$out/draft-a" --num-prompts 1500 --response-tokens 128 --max-prompt-tokens 128 \
      --gen-batch 500 --data-cache "$out/data1500.json" --batch-size 8 --anchors 48 --epochs 200 \
      --lr 1e-3 --eval-every 200 --eval-prompts 3 --eval-tokens 96 --cache-taps --seed 1 \
      --minutes "${DRAFT2_MIN:-13}"
    ;;
  *) echo "usage: $0 coder|hybrid OUT_DIR" >&2; exit 2 ;;
esac
