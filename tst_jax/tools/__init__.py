"""The user-facing commands around training, each run as `python -m tst_jax.tools.<name>`.

- `sweep`: grids and arms of runs
- `compare`: runs against their finished baselines
- `ladder`: the speed-up against run length
- `eval`: lm-eval tasks
- `sample`: text from a checkpoint
- `export`: a Hugging Face folder
"""
