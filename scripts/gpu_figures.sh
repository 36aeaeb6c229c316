#!/usr/bin/env bash
# The H200 figures in docs/benchmarks.md (MLX CUDA installed by hand on that machine), in parts
# that each fit one 10-minute command:
#   bash scripts/gpu_figures.sh checks    the fused attention's tests and timings, target forwards by
#                                          rows (MLX's attention against the fused one), lossless on
#                                          every family with the policy interleaving plain steps (and
#                                          where gemma4_text's random pair first parts), and
#                                          the random Qwen3-4B-shaped target (bfloat16, float32)
#   bash scripts/gpu_figures.sh cycle     where a cycle's time goes: the default pair's verify by rows
#                                          and its cycle in one-token steps (forward_rows.py), each
#                                          part's operations and time (cycle_profile.py), and
#                                          the random Qwen3-4B-shaped target's oracle at a block of
#                                          16, float32
#   bash scripts/gpu_figures.sh overlap   host time against device time (host_overlap.py): eager and
#                                          pipelined steps and cycles, the draft compiled or not
#   bash scripts/gpu_figures.sh heldout   the default pair on all 40 held-out chat requests, float32:
#                                          after a warm-up process, the adaptive policy side by side with the fixed one
#                                          (REPEAT=N repeats, default 3)
#   bash scripts/gpu_figures.sh compiled  the cycle as CUDA runs it by default (pipelined, compiled):
#                                          after a warm-up process, the lossless tests of the
#                                          pipeline, the cycle against pipelined and synchronous ones
#                                          on five held-out requests (pipeline_probe.py), then all 40
#                                          with the adaptive policy beside the fixed one and the
#                                          synchronous cycle (REPEAT=N, default 2)
#   bash scripts/gpu_figures.sh trace     the adaptive policy's predictions against each cycle's measure
#                                          on the held-out requests it has turned plain on an H100
#                                          (policy_trace.py, REQUESTS=a,b,.. REPEAT=N; after `compiled`
#                                          on the same machine: its kernels are compiled)
#   bash scripts/gpu_figures.sh rows      the few-row float32 matmul (few_rows_matmul.py, on by default):
#                                          its tests, its cost by rows against MLX's (matmul_rows.py),
#                                          the Qwen3-4B-shaped target's forward by rows with it and
#                                          without, and that target's oracle with it (float32)
#   bash scripts/gpu_figures.sh now       the figures the current tables quote, as CUDA runs by default:
#                                          a warm-up process, all 40 held-out requests (adaptive beside
#                                          fixed, one repeat), the Qwen3-4B-shaped oracle at B = 16 in
#                                          float32
#   bash scripts/gpu_figures.sh now-checks  that oracle in bfloat16, the lossless tests of every family
#                                          (pipelined, compiled, interleaved), the fused attention's and
#                                          the few-row matmul's tests, and both targets' forwards by rows
#   bash scripts/gpu_figures.sh passes    the fused attention's single pass against its two passes on
#                                          the 40 held-out requests: four processes in turn (single,
#                                          two, single, two), each both policies, one repeat
#   bash scripts/gpu_figures.sh graphs    MLX CUDA's graph settings (MLX_CUDA_GRAPH_CACHE_SIZE,
#                                          MLX_MAX_OPS_PER_BUFFER) on the first 12 held-out requests,
#                                          one repeat each (GRAPH_SETTINGS="CACHE:OPS ..."), the adaptive policy beside the fixed one
# Writes to ${OUT:-gpu-results}/. Every piece is timed and bounded, so a piece that hangs costs its
# own limit, not the rest. The default pair's target is the GGUF that scripts/install.sh fetches;
# it must be in place.
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
run() {  # name, time limit (s), command...
  local name=$1 limit=$2; shift 2
  stamp "start $name"
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  stamp "end $name: exit $?"
}
warm_up() {  # name: a short run of both policies, in which a fresh machine compiles MLX's kernels
  piece "$1" 150 --prompt "Hello" --max-tokens 64 --repeat 1 --policy adaptive --policy-sweep fixed
}
# the random Qwen3-4B-shaped pair (made once per machine, q4b) and its oracle's run at a block of 16
Q4B=(--model /tmp/q4b/qwen3-target --draft /tmp/q4b/qwen3-draft)
ORACLE16=(--block-size 16 --oracle --prompt "def parse(line):" --repeat 3)
q4b() {
  [[ -d /tmp/q4b/qwen3-target ]] || $py -m dflash_core.random_models --family qwen3 --shape qwen3-4b --out /tmp/q4b --seed 3 > /dev/null
}
case "${1:-}" in
checks)
  $py -m dflash_core doctor --json > "$out/doctor.json" 2>&1
  DFLASH_FUSED_ATTENTION_VERBOSE=0 run fused-tests 150 $py -m pytest tests/test_fused_attention.py -q -p no:cacheprovider -x
  run attention-rows 60 $py scripts/attention_rows.py --json "$out/attention-rows.json"
  DFLASH_DTYPE=float32 DFLASH_FUSED_ATTENTION=0 run forward-rows-mlx 60 $py scripts/forward_rows.py --save "$out/forward-rows-mlx.json"
  DFLASH_DTYPE=float32 DFLASH_FUSED_ATTENTION=1 run forward-rows-fused 60 $py scripts/forward_rows.py --save "$out/forward-rows-fused.json"
  run lossless 120 $py -m pytest tests/test_policy.py tests/test_engine.py -q -p no:cacheprovider -m "not slow" -k "lossless or interleav"
  run first-divergence-gemma4 60 $py scripts/first_divergence.py --family gemma4_text
  q4b
  piece h200-qwen3-4b-shape-bf16 100 "${Q4B[@]}" --oracle --prompt "def parse(line):" --repeat 3
  DFLASH_DTYPE=float32 piece h200-qwen3-4b-shape-f32 100 "${Q4B[@]}" --oracle --prompt "def parse(line):" --repeat 3
  ;;
