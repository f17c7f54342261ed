#!/usr/bin/env bash
# The speed-up ladder on one GPU (python -m tst_jax.tools.ladder): configs/gpu_small.py's TST
# arm at several lengths and baselines of 0.5, 1, 1.5 and 2x each, in calls of at most TOTAL_S
# seconds into the same WORKDIR; each call resumes the last (run it again until the report
# lists nothing unfinished: about 22 minutes of one H100 for 1k,2k,4k).
#
#   bash benchmarks/ladder.sh [OUT_DIR]          # default OUT_DIR: $OUT, else ./ladder_out
#
# Environment (all optional):
#   LENGTHS   default 1k,2k,4k      SEEDS  default 0      PARALLEL  default 4
#   TST_ARM   the TST arm at every length (default tst: the config's own)
#   SOURCE    corpus (default: text:<torch venv site-packages>/**/*.py if it exists)
#   WORKDIR   default runs/ladder (git-ignored: kept while the machine stays warm)
#   TOTAL_S   wall-clock budget of this call, default 540
#   CONFIG    default configs/gpu_small.py (tests/fixtures/tiny_config.py: a CPU dry run)
# OUT_DIR gets ladder.{md,json,png}, speedup_trend.json (the fit: copy it to
# tst_jax/train/speedup_trend.json for the plan's prediction), results.{md,json} and env.json.
set -u
# shellcheck source=benchmarks/sweep_common.sh
. "$(dirname "$0")/sweep_common.sh"
sweep_start "${1:-${OUT:-ladder_out}}"
WORKDIR=${WORKDIR:-runs/ladder}
TOTAL_S=${TOTAL_S:-540}
write_env
sweep_left
timeout -k "$KILL_S" $(( LEFT + OUTER_EXTRA_S )) python3 -m tst_jax.tools.ladder \
    --config "${CONFIG:-configs/gpu_small.py}" --workdir "$WORKDIR" \
    --lengths "${LENGTHS:-1k,2k,4k}" --seeds "${SEEDS:-0}" --tst_arm "${TST_ARM:-tst}" \
    --parallel "${PARALLEL:-4}" --deadline_s "$LEFT" "${SET[@]}" 2>&1 | tail -n 60
for f in ladder.md ladder.json ladder.png speedup_trend.json results.md results.json; do
  [ -e "$WORKDIR/$f" ] && cp "$WORKDIR/$f" "$OUT_DIR/"
done
echo "packed into $OUT_DIR in $(( $(date +%s) - START )) s"
