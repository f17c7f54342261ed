"""What to expect of a planned run, printed with its plan: how many times it reads its data,
and where TST pays by the measured rule and the ladder's trend."""

from __future__ import annotations

import functools
import json
import os

from tst_jax.analysis.frontier import Trend
from tst_jax.data.mixture import name_of
from tst_jax.run.console import human
from tst_jax.config.plan import Phase, Plan, PlanRecord

# The measured rule of where TST starts to pay, kept where the warning decides: it takes both
# a large enough model and a long enough next-token phase. docs/results.md has the runs. A
# measured trend of a model like the run's replaces it.
PAYS_FROM_NTP_TOKENS_PER_PARAM = 0.7
BEHIND_UP_TO_PARAMS = 1.84e6      # active parameters: every TST run this small ended behind,
BEHIND_MEASURED_TO = 9.4          # in runs of up to this many tokens per parameter
BEHIND_WARNING = "TST is expected to end behind its baseline: docs/results.md"
# The fits of the equal-loss speed-up against tokens per parameter that
# `python -m tst_jax.tools.ladder` measured, one per recipe and TST arm.
TREND_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "speedup_trends.json")


def trend_for(plan: Plan, trends) -> Trend | None:
  """Returns the first of `trends` measured on a model like the plan's at its bag size."""
  tst = next((p for p in plan.phases if p.is_tst), None)
  if tst is None:
    return None
  return next((t for t in trends if t.covers(plan.params_active, plan.params_total,
                                             tst.bag_size)), None)


def behind_baseline_warning(plan: Plan, trend: Trend | None = None) -> str | None:
  """Warns when a TST run is expected to end behind its baseline, or returns None.

  With the measured `trend` of a model like the run's it warns when the trend predicts a
  speed-up below 1 at the run's length; outside the trend's measured range it claims nothing.
  Without one it warns when the model is as small as every model where TST ended behind, at
  a length measured there, or else when its next-token phase is too short.
  """
  ntp = plan.ntp_tokens_per_param
  if ntp is None:
    return None
  x = plan.tokens_per_param
  predicted = trend.predict(x) if trend is not None else None
  if predicted is not None:
    return None if predicted >= 1 else (f"warning: {BEHIND_WARNING} (the measured trend "
                                        f"predicts {predicted:.2f}x at this length)")
  if trend is not None:
    return None                       # pays_line says the run is outside the measured range
  if plan.params_active <= BEHIND_UP_TO_PARAMS and x <= BEHIND_MEASURED_TO:
    return (f"warning: {BEHIND_WARNING} (at {human(plan.params_active)} parameters: every run "
            f"of {human(BEHIND_UP_TO_PARAMS)} or fewer ended behind, measured up to "
            f"{BEHIND_MEASURED_TO:g} tokens per parameter)")
  if ntp >= PAYS_FROM_NTP_TOKENS_PER_PARAM:
    return None
  return (f"warning: {BEHIND_WARNING} (its next-token phase sees {ntp:.2g} tokens per "
          f"parameter; TST has paid from about {PAYS_FROM_NTP_TOKENS_PER_PARAM:g})")


@functools.cache
def measured_trends() -> tuple[Trend, ...]:
  """Loads the shipped fits of the ladders' points, none when there are none."""
  return tuple(Trend.load_all(TREND_FILE)) if os.path.isfile(TREND_FILE) else ()


