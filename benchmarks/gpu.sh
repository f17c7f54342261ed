#!/usr/bin/env bash
# One-command GPU benchmark: one JSON line per run, in OUT_DIR/gpu.jsonl.
#
#   bash benchmarks/gpu.sh [OUT_DIR] [SECTIONS]   # default OUT_DIR: ./gpu_bench (or $OUT);
#                                                 # SECTIONS: quick, all, or a comma list of
#                                                 # those below
#
# moe_lab  the MoE lab in one call of at most LAB_S seconds (default 235) after the wheels'
#          install: benchmarks/moe_lab.py times every piece of one MoE layer alone at the
#          recipe's shapes (LAB_SHAPES=recipe,b10 adds the 10B-A1B's: a shape's compiles take
#          about 90 s), each dispatch, combine and expert-GEMM alternative side by side, and
#          each product of the grouped GEMM on Mosaic and on Triton (its rows in gpu.jsonl,
#          its table in lab.md); then the recipe's train step as the whole layer it measured
#          fastest (moe_lab.py --winner: expert_impl, dispatch_impl), once with gate and up
#          fused and once split: what decides expert_fuse_gate_up=auto (platform.py). Last,
#          gemm_measured.json: the package's table with this call's kernel times per product
#          (moe_lab.py --record), to copy into tst_jax/kernels/ once read.
#          TINY=1: the tiny shape, a CPU dry run
# search   the lab's bounded tuning search of the grouped GEMM (moe_lab.py --search): each of
#          the recipe's nine calls (forward, dX, dW of gate/up, down and gate+up fused) on the
#          kernel a run gives it, at most 36 configs around its pinned one in at most 60 s,
#          the call at most SEARCH_S seconds (default 540); gemm_measured.json as moe_lab's
# peer     the peers, apart from quick: Levanter's Grug MoE layer at the lab's shapes
#          (benchmarks/peer_grug.py, where ./.whl_peer holds its wheels: peer_wheels.sh), then
#          Hugging Face's Llama at llama_270m's shape under torch.compile (benchmarks/
#          peer_torch.py; its first compiled step took 119 s on an H200)
# quick    what decides the next step, in one call of at most QUICK_S seconds (default 470)
#          on a bare H100, the wheels' install included; each run has its own time bound
#          (QUICK_BOUNDS below, from the H100 logs in docs/gpu/2026-11-25-h100/) and none
#          outlasts the call's end. The MoE recipe in both phases (expert_impl=auto, its remat),
#          the 10B-A1B layer shapes at 4 layers, the recipe's step profile (dispatch+combine
#          share, grouped GEMMs as matmuls, the five slowest ops' optimized HLO in
#          ntp_top_ops.hlo.txt and the step's in ntp_step.hlo.txt.gz), dense llama_270m (both phases) and llama_600m at
#          their defaults, the grouped GEMM alone (XLA, and tokamax with the kernels a run gets).
#          tokamax runs its shipped tables only (TST_JAX_TOKAMAX_TUNING=off); then, in what is
#          left of the call, up to QUICK_TUNE_S seconds (default 60) autotune the grouped GEMM's
#          shapes and time them again, the tuning's seconds recorded. Last, a table of each
#          row's step time, MFU, peak memory and compile time (benchmarks/gpu_table.py). Files:
#          gpu.jsonl, quick_log.txt (every run's whole output), quick.md (the table).
#          TINY=1: the same commands at tiny shapes, a CPU dry run (tests/behaviour/test_gpu_sh.py)
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
# `all` runs every section but moe_lab, peer and quick, in this order; each also runs alone (e.g. `moe,profile`).
# DONE_ROWS (a comma list of row names) skips those rows: benchmarks/gpu_budget.sh's rows done.
# Where ./.whl holds wheels (../shared/tools/gpu_wheels.sh) and tokamax is not importable,
# they are installed into /tmp/site first. docs/performance.md holds the numbers of a run,
# with the device, versions and date.
set -u
OUT_DIR=${1:-${OUT:-gpu_bench}}
SECTIONS=${2:-all}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
log() { grep --line-buffered '^{' | tee -a "$OUT_DIR/gpu.jsonl"; }
want() { { [ "$SECTIONS" = all ] && [ "$1" != quick ] && [ "$1" != moe_lab ] \
             && [ "$1" != peer ] && [ "$1" != search ]; } \
    || [[ ",$SECTIONS," == *",$1,"* ]]; }
