#!/usr/bin/env bash
# How the shipped smollm2-135m draft is trained, stage by stage (MLX CUDA on one H200; the figures
# and the learning curve are in docs/training-log.md). Every stage is measured by the engine on
# the hand-written held-out requests (assets/prompts/chat_heldout.json), never trained on.
# A log of the stages that were run, not a way to get the same weights: --minutes schedules each
# stage by wall-clock, so another machine or day trains other numbers of steps.
#   GGUF=FILE WORK=DIR bash scripts/train_smollm2_draft.sh data SEED N [OWN [T]]  # the target's replies to N requests
#   GGUF=FILE WORK=DIR bash scripts/train_smollm2_draft.sh stage1 MINUTES
#   GGUF=FILE WORK=DIR bash scripts/train_smollm2_draft.sh stage2 MINUTES   # resumes the shipped draft
#   GGUF=FILE WORK=DIR bash scripts/train_smollm2_draft.sh stage3 MINUTES   # resumes it again, distilling
#   GGUF=FILE WORK=DIR bash scripts/train_smollm2_draft.sh stage4 MINUTES   # the same, with sampled replies (data ... 0.7) added
#   GGUF=FILE WORK=DIR bash scripts/train_smollm2_draft.sh stage5 MINUTES   # two layers deeper
#   GGUF=FILE WORK=DIR bash scripts/train_smollm2_draft.sh stage6 MINUTES   # retrained for blocks of 8
#   GGUF=FILE WORK=DIR bash scripts/train_smollm2_draft.sh vocab 8192       # the draft's vocabulary, from the data
set -euo pipefail
GGUF=${GGUF:-assets/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf}
WORK=${WORK:-runs/smollm2}
PY=${PYTHON:-python3}
td() { $PY -m dflash_core.commands.train_draft --target "$GGUF" "$@"; }

data() {  # seed, number of requests [, share the target writes itself (the rest from templates) [, reply temperature]]
  td --data chat --num-prompts "$2" --own-prompts "${3:-0.8}" --reply-temperature "${4:-0}" --seed "$1" --data-only --out "$WORK/unused" \
    --data-cache "$WORK/data/chat-s$1.json" --gen-batch 1024 --response-tokens 256
}

stage1() {  # minutes: a fresh 4-layer draft over five taps
  td --data chat --data-cache "$WORK"/data/chat-s*.json --out "$WORK/draft" --layers 4 --intermediate 1024 \
    --target-layers 1 8 14 20 27 --mask-token "<empty_output>" --compute-dtype bfloat16 --batch-size 32 \
    --anchors 64 --minutes "$1" --eval-every 1500 --eval-prompts 8 --val-sequences 512 --seed 0
}

stage2() {  # minutes: the shipped draft plus one layer (starting as the identity), on every data seed
  td --data chat --data-cache "$WORK"/data/chat-s*.json --resume assets/models/smollm2-135m/draft --add-layers 1 \
    --out "$WORK/draft" --compute-dtype bfloat16 --batch-size 32 --anchors 64 --minutes "$1" --eval-every 1500 \
    --eval-prompts 8 --val-sequences 512 --seed 1
}

stage3() {  # minutes: the shipped draft, half of the loss on the target's whole distribution, lower lr
  td --data chat --data-cache "$WORK"/data/chat-s*.json --resume assets/models/smollm2-135m/draft \
    --out "$WORK/draft" --compute-dtype bfloat16 --batch-size 32 --anchors 64 --minutes "$1" --lr 3e-4 \
    --distill 0.5 --eval-every 1500 --eval-prompts 8 --val-sequences 512 --seed 2
}

stage4() {  # minutes: as stage 3, on data that includes replies sampled at temperature 0.7
  td --data chat --data-cache "$WORK"/data/chat-s*.json --resume assets/models/smollm2-135m/draft \
    --out "$WORK/draft" --compute-dtype bfloat16 --batch-size 32 --anchors 64 --minutes "$1" --lr 3e-4 \
    --distill 0.5 --eval-every 1500 --eval-prompts 8 --val-sequences 512 --seed 3
}

stage5() {  # minutes: the shipped draft two layers deeper (each new one starting as the identity), distilling
  td --data chat --data-cache "$WORK"/data/chat-s*.json --resume assets/models/smollm2-135m/draft --add-layers 2 \
    --out "$WORK/draft" --compute-dtype bfloat16 --batch-size 32 --anchors 64 --minutes "$1" \
    --distill 0.5 --eval-every 1500 --eval-prompts 8 --val-sequences 512 --seed 5
}

stage6() {  # minutes: the shipped draft retrained for blocks of 8 (a CPU verifies no more), distilling
  td --data chat --data-cache "$WORK"/data/chat-s*.json --resume assets/models/smollm2-135m/draft --block-size 8 \
    --out "$WORK/draft" --compute-dtype bfloat16 --batch-size 32 --anchors 64 --minutes "$1" --lr 3e-4 \
    --distill 0.5 --eval-every 1500 --eval-prompts 8 --val-sequences 512 --seed 6
}

vocab() {  # size: the shipped draft's vocabulary, the tokens the target writes most often in the data
  td --data chat --data-cache "$WORK"/data/chat-s*.json --data-only --out assets/models/smollm2-135m/draft \
    --draft-vocab "$1"
}

"$@"