def pays_line(plan: Plan, trend: Trend | None) -> str | None:
  """Says a TST run's tokens per parameter, the speed-up the trend of a model like its own
  predicts there, and the length from which that trend expects TST to pay, or why neither."""
  if plan.ntp_tokens_per_param is None:
    return None
  x = plan.tokens_per_param
  line = (f"where TST pays: this run reads {x:.3g} tokens per parameter, where the equal-loss "
          "speed-up is ")
  if trend is None:
    return line + ("not predicted: no measured trend of a model like this one at its bag size "
                   "(python -m tst_jax.tools.ladder; docs/results.md)")
  predicted = trend.predict(x)
  line += (f"not predicted: outside the measured range ({trend.low:.3g} to {trend.high:.3g} "
           "tokens per parameter)" if predicted is None else
           f"predicted {predicted:.2f}x by the trend of {len(trend.points)} measured runs "
           f"({trend.low:.3g} to {trend.high:.3g} tokens per parameter)")
  pays = trend.pays_from()
  if pays is None:
    return line + "; the trend does not grow with length (docs/results.md)"
  if not trend.inside(pays):
    return line + "; where it reaches 1x lies outside its measured range (docs/results.md)"
  steps = pays / x * plan.total_steps      # tokens per parameter grow with the steps
  return line + (f"; it reaches 1x at {pays:.3g} tokens per parameter, {steps:,.0f} steps of "
                 f"this run's batch (docs/results.md)")


def data_lines(plan: Plan, tokens, max_passes: float = 0.0) -> list[str]:
  """Lists the passes over the training data, with warnings when the run repeats its tokens.

  `tokens` is a run_data.TrainTokens, or None when unknown. One warning comes when the run
  reads any of its tokens more than once, another when it reads them more than `max_passes`
  times, train.max_passes, past which the run refuses to start.
  """
  if tokens is None:
    return ["data: training tokens counted once data.source is tokenized (the run's plan "
            "then says how many times it reads them)"]
  if tokens.mixture is not None:
    return mixture_lines(plan, tokens, max_passes)
  each = plan.passes(tokens.count)
  total, at_least = sum(each), "" if tokens.exact else ">= "
  per_phase = ", ".join(f"{_label(p)} {at_least}{x:.3g}" for p, x in zip(plan.phases, each))
  lines = [f"data: {'' if tokens.exact else 'at most '}{human(tokens.count)} training tokens "
           f"({tokens.where}); passes over them: {per_phase}, the run {at_least}{total:.3g}"]
  return lines + _repeat_warnings("its training tokens", total, at_least, max_passes)


def mixture_lines(plan: Plan, tokens, max_passes: float = 0.0) -> list[str]:
  """Per source of a mixture: its weight in each phase, or in each stage of
  data.mixture_stages, its training tokens, the tokens the run reads of it and its passes,
  and a warning for each source the run repeats. Then per stage: the weight, tokens and
  passes of each source."""
  mix, stages = tokens.mixture, tokens.stage_passes(plan)
  counts = dict(tokens.entries)
  lines = [f"data: a mixture of {len(tokens.entries)} sources, each read from its own store"
           + (f", in {len(stages)} stages of data.mixture_stages" if stages else "")]
  for where, count, each in tokens.passes(plan):
    at_least = "" if counts[where].exact else ">= "
    if stages:
      share = "weight by stage " + ", ".join(f"{_weight(read.stage.entries, where):.3g}"
                                             for read, _ in stages)
    else:
      share = "weight " + ", ".join(
          f"{_label(p)} {_weight(mix.entries(p), where):.3g}" for p in plan.phases)
    per_phase = ", ".join(f"{_label(p)} {at_least}{x:.3g}" for p, x in zip(plan.phases, each))
    lines.append(f"data: {where} ({share}): {human(count)} training tokens, the run "
                 f"reads {human(sum(each) * count)}; passes over them: {per_phase}, the run "
                 f"{at_least}{sum(each):.3g}")
    lines += _repeat_warnings(f"the training tokens of {where}", sum(each), at_least,
                              max_passes)
  sources = [e.source for e in mix.main]
  for k, (read, passes) in enumerate(stages):
    phases = " and ".join(_label(plan.phases[i]) for i in read.phases)
    each = "; ".join(
        f"{name_of(s, sources)} {_weight(read.stage.entries, s):.3g}: {human(n)} tokens, "
        f"{'' if counts[s].exact else '>= '}{passes[s]:.3g} passes"
        for s, n in read.tokens.items())
    lines.append(f"data: stage {k + 1} from step {read.stage.first_step} ({read.steps} steps "
                 f"of {phases}): {each}")
  return lines


def _weight(entries, source: str) -> float:
  """Returns the weight of `source` among a mixture's `entries`, 0 where it is not one."""
  return next((e.weight for e in entries if e.source == source), 0.0)