START=$(date +%s)
SCALE=1
[ -n "${TINY:-}" ] && SCALE=6   # the CPU compiles the tiny models about as long, on fewer cores
QUICK_S=${QUICK_S:-$(( 470 * SCALE ))}
LAB_S=${LAB_S:-$(( 235 * SCALE ))}
SEARCH_S=${SEARCH_S:-$(( 540 * SCALE ))}
END=$(( START + QUICK_S ))   # the running section's end: each section sets its own
# bounded NAME BOUND_S CMD...: CMD under `timeout`, at most BOUND_S and never past END;
# its JSON lines go to gpu.jsonl tagged {"row": NAME}, its whole output to quick_log.txt, and
# a last line records its exit status, wall time and bound (124: it ran out of time).
bounded() {
  local name=$1 bound=$2 t0 limit rc
  shift 2
  if [[ ",${DONE_ROWS:-}," == *",$name,"* ]]; then   # gpu_budget.sh: done at this code
    echo "{\"row\": \"$name\", \"skipped\": \"done at this code in an earlier run\"}" | log
    return
  fi
  t0=$(date +%s)
  limit=$(( END - t0 - 5 ))
  [ $(( bound * SCALE )) -lt "$limit" ] && limit=$(( bound * SCALE ))
  if [ "$limit" -lt 5 ]; then
    echo "{\"row\": \"$name\", \"skipped\": \"no time left of the section's seconds\"}" | log
    return
  fi
  echo "== $name: $* (bound ${limit} s)" >> "$OUT_DIR/quick_log.txt"
  timeout -k 5 "$limit" "$@" 2>&1 | tee -a "$OUT_DIR/quick_log.txt" \
      | sed -u "s/^{\"/{\"row\": \"$name\", \"/" | log
  rc=${PIPESTATUS[0]}
  printf '{"row": "%s", "rc": %d, "wall_s": %d, "bound_s": %d}\n' "$name" "$rc" \
      $(( $(date +%s) - t0 )) "$limit" | log
}

# shellcheck source=benchmarks/wheels.sh
. benchmarks/wheels.sh
INSTALL_S=45
if [ -z "${TINY:-}" ] && compgen -G "$WHEELS/*.whl" > /dev/null \
    && ! python3 -c 'import tokamax' 2> /dev/null; then
  t0=$(date +%s)   # in this shell, not `bounded`: it exports PYTHONPATH
  install_wheels timeout -k 5 "$INSTALL_S" >> "$OUT_DIR/quick_log.txt" 2>&1
  printf '{"row": "install", "rc": %d, "wall_s": %d, "bound_s": %d}\n' "$?" \
      $(( $(date +%s) - t0 )) "$INSTALL_S" | log
fi

bounded env 20 python3 - <<'EOF'
import datetime, importlib.metadata as md, json, subprocess, jax, flax, optax
def out(*cmd):
  try:
    return subprocess.run(cmd, capture_output=True, text=True).stdout.strip() or None
  except OSError:
    return None
def version(name):
  try:
    return md.version(name)
  except md.PackageNotFoundError:
    return None
print(json.dumps(dict(
    env=True, gpu=out("nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"),
    device=jax.devices()[0].device_kind, jax=jax.__version__, flax=flax.__version__,
    optax=optax.__version__, tokamax=version("tokamax"), qwix=version("qwix"),
    commit=out("git", "rev-parse", "HEAD"), date=str(datetime.date.today()))))
