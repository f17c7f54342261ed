#!/usr/bin/env bash
# TST against its equal-FLOPs baseline on one GPU (configs/gpu_small.py), in one call of at
# most TOTAL_S seconds (default 530): baseline and tst over the seeds first, then the ablations,
# PARALLEL arms at a time on one tokenized corpus. Results are rewritten after every finished
# arm and packed into OUT_DIR even when the time runs out; a second call into the same WORKDIR
# skips the finished arms and resumes the others.
#
#   bash benchmarks/gpu_small.sh [OUT_DIR]       # default OUT_DIR: $OUT, else ./gpu_small_out
#
# Environment (all optional):
#   ARMS      arms in order (default: baseline,tst,baseline+3k,baseline+4k,s4,s8,reinit,
#             input_only,output_only,r1.0); parts of one arm joined by '+', e.g. s8+r0.5.
#             The 3k and 4k baselines give the equal-loss speed-up (finished baselines)
#   SEEDS     default 0,1           PARALLEL  arms at once, default 4
#   STEPS     total steps per arm (default: the config's 2000)
#   SOURCE    corpus (default: text:<torch venv site-packages>/**/*.py if it exists, else the
#             config's builtin:pystdlib)           MAX_BYTES  default: the config's 200 MB
#   WORKDIR   default runs/gpu_small (git-ignored: kept while the machine stays warm)
#   TOTAL_S   wall-clock budget of this script, default 530
#   EXTRA     more sweep arguments, e.g. "--set train.eval_every=50"
#   CONFIG    default configs/gpu_small.py (tests/fixtures/tiny_config.py: a CPU dry run of
#             this script)
# OUT_DIR gets env.json, sweep.txt (the sweep's output), results.{json,md}, loss_vs_*.png and
# per arm its metrics.jsonl, summary.json, config.json, sweep_point.json, loss.png, log tail.
set -u
# shellcheck source=benchmarks/sweep_common.sh
. "$(dirname "$0")/sweep_common.sh"
sweep_start "${1:-${OUT:-gpu_small_out}}"

ARMS=${ARMS:-baseline,tst,baseline+3k,baseline+4k,s4,s8,reinit,input_only,output_only,r1.0}
SEEDS=${SEEDS:-0,1}
PARALLEL=${PARALLEL:-4}
WORKDIR=${WORKDIR:-runs/gpu_small}
TOTAL_S=${TOTAL_S:-530}
[ -n "${MAX_BYTES:-}" ] && SET+=(--set "data.max_bytes=$MAX_BYTES")
[ -n "${STEPS:-}" ] && SET+=(--set "train.steps=$STEPS")

write_env

pack() {
  cp "$WORKDIR"/results.json "$WORKDIR"/results.md "$WORKDIR"/*.png "$OUT_DIR"/ 2>/dev/null
  cp "$WORKDIR"/data_*/prepared.json "$OUT_DIR"/ 2>/dev/null
  for point in "$WORKDIR"/*/sweep_point.json; do
    [ -e "$point" ] || continue
    dir=$(dirname "$point"); name=$(basename "$dir")
    mkdir -p "$OUT_DIR/runs/$name"
    for f in metrics.jsonl summary.json config.json sweep_point.json loss.png; do
      [ -e "$dir/$f" ] && cp "$dir/$f" "$OUT_DIR/runs/$name/"
    done
    [ -e "$dir/sweep_log.txt" ] && tail -c 20000 "$dir/sweep_log.txt" > "$OUT_DIR/runs/$name/log_tail.txt"
  done
}

sweep_left
echo "sweep: arms $ARMS, seeds $SEEDS, $PARALLEL at once, ${LEFT} s left; ${SET[*]:-}"
# At the deadline the running arms checkpoint and stop; the same call resumes them.
# shellcheck disable=SC2086
timeout -k "$KILL_S" $(( LEFT + OUTER_EXTRA_S )) python3 -m tst_jax.tools.sweep \
    --config "${CONFIG:-configs/gpu_small.py}" --workdir "$WORKDIR" --arms "$ARMS" \
    --seeds "$SEEDS" --parallel "$PARALLEL" --deadline_s "$LEFT" "${SET[@]}" ${EXTRA:-} 2>&1 \
    | tee "$OUT_DIR/sweep.txt" | grep -v '^|'
echo "sweep exit status ${PIPESTATUS[0]} (the finished arms are in the table)"
pack
cat "$OUT_DIR/results.md" 2>/dev/null
echo "packed into $OUT_DIR in $(( $(date +%s) - START )) s"