cycle)
  DFLASH_DTYPE=float32 run forward-rows 150 $py scripts/forward_rows.py --save "$out/h200-forward-rows.json"
  DFLASH_DTYPE=float32 run cycle-profile 90 $py scripts/cycle_profile.py --save "$out/cycle-profile.json"
  q4b
  DFLASH_DTYPE=float32 piece h200-qwen3-4b-shape-f32 120 "${Q4B[@]}" "${ORACLE16[@]}"
  ;;
overlap)
  export DFLASH_DTYPE=float32
  run host-overlap 120 $py scripts/host_overlap.py --repeats 5 --save "$out/host-overlap.json"
  DFLASH_COMPILE_DRAFT=1 run host-overlap-compiled 120 $py scripts/host_overlap.py --repeats 5 --save "$out/host-overlap-compiled.json"
  ;;
heldout)
  DFLASH_DTYPE=float32 warm_up warm-up
  DFLASH_DTYPE=float32 piece h200-smollm2-135m-policy 560 --prompts assets/prompts/chat_heldout.json \
    --policy adaptive --policy-sweep fixed --repeat "${REPEAT:-3}"
  ;;
compiled)
  export DFLASH_DTYPE=float32
  # a fresh machine compiles MLX's kernels, and the compiled cycles' fused ones, in its first
  # process (minutes; kept on disk for later processes): a short run of every policy pays it here
  warm_up compiled-warm-up
  # lossless with the defaults (pipelined, compiled): plain steps and every verify size interleaved,
  # budgets and cancellation, the oracle, every accepted length
  run compiled-tests 90 $py -m pytest -q -p no:cacheprovider tests/test_pipeline.py \
    tests/test_policy.py::test_interleaved_plain_steps_and_every_verify_size_are_lossless \
    tests/test_policy.py::test_a_pipelined_run_ends_on_its_budget_or_when_cancelled \
    "tests/test_engine.py::test_every_accepted_length_is_lossless[qwen3]" \
    "tests/test_engine.py::test_every_accepted_length_is_lossless[llama]"
  run compiled-probe 90 $py scripts/pipeline_probe.py --every 8 --modes compiled,pipelined,synchronous \
    --save "$out/compiled-probe.json"
  piece smollm2-135m-compiled 250 --prompts assets/prompts/chat_heldout.json --policy adaptive \
    --policy-sweep fixed --pipeline-sweep --repeat "${REPEAT:-2}"
  ;;
