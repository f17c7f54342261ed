"""Uploads an exported model folder to a model repository on the Hugging Face Hub.

`python -m tst_jax.tools.export ... --push_to_hub ORG/NAME [--private] [--revision BRANCH]`
checks the flags first, writes the export, then uploads it with huggingface_hub's
`upload_folder`. A Hub that cannot be reached or refuses is one `error:` line, and the local
export stays.
"""

from __future__ import annotations

import huggingface_hub
from huggingface_hub import utils as hub_utils

from tst_jax import fileio
from tst_jax.errors import ConfigError, UserError

FLAG = "--push_to_hub"
# The HTTP client's own error class, which huggingface_hub's errors derive from. Its network
# errors are no OSError with httpx, as they are with requests (huggingface_hub < 1).
_TRANSPORT_ERROR = next(b for b in hub_utils.HfHubHTTPError.__bases__ if b is not OSError)


def check(repo_id: str | None, out: str, *, private: bool = False,
          revision: str | None = None) -> None:
  """Raises one ConfigError, naming its flag, where the Hub flags cannot work together."""
  if repo_id is None:
    for flag, given in (("--private", private), ("--revision", revision is not None)):
      if given:
        raise ConfigError(flag, f"uploads only with {FLAG} ORG/NAME")
    return
  try:
    hub_utils.validate_repo_id(repo_id)
  except hub_utils.HFValidationError as e:
    raise ConfigError(FLAG, f"{repo_id!r} is not a repository of the Hub: {e}") from None
  if "/" not in repo_id:
    raise ConfigError(FLAG, f"{repo_id!r}: name the repository's owner too, as ORG/NAME")
  if revision is not None and not revision.strip():
    raise ConfigError("--revision", "must name a branch, or leave it out for main")
  if fileio.local_path(out) is None:
    raise ConfigError(FLAG, f"uploads a local --out, and {out} is in a bucket: export to a "
                            "local folder")


def push(folder: str, repo_id: str, *, private: bool = False, revision: str | None = None,
         message: str = "Upload a model exported by tst_jax") -> str:
  """Uploads the local `folder` to model repository `repo_id` and returns the commit's URL.

  Creates the repository where it is missing, private with `private`, and the branch
  `revision` likewise. Refuses to upload to a public repository with `private`. Any failure is
  one UserError that says the folder stays.
  """
  api = huggingface_hub.HfApi()
  where = f"{FLAG} {repo_id}"
  stays = f"the export in {folder} stays: run the same command with --overwrite to try again"
  if not (api.token or huggingface_hub.get_token()):
    raise UserError(f"{where}: no Hugging Face token: set HF_TOKEN or run hf auth login; {stays}")
  try:
    visibility = dict(private=True) if private else {}   # else the owner's default on the Hub
    api.create_repo(repo_id, repo_type="model", exist_ok=True, **visibility)
    if private and api.repo_info(repo_id, repo_type="model").private is False:
      raise UserError(f"{where}: the repository is public and --private asks for a private one: "
                      f"make it private on the Hub or push without --private; {stays}")
    if revision:
      api.create_branch(repo_id, branch=revision, repo_type="model", exist_ok=True)
    commit = api.upload_folder(repo_id=repo_id, folder_path=folder, revision=revision,
                               repo_type="model", commit_message=message)
  except (OSError, _TRANSPORT_ERROR) as e:
    answer = ("the Hub refused" if isinstance(e, hub_utils.HfHubHTTPError)
              else "the Hub cannot be reached")
    raise UserError(f"{where}: {answer} ({type(e).__name__}: {e}); {stays}") from e
  return commit.commit_url
