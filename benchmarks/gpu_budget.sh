#!/usr/bin/env bash
# One prepared command that spends a fixed GPU time budget, BUDGET_S seconds (default 540: one
# lent call of at most 10 minutes), on what matters most, science first:
#   (a) the MoE lab (gpu.sh moe_lab, at most 3 minutes), only where no lab has measured today's
#       MoE path: benchmarks/gpu_budget.py fingerprints the lab's source and what it imports of
#       the kernels, the MoE layer and the platform's choices, and looks for a lab at that
#       fingerprint in every gpu.jsonl under docs/gpu and in LAST;
#   (b) the ladder's next points (tools.ladder, LADDER, default moe) in most of the budget: the
#       call its plan packs into the seconds left, or POINTS; tokamax's shipped tables, never
#       its autotuning;
#   (c) gpu.sh quick in the time left, but its rows done at today's code, without its
#       autotuned row.
# Every row lands in gpu.jsonl as it finishes, so a budget cut short keeps what finished. Run
# again with the last run's folder as LAST, it goes on with what is still missing: the lab is
# skipped once measured, the ladder counts that folder's finished points, quick skips its done
# rows. It ends by printing the next command.
#
#   bash benchmarks/gpu_budget.sh [OUT_DIR]              # a GPU (carry .whl, timeout_s 600)
#   bash benchmarks/gpu_budget.sh --plan_only [OUT_DIR]  # any machine: what it would run, the
#                                                        # ladder's calls of a budget and how
#                                                        # many budgets its first trend needs
#   TINY=1 bash benchmarks/gpu_budget.sh OUT_DIR         # the whole of it on the CPU, tiny
#                                                        # (tests/behaviour/test_gpu_budget.py)
#
# OUT_DIR defaults to $OUT, else ./budget_out. Environment (all optional): BUDGET_S; LAST (the
# last run's folder: gpu.jsonl, points.tar.gz); LAB (1 runs the lab, 0 skips it); LADDER;
# POINTS (the ladder's points instead of its plan's); FINISHED, SOURCE as for ladder.sh;
# WORKDIR (default runs/budget, git-ignored). OUT_DIR gets at most 8 files, the most a lent
# call brings back: gpu.jsonl, budget.md (the plan, the stages, the ladder's tables, the next
# command), quick_log.txt (every run's output), lab.md, quick.md, points.tar.gz (the ladder's
# points, as ladder.sh packs them) and the profiled step's HLO; anything more goes into
# more.tar.gz.
set -u
PLAN_ONLY=
if [ "${1:-}" = --plan_only ]; then PLAN_ONLY=1; shift; fi
# shellcheck source=benchmarks/sweep_common.sh
. "$(dirname "$0")/sweep_common.sh"
sweep_start "${1:-${OUT:-budget_out}}"
export TST_JAX_TOKAMAX_TUNING=off   # never autotune: a bare machine spends minutes per shape
SCALE=1
[ -n "${TINY:-}" ] && SCALE=6       # the CPU compiles the tiny models about as long (gpu.sh)
TOTAL_S=${BUDGET_S:-$(( 540 * SCALE ))}
WORKDIR=${WORKDIR:-runs/budget}
mkdir -p "$WORKDIR"
REPORT_S=30                         # the report, its plan of the next budget, the packing
END=$(( START + TOTAL_S - REPORT_S ))
LOG=$OUT_DIR/quick_log.txt
PLAN=(python3 benchmarks/gpu_budget.py --out "$OUT_DIR" --workdir "$WORKDIR"
      --budget_s "$TOTAL_S" --keep_s "$KEEP_S" --ladder "${LADDER:-moe}" ${TINY:+--tiny}
      ${LAST:+--last "$LAST"} "${FIN[@]}" "${SET[@]}")
# stage NAME T0 BOUND RC: the stage's row, as gpu.sh's `bounded` writes its runs' rows.
stage() {
  printf '{"row": "budget_%s", "rc": %d, "wall_s": %d, "bound_s": %d}\n' "$1" "$4" \
      $(( $(date +%s) - $2 )) "$3" | tee -a "$OUT_DIR/gpu.jsonl"
}

"${PLAN[@]}" start ${PLAN_ONLY:+--plan_only} ${LAB:+--lab "$LAB"} || exit 2
[ -n "$PLAN_ONLY" ] && exit 0
# shellcheck source=/dev/null
. "$WORKDIR/budget.sh"              # LAB_RUN, LAB_S, DONE_ROWS

if [ "$LAB_RUN" = 1 ]; then
  t0=$(date +%s)
  LAB_S=$LAB_S bash benchmarks/gpu.sh "$OUT_DIR" moe_lab
  rc=$?
  stage lab "$t0" "$(( LAB_S + 15 ))" "$rc"
fi

sweep_left
LADDER_ARGS=()
rm -f "$WORKDIR/ladder_call.sh"
"${PLAN[@]}" ladder --left_s "$LEFT" ${POINTS:+--points "$POINTS"} >> "$LOG" 2>&1
# shellcheck source=/dev/null
[ -e "$WORKDIR/ladder_call.sh" ] && . "$WORKDIR/ladder_call.sh"   # LADDER_ARGS, LADDER_WORKDIR
if [ "${#LADDER_ARGS[@]}" -gt 0 ]; then
  t0=$(date +%s)
  sweep_left
  echo "== ladder: ${LADDER_ARGS[*]} (deadline ${LEFT} s)" | tee -a "$LOG"
  timeout -k "$KILL_S" $(( LEFT + OUTER_EXTRA_S )) python3 -m tst_jax.tools.ladder \
      "${LADDER_ARGS[@]}" --deadline_s "$LEFT" "${SET[@]}" 2>&1 | tee -a "$LOG" | tail -n 2
  rc=${PIPESTATUS[0]}
  WORKDIR=$LADDER_WORKDIR pack_points
  stage ladder "$t0" "$(( LEFT + OUTER_EXTRA_S ))" "$rc"
fi

QUICK_S=$(( END - $(date +%s) ))
if [ "$QUICK_S" -gt 10 ]; then
  t0=$(date +%s)
  QUICK_S=$QUICK_S QUICK_TUNE_S=0 DONE_ROWS=$DONE_ROWS bash benchmarks/gpu.sh "$OUT_DIR" quick
  rc=$?
  stage quick "$t0" "$QUICK_S" "$rc"
fi

echo "budget: $(( $(date +%s) - START )) s of $TOTAL_S before the report"
"${PLAN[@]}" report                 # its last line: the next command
# A lent call brings back at most 8 files: the rest of OUT_DIR goes into one.
KEEP=(gpu.jsonl budget.md quick_log.txt points.tar.gz lab.md quick.md)
mapfile -t FILES < <(cd "$OUT_DIR" && ls -1)
if [ "${#FILES[@]}" -gt 8 ]; then
  MORE=()
  for f in "${FILES[@]}"; do
    [[ " ${KEEP[*]} " == *" $f "* ]] || MORE+=("$f")
  done
  tar -czf "$OUT_DIR/more.tar.gz" -C "$OUT_DIR" "${MORE[@]}" \
      && (cd "$OUT_DIR" && rm -rf "${MORE[@]}")
fi