EOF

# The train-step runs of moe_lab and quick, at their shapes (TINY=1: tiny ones on the CPU).
QSTEP=(python3 benchmarks/step.py --steps 6 --warmup 1)
# One micro-batch each: the paper configs split a 64-GPU batch in 2 (their fit checks), a GPU
# here steps on the rows it is given.
SHAPE_B10=(--config.model.n_layers=4 --config.data.batch_size=8 --config.optimizer.grad_accum=1)
SHAPE_270=(--config.data.batch_size=16)
SHAPE_600=(--config.data.batch_size=16 --config.optimizer.grad_accum=1)
SHAPE_RECIPE=() GEMM=()
LAB=(python3 benchmarks/moe_lab.py --budget_s 105 --shapes "${LAB_SHAPES:-recipe}")
if [ -n "${TINY:-}" ]; then   # every model 2 layers of D 32, 2 x 32 positions, on the CPU
  SMALL=(--config.model.dim=32 --config.model.n_layers=2 --config.model.n_heads=2
         --config.model.n_kv_heads=1 --config.model.head_dim=16 --config.model.ffw_dim=64
         --config.model.vocab_size=512 --config.data.batch_size=2 --config.data.seq_len=32)
  EXPERTS=(--config.model.n_experts=4 --config.model.n_experts_per_token=2
           --config.model.moe_ffw_dim=16)
  SHAPE_B10=("${SMALL[@]}" "${EXPERTS[@]}") SHAPE_RECIPE=("${SMALL[@]}" "${EXPERTS[@]}")
  SHAPE_270=("${SMALL[@]}") SHAPE_600=("${SMALL[@]}") GEMM=(--smoke)
  QSTEP=(python3 benchmarks/step.py --steps 1 --warmup 0)
  LAB=(python3 benchmarks/moe_lab.py --tiny --repeats 2)
fi

# The package's table of grouped GEMM measurements with this call's in it, in OUT_DIR.
record() {
  [ -f tst_jax/kernels/gemm_measured.json ] && [ ! -f "$OUT_DIR/gemm_measured.json" ] \
      && cp tst_jax/kernels/gemm_measured.json "$OUT_DIR/gemm_measured.json"
  python3 benchmarks/moe_lab.py --record "$OUT_DIR/gpu.jsonl" \
      --into "$OUT_DIR/gemm_measured.json" | tee -a "$OUT_DIR/quick_log.txt"
}

if want moe_lab; then
  # Bounds: the lab's rows stop starting at its --budget_s (105 s, half per shape; compiles
  # are most of it, 57 s in all on an H200, docs/gpu/2026-11-27-h200-b); a step took 41 s
  # there. With the install's they fit one call of 5 minutes: tests/behaviour/test_gpu_sh.py.
  END=$(( $(date +%s) + LAB_S ))
  export TST_JAX_TOKAMAX_TUNING=off   # pinned configs and tokamax's tables, as quick
  bounded lab 135 "${LAB[@]}"
  python3 benchmarks/moe_lab.py --table "$OUT_DIR/gpu.jsonl" > "$OUT_DIR/lab.md"
  for fuse in on off; do
    read -r -a WINNER <<< "$(python3 benchmarks/moe_lab.py --winner "$OUT_DIR/gpu.jsonl" \
                             --fuse $fuse | tail -n 1)"
    bounded "lab_step_fuse_$fuse" 50 "${QSTEP[@]}" --config configs/qwen3_moe_gpu_small.py \
        "${SHAPE_RECIPE[@]}" --phase ntp "${WINNER[@]}"
  done
  record
fi

if want search; then
  END=$(( $(date +%s) + SEARCH_S ))
  bounded search "$SEARCH_S" python3 benchmarks/moe_lab.py --search --shapes recipe \
      ${TINY:+--tiny}
  record
