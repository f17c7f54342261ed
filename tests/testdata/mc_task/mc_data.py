"""Loads mc.jsonl (next to this file) as the train and test splits of the tst_mc task."""

import json
import os

import datasets


def load(**kwargs):
  del kwargs   # lm-eval passes the task's metadata
  with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "mc.jsonl")) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  return datasets.DatasetDict({
      split: datasets.Dataset.from_list([{k: v for k, v in r.items() if k != "split"}
                                         for r in rows if r["split"] == split])
      for split in ("train", "test")})