def _repeat_warnings(what: str, total: float, at_least: str, max_passes: float) -> list[str]:
  lines = []
  if total > 1:
    lines.append(f"warning: the data repeats: the run reads {what} "
                 f"{'at least ' if at_least else ''}{total:.3g} times; a repeated token teaches "
                 "less than a new one (docs/data.md, 'Passes over the data')")
  if max_passes and total > max_passes:
    lines.append(f"warning: more than train.max_passes={max_passes:g}: the run will refuse to "
                 "start")
  return lines


def _label(phase: Phase) -> str:
  return phase.name + (f" S={phase.bag_size}" if phase.is_tst else "")


def mtp_lines(plan: Plan) -> list[str]:
  """Says what multi-token prediction adds to the plan: the heads' parameters, which export
  drops, their share of each MTP phase's FLOPs per step, and after a TST phase 1 that phase's
  share of the steps beside its share of the FLOPs. No line without MTP."""
  lines = []
  for p in plan.phases:
    if p.mtp_k > 1:
      extra = p.mtp_flops_per_step / (p.flops_per_step - p.mtp_flops_per_step)
      lines.append(f"mtp: {plan.mtp_kind}, k={p.mtp_k} (tokens t+1..t+{p.mtp_k}), "
                   f"λ={p.mtp_weight:g} in {p.name}: heads of {human(plan.params_mtp)} "
                   f"parameters (training only: export drops them) and "
                   f"{human(p.mtp_flops_per_step / p.equivalent_tokens_per_step)} FLOPs per "
                   f"token, +{extra:.0%} FLOPs per step")
  phase_1 = [p for p in plan.phases if p.is_tst]
  if lines and phase_1:
    steps = sum(p.steps for p in phase_1)
    flops = sum(p.steps * p.flops_per_step for p in phase_1)
    lines.append(f"mtp: phase 1 is {steps} of {plan.total_steps} steps "
                 f"({steps / plan.total_steps:.0%}) and {flops / plan.flops_total:.0%} of the "
                 f"FLOPs: r={plan.ratio:g} is its share of train.steps, and each MTP step "
                 "costs more FLOPs than a step without MTP")
  return lines


def format_plan(plan: Plan, resolved=None, with_json: bool = True, tokens=None,
                max_passes: float = 0.0) -> str:
  """Formats the plan as a readable table, then its JSON, the record of plan.json.

  Between them come the platform's resolved defaults, the passes over the data from `tokens`,
  a run_data.TrainTokens, and what to expect of TST at this length.
  """
  lines = [f"parameters: {human(plan.params_total)} total, {human(plan.params_active)} active",
           f"{'phase':<6}{'steps':>9}{'S':>4}{'mode':>13}{'latent L':>10}{'data L':>8}"
           f"{'batch':>7}{'data tok/step':>15}{'data tokens':>13}{'equiv tokens':>14}"
           f"{'FLOPs/step':>12}"]
  for p in plan.phases:
    lines.append(f"{p.name:<6}{p.steps:>9}{p.bag_size:>4}{p.mode:>13}{p.latent_seq_len:>10}"
                 f"{p.data_seq_len:>8}{p.batch_size:>7}{human(p.data_tokens_per_step):>15}"
                 f"{human(p.data_tokens):>13}{human(p.equivalent_tokens):>14}"
                 f"{human(p.flops_per_step):>12}")
  lines.append(f"total: {plan.total_steps} steps, {human(plan.data_tokens_total)} data "
               f"tokens, {human(plan.equivalent_tokens_total)} equivalent tokens, "
               f"{human(plan.flops_total)} FLOPs")
  lines += mtp_lines(plan)
  if resolved is not None:
    lines.append(resolved.line())
  lines += data_lines(plan, tokens, max_passes)
  trend = trend_for(plan, measured_trends())
  lines += filter(None, [pays_line(plan, trend), behind_baseline_warning(plan, trend)])
  if with_json:
    lines.append(json.dumps(PlanRecord(plan, tokens, resolved).to_json()))
  return "\n".join(lines)
