#!/usr/bin/env bash
# One-command GPU benchmark: one JSON line per run, in OUT_DIR/gpu.jsonl.
#
#   bash benchmarks/gpu.sh [OUT_DIR] [SECTIONS]   # default OUT_DIR: ./gpu_bench (or $OUT);
#                                                 # SECTIONS: all, or a comma list of those below
#
# tests    the compiled-kernel tests that skip on CPU (tests/kernels/test_linear_mce.py -k gpu)
# loss     the fused loss at the paper's shape (N=16384, D=2048, V=128256, bf16), forward and
#          forward+backward: naive, xla and pallas, S=1 and S=6 (benchmarks/loss_tiles.py)
# dense    the train step (benchmarks/step.py, 16 x 2048): the 270M config with every default
#          (both phases), then each knob flipped; the 600M config
# tune     tokamax's autotuning of the MoE shapes below, once (kept in the user cache dir,
#          kernels/tokamax_tuning.py: minutes, unmeasured; the later sections reuse it)
# moe      the 10B-A1B MoE's layer shapes at 4 layers (8 x 2048): gmm (auto) with remat
#          save_dots and save_experts, blocked; configs/qwen3_moe_gpu_small.py's two phases
#          with gmm at its default (save_experts) and save_dots, and blocked: MFU (targets:
#          >= 30% at the 10B-A1B shapes, >= 25% on the recipe), step time, peak memory
# profile  where those MoE steps go (--profile 3, command buffers off): the dispatch+combine
#          row's share of the step (target <= 10%), the grouped GEMMs as matmul rows
# gemm     the grouped GEMM alone at the expert shapes (D 1024, F 768, 128 experts, 131009
#          rows), forward and forward+backward, % of bf16 peak (target >= 50%): XLA, tokamax as
#          a run gets it (platform.py's kernel per product), all-Mosaic, all-Triton
# The sections run in this order; each also runs alone (e.g. `moe,profile`), which keeps a call
# short where a machine is lent for minutes. docs/performance.md holds the numbers of a run,
# with the device, versions and date.
set -u
OUT_DIR=${1:-${OUT:-gpu_bench}}
SECTIONS=${2:-all}
mkdir -p "$OUT_DIR"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
log() { grep --line-buffered '^{' | tee -a "$OUT_DIR/gpu.jsonl"; }
want() { [ "$SECTIONS" = all ] || [[ ",$SECTIONS," == *",$1,"* ]]; }

python3 - <<'EOF' | log
import datetime, importlib.metadata as md, json, subprocess, jax, flax, optax
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip()
def version(name):
  try:
    return md.version(name)
  except md.PackageNotFoundError:
    return None
print(json.dumps(dict(env=True, gpu=gpu, jax=jax.__version__, flax=flax.__version__,
                      optax=optax.__version__, tokamax=version("tokamax"),
                      qwix=version("qwix"), date=str(datetime.date.today()))))
EOF

if want tests; then
  JAX_PLATFORMS=cuda XLA_FLAGS= timeout 150 python3 -m pytest -q -p no:cacheprovider \
      tests/kernels/test_linear_mce.py -k gpu 2>&1 | tail -3 | tee -a "$OUT_DIR/tests.txt"
fi

if want loss; then
  for s in 1 6; do
    timeout 150 python3 benchmarks/loss_tiles.py --s $s --configs 'naive;xla;pallas' | log
  done
fi

step() { timeout "${LIMIT:-120}" python3 benchmarks/step.py --steps 6 --warmup 1 "$@" 2>&1 | log; }
if want dense; then
  M270=(--config configs/llama_270m.py --config.data.batch_size=16)
  step "${M270[@]}" --phase both
  step "${M270[@]}" --phase ntp --config.loss.impl=xla
  step "${M270[@]}" --phase ntp --config.loss.impl=naive
  step "${M270[@]}" --phase ntp --config.model.attention_impl=xla
  step "${M270[@]}" --phase ntp --config.model.remat=none
  step "${M270[@]}" --phase ntp --config.model.remat=full
  step "${M270[@]}" --phase both --config.model.matmul_precision=fp8   # qwix: '.[gpu]'
  step --config configs/llama_600m.py --config.data.batch_size=16 --phase ntp
  step --config configs/llama_600m.py --config.data.batch_size=16 --phase ntp \
      --config.model.remat=full
fi

# MoE: the 10B-A1B layer shapes (4 of its 32 layers, 8 x 2048) and the one-GPU recipe.
# (expert_impl=ragged, XLA's ragged_dot, ran out of memory there on 2026-11-25: not rerun.)
B10=(--config configs/qwen3_moe_10b_a1b.py --config.model.n_layers=4 --config.data.batch_size=8
     --phase ntp)
RECIPE=(--config configs/qwen3_moe_gpu_small.py)
if want tune; then   # traces each shape once: tokamax tunes what its tables lack, then keeps it
  LIMIT=3000 step "${B10[@]}" --config.model.expert_impl=gmm --steps 1
  LIMIT=3000 step "${RECIPE[@]}" --phase ntp --config.model.expert_impl=gmm --steps 1
fi
if want moe; then
  LIMIT=300 step "${B10[@]}"                                   # auto: gmm (tokamax), save_dots
  LIMIT=300 step "${B10[@]}" --config.model.remat=save_experts
  LIMIT=300 step "${B10[@]}" --config.model.expert_impl=blocked
  LIMIT=300 step "${RECIPE[@]}" --phase both                   # auto: gmm, save_experts
  LIMIT=300 step "${RECIPE[@]}" --phase ntp --config.model.remat=save_dots
  LIMIT=300 step "${RECIPE[@]}" --phase ntp --config.model.expert_impl=blocked
fi
if want profile; then
  LIMIT=300 step "${B10[@]}" --profile 3
  LIMIT=300 step "${RECIPE[@]}" --phase ntp --profile 3
fi
if want gemm; then
  timeout 600 python3 benchmarks/grouped_matmul.py --backends \
      xla,tokamax,tokamax:mosaic/mosaic/mosaic,tokamax:triton/triton/triton 2>&1 | log
fi
