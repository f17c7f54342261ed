#!/usr/bin/env bash
# The speed-up ladder on one GPU (python -m tst_jax.tools.ladder): configs/gpu_small.py's TST
# arm at several lengths and baselines of 0.5, 1, 1.5 and 2x each, in calls of at most TOTAL_S
# seconds into the same WORKDIR; each call resumes the last on a warm machine. Points finished
# on earlier machines come back in as FINISHED folders (the unpacked points.tar.gz of a call,
# or docs/gpu/<date>_ladder/), so the ladder grows over several lent sessions. The report
# lists the points still missing and which one call (LENGTHS=...) completes the most rungs in
# TOTAL_S at RATE (about 33k steps of gpu_small for 1k,2k,4k: some 23 minutes of one H100).
#
#   bash benchmarks/ladder.sh [OUT_DIR]          # default OUT_DIR: $OUT, else ./ladder_out
#   PLAN_ONLY=1 FINISHED=docs/gpu/<date>_ladder bash benchmarks/ladder.sh /tmp/l  # CPU: what
#                                                # is missing, what one call should run
#
# Environment (all optional):
#   LENGTHS   default 1k,2k,4k      SEEDS  default 0      PARALLEL  default 4
#   TST_ARM   the TST arm at every length (default tst: the config's own)
#   FINISHED  comma list of folders of finished points (records only) to count as this
#             WORKDIR's
#   SOURCE    corpus (default: text:<torch venv site-packages>/**/*.py if it exists)
#   WORKDIR   default runs/ladder (git-ignored: kept while the machine stays warm)
#   TOTAL_S   wall-clock budget of this call, default 540
#   RATE      FLOP/s of the device for the next-call advice, default 160e12 (gpu_small.sh's)
#   PLAN_ONLY 1: train nothing, report and advise
#   CONFIG    default configs/gpu_small.py (tests/fixtures/tiny_config.py: a CPU dry run)
# OUT_DIR gets ladder.{md,json,png}, speedup_trend.json (the fit: copy it to
# tst_jax/train/speedup_trend.json for the plan's prediction), results.{md,json}, env.json and
# points.tar.gz (every point's records, no checkpoints: 8 files in all).
set -u
# shellcheck source=benchmarks/sweep_common.sh
. "$(dirname "$0")/sweep_common.sh"
sweep_start "${1:-${OUT:-ladder_out}}"
WORKDIR=${WORKDIR:-runs/ladder}
TOTAL_S=${TOTAL_S:-540}
write_env
sweep_left
MORE=("${FIN[@]}")
[ -n "${PLAN_ONLY:-}" ] && MORE+=(--plan_only)
timeout -k "$KILL_S" $(( LEFT + OUTER_EXTRA_S )) python3 -m tst_jax.tools.ladder \
    --config "${CONFIG:-configs/gpu_small.py}" --workdir "$WORKDIR" \
    --lengths "${LENGTHS:-1k,2k,4k}" --seeds "${SEEDS:-0}" --tst_arm "${TST_ARM:-tst}" \
    --parallel "${PARALLEL:-4}" --deadline_s "$LEFT" --rate "${RATE:-160e12}" \
    --budget_s $(( TOTAL_S - KEEP_S )) "${MORE[@]}" "${SET[@]}" 2>&1 | tail -n 60
for f in ladder.md ladder.json ladder.png speedup_trend.json results.md results.json; do
  [ -e "$WORKDIR/$f" ] && cp "$WORKDIR/$f" "$OUT_DIR/"
done
pack_points
echo "packed into $OUT_DIR in $(( $(date +%s) - START )) s"
