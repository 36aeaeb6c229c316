#!/usr/bin/env bash
# The H200 figures in docs/benchmarks.md (MLX CUDA; see ../shared/device/README.md for installing
# MLX there). Writes JSON results to ${OUT:-gpu-results}/.
set -euo pipefail
out=${OUT:-gpu-results}
mkdir -p "$out"
py=${PYTHON:-python3}
$py -m dflash_core doctor --json > "$out/doctor.json"
# 1. lossless on the GPU backend: random qwen3 / qwen3_5 / llama pairs, block sizes 16 and 5
for fam in qwen3 qwen3_5 llama; do
  $py -m dflash_core.random_models --family $fam --out /tmp/rnd --seed 7 >/dev/null
  for b in 16 5; do
    $py -m dflash_core generate --model /tmp/rnd/$fam-target --draft /tmp/rnd/$fam-draft \
      --prompt "def parse(line):" --max-tokens 64 --block-size $b --json --compare-baseline \
      | $py -c "import json,sys; r=json.load(sys.stdin); print('$fam', $b, 'identical', r['identical'], r['first_divergence'])" \
      || echo "$fam $b: generate failed"
  done
done | tee "$out/lossless.txt"
# 2. the shipped pairs, with the oracle ceiling
$py -m dflash_core benchmark --oracle --sweep 4,8,16 --save "$out/shipped-coder.json" >/dev/null || echo "shipped-coder: benchmark exit $? (1 = not identical)"
if [[ -d assets/models/stdlib-hybrid/target ]]; then
  $py -m dflash_core benchmark --model stdlib-hybrid --oracle --save "$out/shipped-hybrid.json" >/dev/null || echo "shipped-hybrid: benchmark exit $? (1 = not identical)"
fi
# 3. a random target of Qwen3-4B's shape (36 layers, hidden 2560, vocab 151936), bf16, oracle draft
$py -m dflash_core.random_models --family qwen3 --shape qwen3-4b --out /tmp/q4b --seed 3 >/dev/null
$py -m dflash_core benchmark --model /tmp/q4b/qwen3-target --draft /tmp/q4b/qwen3-draft --oracle \
  --prompt "def parse(line):" --max-tokens 256 --repeat 3 --sweep 4,8,16 --save "$out/qwen3-4b-shape.json" >/dev/null || echo "qwen3-4b-shape: benchmark exit $? (1 = not identical)"
for f in "$out"/*.json; do
  $py -c "import json,sys; s=json.load(open('$f')).get('summary'); s and print('$f', json.dumps(s))"
done