rows)
  export DFLASH_DTYPE=float32 DFLASH_FEW_ROWS_MATMUL=1
  run few-rows-tests 80 $py -m pytest tests/test_few_rows_matmul.py -q -p no:cacheprovider -x
  run matmul-rows 100 $py scripts/matmul_rows.py --save "$out/matmul-rows.json"
  q4b
  run q4b-rows-few-rows 75 $py scripts/forward_rows.py "${Q4B[@]}" --rows 2,4,8,16 --cycles 0 --save "$out/q4b-rows-few-rows.json"
  DFLASH_FEW_ROWS_MATMUL=0 run q4b-rows-mlx 60 $py scripts/forward_rows.py "${Q4B[@]}" --rows 2,4,8,16 --cycles 0 --save "$out/q4b-rows-mlx.json"
  piece qwen3-4b-shape-f32-few-rows 150 "${Q4B[@]}" "${ORACLE16[@]}"
  ;;
trace)
  DFLASH_DTYPE=float32 run policy-trace 200 $py scripts/policy_trace.py --requests "${REQUESTS:-25,9,4,22,36,3}" \
    --repeat "${REPEAT:-2}" --save "$out/policy-trace.json"
  ;;
now)
  export DFLASH_DTYPE=float32
  warm_up warm-up
  piece benchmark-gpu 240 --prompts assets/prompts/chat_heldout.json --policy adaptive --policy-sweep fixed --repeat 1
  q4b
  # this target's first process compiles its own kernels (140 s in all on a fresh H100)
  piece qwen3-4b-shape-f32 200 "${Q4B[@]}" "${ORACLE16[@]}"
  ;;
now-checks)
  export DFLASH_DTYPE=float32
  q4b
  DFLASH_DTYPE= piece qwen3-4b-shape-bf16 150 "${Q4B[@]}" "${ORACLE16[@]}"
  run lossless 140 $py -m pytest tests/test_pipeline.py tests/test_policy.py tests/test_engine.py -q \
    -p no:cacheprovider -m "not slow" -k "lossless or interleav or traces_every"
  DFLASH_FUSED_ATTENTION_VERBOSE=0 run fused-tests 120 $py -m pytest tests/test_fused_attention.py \
    tests/test_few_rows_matmul.py -q -p no:cacheprovider
  run forward-rows 80 $py scripts/forward_rows.py --compiled --save "$out/forward-rows.json"
  run q4b-rows 80 $py scripts/forward_rows.py "${Q4B[@]}" --rows 2,4,8,16 --cycles 0 --compiled --save "$out/q4b-rows.json"
  ;;
passes)
  export DFLASH_DTYPE=float32
  warm_up warm-up
  H=(--prompts assets/prompts/chat_heldout.json --policy adaptive --policy-sweep fixed --repeat 1)
  # the two passes: fused_attention.one_pass answering no, in the benchmark's own process
  two="import runpy, sys; from dflash_core.engine import fused_attention as fa; fa.one_pass = lambda *a: False"
  two="$two; sys.argv = ['dflash_core'] + sys.argv[1:]; runpy.run_module('dflash_core', run_name='__main__')"
  for k in 1 2; do
    piece heldout-single-$k 130 "${H[@]}"
    run heldout-two-$k 130 $py -c "$two" benchmark "${H[@]}" --save "$out/heldout-two-$k.json"
  done
  ;;
graphs)
  export DFLASH_DTYPE=float32
  $py -c "import json; json.dump(json.load(open('assets/prompts/chat_heldout.json'))[:12], open('/tmp/heldout12.json', 'w'))"
  # the first run on a fresh machine compiles MLX's kernels (over a minute; kept on disk for later runs)
  piece graphs-warm-up 150 --prompt "Hello" --max-tokens 16 --repeat 1
  for setting in ${GRAPH_SETTINGS:-100:20 1000:20 1000:50 1000:100 1000:200 100:100}; do
    cache=${setting%:*} ops=${setting#*:}
    MLX_CUDA_GRAPH_CACHE_SIZE=$cache MLX_MAX_OPS_PER_BUFFER=$ops piece "graphs-cache$cache-ops$ops" 90 \
      --prompts /tmp/heldout12.json --policy adaptive --policy-sweep fixed --repeat 1
  done
  ;;
*)
  echo "usage: bash scripts/gpu_figures.sh checks|cycle|overlap|heldout|compiled|trace|rows|now|now-checks|passes|graphs" >&2
  exit 2
  ;;
esac
stamp done
