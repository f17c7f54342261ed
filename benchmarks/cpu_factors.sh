#!/usr/bin/env bash
# Where TST pays, on 2 CPU cores (issue 64; docs/results.md, "Where TST pays"): from
# configs/cpu_ladder.py one factor moved at a time toward configs/gpu_small.py's regime, then
# configs/tiny_moe.py as shipped and at the factor value that moved Δ most; each point TST
# against its equal-FLOPs baseline over SEEDS, written down here before any ran.
# Each point is one `tools.sweep` into WORKDIR/<point> (finished runs are skipped, interrupted
# ones resume), and its records (config, plan, metrics, summary: no checkpoints) are copied to
# docs/cpu_factors/<point>/ as soon as it finishes, with the sweep's results.{md,json}, and
# docs/cpu_factors/table.md is rewritten with every finished point (cpu_factors_table.py).
#
#   bash benchmarks/cpu_factors.sh --list            # the points, their settings and runs
#   POINTS=base,pos2k bash benchmarks/cpu_factors.sh # those points, in the order named
#   bash benchmarks/cpu_factors.sh                   # every point, in the planned order
#
# Environment (all optional): POINTS (default: all), SEEDS (0,1,2), PARALLEL (2),
# WORKDIR (runs/cpu_factors, git-ignored), DOCS (docs/cpu_factors), PYTHON (python).
set -euo pipefail
cd "$(dirname "$0")/.."
SEEDS=${SEEDS:-0,1,2}
PARALLEL=${PARALLEL:-2}
WORKDIR=${WORKDIR:-runs/cpu_factors}
DOCS=${DOCS:-docs/cpu_factors}
PYTHON=${PYTHON:-python}

# point|config (cpu_ladder: B 8, L 64, d 64, V 1024, 4000 steps; tiny_moe: B 16, L 128,
# V 4096, 200 steps)|factor|--set overrides; every point evaluates on 32,768 held-out
# positions (data.eval_batches x B x L), the same ones within each config
PLAN="
base|configs/cpu_ladder.py|the ladder's recipe|
pos2k|configs/cpu_ladder.py|positions per step 2,048 (B 32), the same tokens and FLOPs|data.batch_size=32 data.eval_batches=16 train.steps=1000 train.eval_every=250
pos8k|configs/cpu_ladder.py|positions per step 8,192 (B 128), the same tokens and FLOPs|data.batch_size=128 data.eval_batches=4 train.steps=250 train.eval_every=50
len256|configs/cpu_ladder.py|sequence length 256 (B 2), the same positions per step|data.seq_len=256 data.batch_size=2 data.eval_batches=64
len512|configs/cpu_ladder.py|sequence length 512 (B 1), the same positions per step|data.seq_len=512 data.batch_size=1 data.eval_batches=64
vocab4k|configs/cpu_ladder.py|vocabulary 4,096|model.vocab_size=4096
vocab8k|configs/cpu_ladder.py|vocabulary 8,192|model.vocab_size=8192
d96|configs/cpu_ladder.py|width 96 (F 288), the same steps|model.dim=96 model.ffw_dim=288
d128|configs/cpu_ladder.py|width 128 (F 384), the same steps|model.dim=128 model.ffw_dim=384
t12k|configs/cpu_ladder.py|12,000 steps: 19 tokens per parameter, on 24 MB|train.steps=12000 train.eval_every=3000 data.max_bytes=24000000
t20k|configs/cpu_ladder.py|20,000 steps: 31 tokens per parameter, on 40 MB|train.steps=20000 train.eval_every=5000 data.max_bytes=40000000
moe|configs/tiny_moe.py|the tiny MoE as shipped (S 4, 2,048 positions a step, 200 steps)|
moe_pos512|configs/tiny_moe.py|the tiny MoE at 512 positions a step (B 4), 800 steps, the same tokens and FLOPs|data.batch_size=4 data.eval_batches=64 train.steps=800 train.eval_every=200
"

points() { echo "$PLAN" | grep -v '^$'; }

if [ "${1:-}" = --list ]; then
  points | while IFS='|' read -r name config what sets; do
    printf '%-10s %s: %s\n           --set %s\n' "$name" "$config" "$what" "${sets:-(none)}"
  done
  exit 0
fi

wanted=${POINTS:-$(points | cut -d'|' -f1 | paste -sd, -)}
for name in ${wanted//,/ }; do
  line=$(points | grep "^$name|") || { echo "error: POINTS: unknown point '$name'; the points: $(points | cut -d'|' -f1 | paste -sd, -)" >&2; exit 2; }
  config=$(echo "$line" | cut -d'|' -f2)
  sets=$(echo "$line" | cut -d'|' -f4)
  args=()
  for kv in $sets; do args+=(--set "$kv"); done
  echo "=== $name: $config, $(echo "$line" | cut -d'|' -f3)"
  "$PYTHON" -m tst_jax.tools.sweep --config "$config" --workdir "$WORKDIR/$name" \
      --arms baseline,tst --seeds "$SEEDS" --parallel "$PARALLEL" \
      --compilation_cache "$WORKDIR/.jax_cache" "${args[@]}"
  mkdir -p "$DOCS/$name/runs"
  cp "$WORKDIR/$name/results.md" "$WORKDIR/$name/results.json" "$DOCS/$name/"
  for point in "$WORKDIR/$name"/*/sweep_point.json; do
    dir=$(dirname "$point"); run=$(basename "$dir")
    mkdir -p "$DOCS/$name/runs/$run"
    for f in config.json plan.json metrics.jsonl summary.json sweep_point.json; do
      [ -e "$dir/$f" ] && cp "$dir/$f" "$DOCS/$name/runs/$run/"
    done
  done
  "$PYTHON" benchmarks/cpu_factors_table.py "$DOCS" > "$DOCS/table.md"   # every finished point
done
