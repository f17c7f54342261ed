# Sourced by gpu_small.sh and ladder.sh, the sweeps that resume across calls of at most TOTAL_S
# seconds into one WORKDIR: what they share.
#   sweep_start OUT_DIR   START, OUT_DIR made and absolute, the repo root as the working
#                         directory and on PYTHONPATH, ./.whl installed (wheels.sh), tokamax's
#                         autotuning off unless TST_JAX_TOKAMAX_TUNING names a folder; SET
#                         holds --set data.source=... when SOURCE is given or the torch venv's
#                         site-packages exist
#   write_env             OUT_DIR/env.json (and stdout): device, GPU and driver, versions, date,
#                         commit
#   sweep_left            LEFT: the seconds the sweep gets as --deadline_s
#   pack_points           OUT_DIR/points.tar.gz: every point of WORKDIR that the sweep
#                         started, its config.json, plan.json, metrics.jsonl, summary.json,
#                         sweep_point.json and log tail, no checkpoints (one file: a device
#                         call brings back at most 8)
# At its deadline the sweep asks its trainers to checkpoint and waits up to GRACE_S (90 s,
# tst_jax/tools/sweep/run.py) for them, then writes its report: the scripts kill it only at
# `timeout -k $KILL_S $(( LEFT + OUTER_EXTRA_S ))`, and KEEP_S of TOTAL_S hold that and the
# packing (tests/behaviour/test_gpu_sh.py checks the sums).
KEEP_S=150
OUTER_EXTRA_S=120
KILL_S=10
TORCH_PY=/opt/torch/.venv/lib/python3.12/site-packages

sweep_start() {
  START=$(date +%s)
  OUT_DIR=$1
  mkdir -p "$OUT_DIR"
  OUT_DIR=$(cd "$OUT_DIR" && pwd)
  cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
  export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  # shellcheck source=benchmarks/wheels.sh
  . benchmarks/wheels.sh
  install_wheels timeout -k 5 60
  # tokamax's shipped tables, as gpu.sh's rows: a bare machine autotunes every MoE shape anew,
  # and on an H200 (2026-11-27) that took the ladder's whole 200 s deadline before a step.
  export TST_JAX_TOKAMAX_TUNING=${TST_JAX_TOKAMAX_TUNING:-off}
  if [ -z "${SOURCE:-}" ] && [ -d "$TORCH_PY" ]; then SOURCE="text:$TORCH_PY/**/*.py"; fi
  SET=()
  [ -n "${SOURCE:-}" ] && SET+=(--set "data.source=$SOURCE")
  FIN=()   # --finished per folder of FINISHED (comma list): points brought back
  local folders f
  IFS=, read -r -a folders <<< "${FINISHED:-}"
  for f in "${folders[@]}"; do FIN+=(--finished "$f"); done
  return 0
}

write_env() {
  python3 - "$OUT_DIR/env.json" <<'PY'
import datetime, json, subprocess, sys, jax, flax, optax
def out(*cmd):
  try:
    return subprocess.run(cmd, capture_output=True, text=True).stdout.strip() or None
  except OSError:
    return None
env = dict(device=jax.devices()[0].device_kind,
           gpu=out("nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"),
           jax=jax.__version__, flax=flax.__version__, optax=optax.__version__,
           date=str(datetime.date.today()), commit=out("git", "rev-parse", "HEAD"))
print(json.dumps(env))
json.dump(env, open(sys.argv[1], "w"), indent=1)
PY
}

sweep_left() {
  LEFT=$(( TOTAL_S - ($(date +%s) - START) - KEEP_S ))
  [ "$LEFT" -lt 30 ] && LEFT=30
  return 0
}

pack_points() {
  local stage point dir name f
  stage=$(mktemp -d)
  for point in "$WORKDIR"/*/sweep_point.json; do
    [ -e "$point" ] || continue
    dir=$(dirname "$point"); name=$(basename "$dir")
    mkdir -p "$stage/runs/$name"
    for f in config.json plan.json metrics.jsonl summary.json sweep_point.json; do
      [ -e "$dir/$f" ] && cp "$dir/$f" "$stage/runs/$name/"
    done
    [ -e "$dir/sweep_log.txt" ] \
        && tail -c 20000 "$dir/sweep_log.txt" > "$stage/runs/$name/log_tail.txt"
  done
  [ -d "$stage/runs" ] && tar -czf "$OUT_DIR/points.tar.gz" -C "$stage" runs
  rm -rf "$stage"
  return 0
}