fi

if want peer; then
  END=$(( $(date +%s) + 480 ))
  if compgen -G "${WHEELS_PEER:-.whl_peer}/*.whl" > /dev/null \
      && bash benchmarks/peer_wheels.sh --install /tmp/peer_site >> "$OUT_DIR/quick_log.txt"; then
    bounded peer_grug 90 env PYTHONPATH="/tmp/peer_site:$PYTHONPATH" \
        python3 benchmarks/peer_grug.py ${TINY:+--tiny}
  fi
  bounded peer_torch 380 python3 benchmarks/peer_torch.py ${TINY:+--tiny --no-compile --steps 2}
fi

if want quick; then
  # Bounds: about 1.2x each run's longest wall time, on the H100 (docs/gpu/2026-11-25-h100's
  # glog timestamps: recipe both phases 77 s, 10B-A1B 54 s, recipe profile ~50 s, 270M both
  # phases 36 s, 600M 24 s) or the H200 (docs/gpu/2026-11-27-h200/gpu.jsonl: 61, 48, 45, 27,
  # 21 s, the grouped GEMM 32 s); the masked 270M ntp row's is a guess. With the install's
  # they sum to at most QUICK_S: tests/behaviour/test_gpu_sh.py checks it.
  END=$(( $(date +%s) + QUICK_S ))
  export TST_JAX_TOKAMAX_TUNING=off   # tokamax's shipped tables: tuning is the bounded last row
  bounded recipe 92 "${QSTEP[@]}" --config configs/qwen3_moe_gpu_small.py \
      "${SHAPE_RECIPE[@]}" --phase both
  bounded b10 65 "${QSTEP[@]}" --config configs/qwen3_moe_10b_a1b.py "${SHAPE_B10[@]}" \
      --phase ntp
  bounded profile 60 "${QSTEP[@]}" --config configs/qwen3_moe_gpu_small.py \
      "${SHAPE_RECIPE[@]}" --phase ntp --profile 3 --hlo_dir "$OUT_DIR"
  bounded d270 45 "${QSTEP[@]}" --config configs/llama_270m.py "${SHAPE_270[@]}" --phase both
  bounded d270_docs 40 "${QSTEP[@]}" --config configs/llama_270m.py "${SHAPE_270[@]}" \
      --phase ntp --config.data.document_mask=True     # the attention's mask: its cost
  bounded d600 30 "${QSTEP[@]}" --config configs/llama_600m.py "${SHAPE_600[@]}" --phase ntp
  bounded gemm 45 python3 benchmarks/grouped_matmul.py "${GEMM[@]}" --backends xla,tokamax
  # What is left, up to QUICK_TUNE_S: tokamax autotunes the grouped GEMM's three shapes (its
  # compile_s holds the tuning) and times them; a timeout here says tuning needs longer.
  bounded gemm_tuned "${QUICK_TUNE_S:-60}" env TST_JAX_TOKAMAX_TUNING=/tmp/tst_jax_tokamax \
      python3 benchmarks/grouped_matmul.py "${GEMM[@]}" --backends tokamax
  python3 benchmarks/gpu_table.py "$OUT_DIR/gpu.jsonl" | tee "$OUT_DIR/quick.md"
fi

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
  M600=(--config configs/llama_600m.py --config.data.batch_size=16 --config.optimizer.grad_accum=1)
  step "${M600[@]}" --phase ntp
  step "${M600[@]}" --phase ntp --config.model.remat=full
fi

# MoE: the 10B-A1B layer shapes (4 of its 32 layers, 8 x 2048) and the one-GPU recipe.
# (expert_impl=ragged, XLA's ragged_dot, ran out of memory there on 2026-11-25: not rerun.)
B10=(--config configs/qwen3_moe_10b_a1b.py --config.model.n_layers=4 --config.data.batch_size=8
     --config.optimizer.grad_accum=1 --phase ntp)
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
