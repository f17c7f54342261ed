#!/usr/bin/env bash
# TST against its equal-FLOPs baseline on one GPU (configs/gpu_small.py), in one call of at
# most TOTAL_S seconds (default 530): the arms over the seeds, PARALLEL at a time on one
# tokenized corpus. Before anything runs, the arms asked for must fit the budget: their plan
# FLOPs at RATE, plus the sweep's overheads, within the seconds the sweep gets (TOTAL_S less
# the packing's); else one line says what they need, at which rate, and the script exits 2.
# Results are rewritten after every finished arm and packed into OUT_DIR even when the time
# runs out; a second call into the same WORKDIR (a warm machine) skips the finished arms.
#
#   bash benchmarks/gpu_small.sh [OUT_DIR]       # default OUT_DIR: $OUT, else ./gpu_small_out
#
# Environment (all optional):
#   ARMS      arms in order (default: baseline,tst,baseline+3k: one call on an H100); parts
#             of one arm joined by '+', e.g. s8+r0.5; also s4, s8, reinit, input_only,
#             output_only, r1.0, baseline+4k. Longer baselines give the equal-loss speed-up
#   SEEDS     default 0             PARALLEL  arms at once, default 4
#   STEPS     total steps per arm (default: the config's 2000)
#   SOURCE    corpus (default: text:<torch venv site-packages>/**/*.py if it exists, else the
#             config's builtin:pystdlib)           MAX_BYTES  default: the config's 200 MB
#   WORKDIR   default runs/gpu_small (git-ignored: kept while the machine stays warm)
#   TOTAL_S   wall-clock budget of this script, default 530
#   RATE      FLOP/s the arms get together, for the budget (default: below, by config);
#             BUDGET=off skips the check (arms that need several calls on a warm machine)
#   FINISHED  comma list of folders of finished points brought back (unpacked points.tar.gz)
#   EXTRA     more sweep arguments, e.g. "--set train.eval_every=50"
#   CONFIG    default configs/gpu_small.py; configs/qwen3_moe_one_call.py: the MoE whose
#             baseline, tst and baseline+2k fit one call; tests/fixtures/tiny_config.py: a CPU
#             dry run of this script
# OUT_DIR gets env.json, sweep.txt (the sweep's output), results.{json,md}, loss_vs_*.png,
# prepared.json and points.tar.gz: per point its config.json, plan.json, metrics.jsonl,
# summary.json, sweep_point.json and log tail, no checkpoints (8 files in all; a sweep or
# ladder run with FINISHED=<the unpacked folder> counts them as its own).
set -u
# shellcheck source=benchmarks/sweep_common.sh
. "$(dirname "$0")/sweep_common.sh"
sweep_start "${1:-${OUT:-gpu_small_out}}"

ARMS=${ARMS:-baseline,tst,baseline+3k}
SEEDS=${SEEDS:-0}
PARALLEL=${PARALLEL:-4}
WORKDIR=${WORKDIR:-runs/gpu_small}
TOTAL_S=${TOTAL_S:-530}
[ -n "${MAX_BYTES:-}" ] && SET+=(--set "data.max_bytes=$MAX_BYTES")
[ -n "${STEPS:-}" ] && SET+=(--set "train.steps=$STEPS")

# FLOP/s the arms get together on one H100 (the plan's FLOPs over it give the seconds):
# gpu_small, 2 to 6 arms at once: 166-171 TFLOP/s with start and evals (configs/gpu_small.py's
# docstring, 2026-11-23), 160 here; MoE configs: 60, assumed, not measured (one
# qwen3_moe_gpu_small arm alone ran at 84 TFLOP/s, 8.5% MFU: docs/performance.md).
case "${CONFIG:-configs/gpu_small.py}" in
  *moe*) RATE=${RATE:-60e12} ;;
  *) RATE=${RATE:-160e12} ;;
esac

write_env
sweep_left
SWEEP=(python3 -m tst_jax.tools.sweep --config "${CONFIG:-configs/gpu_small.py}"
       --workdir "$WORKDIR" --arms "$ARMS" --seeds "$SEEDS" --parallel "$PARALLEL"
       "${FIN[@]}" "${SET[@]}")
if [ "${BUDGET:-on}" != off ]; then   # the one line, before any corpus or compilation
  # shellcheck disable=SC2086
  "${SWEEP[@]}" ${EXTRA:-} --budget_s "$LEFT" --rate "$RATE" --dry_run > /dev/null || exit 2
fi
echo "sweep: arms $ARMS, seeds $SEEDS, $PARALLEL at once, ${LEFT} s left; ${SET[*]:-}"
# At the deadline the running arms checkpoint and stop; the same call resumes them.
# shellcheck disable=SC2086
timeout -k "$KILL_S" $(( LEFT + OUTER_EXTRA_S )) "${SWEEP[@]}" --deadline_s "$LEFT" \
    ${EXTRA:-} 2>&1 | tee "$OUT_DIR/sweep.txt" | grep -v '^|'
echo "sweep exit status ${PIPESTATUS[0]} (the finished arms are in the table)"
cp "$WORKDIR"/results.json "$WORKDIR"/results.md "$WORKDIR"/*.png "$OUT_DIR"/ 2>/dev/null
cp "$WORKDIR"/data_*/prepared.json "$OUT_DIR"/ 2>/dev/null
pack_points
cat "$OUT_DIR/results.md" 2>/dev/null
echo "packed into $OUT_DIR in $(( $(date +%s) - START )) s"
