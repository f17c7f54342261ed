#!/usr/bin/env bash
# One-command GPU benchmark (about 7 minutes on one H100): one JSON line per run.
#
#   bash benchmarks/gpu.sh [OUT_DIR]        # default OUT_DIR: ./gpu_bench (or $OUT)
#
# 1. The compiled-kernel tests that skip on CPU (tests/test_linear_mce.py -k gpu).
# 2. The fused loss at the paper's shape (N=16384, D=2048, V=128256, bf16), forward and
#    forward+backward: naive, xla and pallas, S=1 and S=6 (benchmarks/loss_tiles.py).
# 3. The train step (benchmarks/step.py, 16 x 2048): the 270M config with every default
#    (both phases), then each knob flipped; the 600M config; the 10B-A1B MoE's layer shapes
#    at 4 layers with each expert implementation; configs/qwen3_moe_gpu_small.py's two phases;
#    the grouped GEMM alone (benchmarks/grouped_matmul.py).
# docs/performance.md holds the numbers of a run, with the device, versions and date.
set -u
OUT_DIR=${1:-${OUT:-gpu_bench}}
mkdir -p "$OUT_DIR"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
log() { grep --line-buffered '^{' | tee -a "$OUT_DIR/gpu.jsonl"; }

python3 - <<'EOF' | log
import datetime, json, subprocess, jax, flax, optax
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip()
print(json.dumps(dict(env=True, gpu=gpu, jax=jax.__version__, flax=flax.__version__,
                      optax=optax.__version__, date=str(datetime.date.today()))))
EOF

JAX_PLATFORMS=cuda XLA_FLAGS= timeout 150 python3 -m pytest -q -p no:cacheprovider \
    tests/test_linear_mce.py -k gpu 2>&1 | tail -3 | tee -a "$OUT_DIR/tests.txt"

for s in 1 6; do
  timeout 150 python3 benchmarks/loss_tiles.py --s $s --configs 'naive;xla;pallas' | log
done

step() { timeout 120 python3 benchmarks/step.py --config "$1" --steps 6 --warmup 1 \
    --config.data.batch_size=16 "${@:2}" 2>&1 | log; }
M270=configs/llama_270m.py
step $M270 --phase both
step $M270 --phase ntp --config.loss.impl=xla
step $M270 --phase ntp --config.loss.impl=naive
step $M270 --phase ntp --config.model.attention_impl=xla
step $M270 --phase ntp --config.model.remat=none
step $M270 --phase ntp --config.model.remat=full
step $M270 --phase both --config.model.matmul_precision=fp8   # qwix: pip install -e '.[gpu]'
step configs/llama_600m.py --phase ntp
step configs/llama_600m.py --phase ntp --config.model.remat=full
# MoE: the 10B-A1B layer shapes (4 of 32 layers, 8 x 2048) with each expert implementation
# (gmm: tokamax's kernels when installed, pip install -e '.[gpu]'), the one-GPU recipe's two
# phases, and the grouped GEMM alone at the expert shapes (D 1024, F 768, 128 experts).
for impl in ragged gmm blocked; do
  step configs/qwen3_moe_10b_a1b.py --phase ntp --config.model.n_layers=4 \
      --config.data.batch_size=8 --config.model.expert_impl=$impl
done
for impl in gmm blocked; do
  timeout 300 python3 benchmarks/step.py --config configs/qwen3_moe_gpu_small.py --phase both \
      --steps 6 --warmup 1 --config.model.expert_impl=$impl 2>&1 | log
done
timeout 300 python3 benchmarks/grouped_matmul.py 2>&1 | log
