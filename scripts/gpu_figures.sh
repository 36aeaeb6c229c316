#!/usr/bin/env bash
# The H200 figures in docs/benchmarks.md (MLX CUDA installed by hand on that machine).
# Writes to ${OUT:-gpu-results}/: each benchmark piece's JSON and log (h200-smollm2-f32 for the default
# pair, h200-stdlib-hybrid-native, h200-qwen3-4b-shape-*), doctor.json, lossless.txt and bench.log.
# Every piece is timed and bounded, so a piece that hangs costs its own limit, not the rest; the
# pieces' limits add up to under 12 minutes. The default pair's target is the GGUF that
# scripts/install.sh fetches; it must be in place.
set -u
out=${OUT:-gpu-results}
py=${PYTHON:-python3}
mkdir -p "$out"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$out/bench.log"; }
piece() {  # name, time limit (s), benchmark arguments...
  local name=$1 limit=$2; shift 2
  stamp "start $name"
  timeout "$limit" $py -m dflash_core benchmark "$@" --save "$out/$name.json" > "$out/$name.log" 2>&1
  stamp "end $name: exit $? (1 = some output not identical)"
}
$py -m dflash_core doctor --json > "$out/doctor.json"
$py -m dflash_core.random_models --family qwen3 --shape qwen3-4b --out /tmp/q4b --seed 3 > /dev/null
Q4B=(--model /tmp/q4b/qwen3-target --draft /tmp/q4b/qwen3-draft --oracle --prompt "def parse(line):" --repeat 3)
# 1. the weights' own dtype (float16 stdlib-hybrid, bfloat16 Qwen3-4B shape): the speed figures
piece h200-stdlib-hybrid-native 90 --model stdlib-hybrid --oracle
piece h200-qwen3-4b-shape-bf16 150 "${Q4B[@]}"
piece h200-qwen3-4b-shape-bf16-b8 90 "${Q4B[@]}" --block-size 8
# 2. float32 compute: batched verify and one-token decoding round far closer than in 16 bits, so
#    outputs are identical but for a rare near-tie of the top two logits.
#    The default pair (smollm2-135m) on all 40 held-out chat requests, in the chat template.
DFLASH_DTYPE=float32 piece h200-smollm2-f32 240 --prompts assets/prompts/chat_heldout.json --oracle --repeat 1
DFLASH_DTYPE=float32 piece h200-qwen3-4b-shape-f32 130 "${Q4B[@]}"
# 3. lossless on every engine family: random qwen3 / qwen3_5 / llama pairs, block sizes 16 and 5
for fam in qwen3 qwen3_5 llama; do
  $py -m dflash_core.random_models --family $fam --out /tmp/rnd --seed 7 > /dev/null
  for b in 16 5; do
    $py -m dflash_core generate --model /tmp/rnd/$fam-target --draft /tmp/rnd/$fam-draft \
      --prompt "def parse(line):" --max-tokens 64 --block-size $b --json --compare-baseline \
      | $py -c "import json,sys; r=json.load(sys.stdin); print('$fam', $b, 'identical', r['identical'], r['first_divergence'])"
  done
done | tee "$out/lossless.txt"
stamp done
