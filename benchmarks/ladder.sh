#!/usr/bin/env bash
# The speed-up ladders (python -m tst_jax.tools.ladder; tst_jax/tools/ladder_plan.py names them:
# moe, the MoE of configs/qwen3_moe_one_call.py, and dense, configs/gpu_small.py at S = 2 and 4),
# one lent GPU call of at most TOTAL_S seconds at a time. A machine keeps nothing between
# leases, so every run finishes inside its call and comes back as records (points.tar.gz);
# committed under docs/gpu/<date>-<device>/ and named in the ladder's `finished` (or FINISHED),
# they count as finished on any later machine.
#
#   bash benchmarks/ladder.sh --plan_only [OUT_DIR]   # any machine, no GPU: every ladder's
#       # points, measured against predicted speed-ups, the trends, the calls that finish the
#       # missing points at the rate measured on the latest lent device, and the one call
#       # that adds the most ("Next call: LADDER=... POINTS=...")
#   LADDER=moe POINTS=<as named> bash benchmarks/ladder.sh [OUT_DIR]   # a GPU: that call
#
# OUT_DIR defaults to $OUT, else ./ladder_out. Environment (all optional):
#   LADDER    a named ladder (default for --plan_only: moe,dense; a GPU call needs one)
#   POINTS    the points this call trains (default: all the ladder's); refused in one line,
#             before anything runs, when they do not fit the call at the ladder's rate
#   SEEDS     default 0 (a second seed is planned where a Δ is inside the seed noise)
#   PARALLEL  runs at once, default the ladder's
#   FINISHED  comma list of more folders of finished points (records only) to count
#   SOURCE    corpus (default: text:<torch venv site-packages>/**/*.py if it exists)
#   WORKDIR   default runs/ladder, a ladder in WORKDIR/<name> (git-ignored)
#   TOTAL_S   wall-clock budget of this call, default 480 (8 minutes)
#   RATE      FLOP/s of the device, default the ladder's (measured: ladder_plan.py)
# OUT_DIR gets per ladder <name>_ladder.{md,json,png}, speedup_trends.json (copy it over
# tst_jax/config/speedup_trends.json for the plan's outlook), env.json and, after a GPU call,
# points.tar.gz (the ladder's points' records, no checkpoints: at most 8 files in all).
set -u
PLAN_ONLY=
if [ "${1:-}" = --plan_only ]; then PLAN_ONLY=1; shift; fi
# shellcheck source=benchmarks/sweep_common.sh
. "$(dirname "$0")/sweep_common.sh"
sweep_start "${1:-${OUT:-ladder_out}}"
WORKDIR=${WORKDIR:-runs/ladder}
TOTAL_S=${TOTAL_S:-480}
# A GPU call spends up to this on the wheels' install (sweep_common.sh) before its sweep
# starts: a plan made elsewhere leaves it out of each call's seconds.
START_S=60
write_env
sweep_left
MORE=("${FIN[@]}")
[ -n "${RATE:-}" ] && MORE+=(--rate "$RATE")
[ -n "${PARALLEL:-}" ] && MORE+=(--parallel "$PARALLEL")
if [ -n "$PLAN_ONLY" ]; then
  MORE+=(--plan_only --ladder "${LADDER:-moe,dense}" --budget_s $(( LEFT - START_S )))
elif [ -z "${LADDER:-}" ]; then
  echo "a GPU call names its ladder: LADDER=<as --plan_only advises>" >&2
  exit 2
else
  MORE+=(--ladder "$LADDER" --points "${POINTS:-}" --budget_s "$LEFT")
fi
timeout -k "$KILL_S" $(( LEFT + OUTER_EXTRA_S )) python3 -m tst_jax.tools.ladder \
    --workdir "$WORKDIR" --seeds "${SEEDS:-0}" --deadline_s "$LEFT" "${MORE[@]}" "${SET[@]}" \
    2>&1 | tee "$OUT_DIR/ladder.txt" | tail -n 80
for dir in "$WORKDIR"/*/; do
  name=$(basename "$dir")
  for f in ladder.md ladder.json ladder.png; do
    [ -e "$dir/$f" ] && cp "$dir/$f" "$OUT_DIR/${name}_$f"
  done
done
[ -e "$WORKDIR/speedup_trends.json" ] && cp "$WORKDIR/speedup_trends.json" "$OUT_DIR/"
if [ -z "$PLAN_ONLY" ]; then
  WORKDIR=$WORKDIR/$LADDER pack_points
fi
echo "files in $OUT_DIR after $(( $(date +%s) - START )) s"
