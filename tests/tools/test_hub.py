"""Export with --push_to_hub against a fake HfApi that records each call and answers as the Hub
does: the exact calls, one `error:` line for each failure with the local export kept, and bad
flags refused before anything is written. No network: the one real HfApi asks a closed port."""

import os
import socket

import huggingface_hub
import pytest
from huggingface_hub import hf_api, utils as hub_utils

from tests.fixtures import trained
from tst_jax import errors
from tst_jax.tools import export

REPO = "me/tiny"
COMMIT = "https://huggingface.co/me/tiny/commit/0123abcd"
FILES = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  return trained.workdir(tmp_path_factory)


def _refusal(status: int, why: str) -> Exception:
  """Returns the error huggingface_hub raises for the Hub's answer `status` with reason `why`."""
  request = hub_utils.get_session().build_request("POST", "https://huggingface.co/api/repos/create")
  response = huggingface_hub.errors.Response(status, request=request,
                                             headers={"X-Error-Message": why})
  with pytest.raises(hub_utils.HfHubHTTPError) as e:
    hub_utils.hf_raise_for_status(response)
  return e.value


class FakeHfApi:
  """Records each call and what the uploaded folder held; answers as the Hub, or raises
  `fail[method]`."""

  def __init__(self, token="hf_test", fail=None, public=False):
    self.token, self.fail, self.public = token, fail or {}, public
    self.calls, self.uploaded = [], None

  def _call(self, name, *args, **kwargs):
    self.calls.append((name, args, kwargs))
    if name in self.fail:
      raise self.fail[name]

  def create_repo(self, *args, **kwargs):
    self._call("create_repo", *args, **kwargs)
    return hf_api.RepoUrl(f"https://huggingface.co/{args[0]}")

  def repo_info(self, *args, **kwargs):
    self._call("repo_info", *args, **kwargs)
    return hf_api.ModelInfo(id=args[0], private=not self.public)

  def create_branch(self, *args, **kwargs):
    self._call("create_branch", *args, **kwargs)

  def upload_folder(self, **kwargs):
    self._call("upload_folder", **kwargs)
    self.uploaded = sorted(os.listdir(kwargs["folder_path"]))
    return hf_api.CommitInfo(commit_url=COMMIT, commit_message=kwargs["commit_message"],
                             commit_description="", oid="0123abcd")


@pytest.fixture
def hub(monkeypatch):
  """Installs a FakeHfApi made with the given arguments, and returns it."""
  def install(**kwargs):
    fake = FakeHfApi(**kwargs)
    monkeypatch.setattr(huggingface_hub, "HfApi", lambda: fake)
    return fake
  return install


def _export(workdir, out, *flags):
  export.main(["--workdir", workdir, "--out", str(out), "--push_to_hub", REPO, *flags])


def test_pushes_the_export_to_a_private_branch(workdir, tmp_path, hub, capsys):
  fake = hub()
  out = tmp_path / "hf"
  _export(workdir, out, "--private", "--revision", "tst-s4")
  message = "Upload a model exported by tst_jax"
  assert fake.calls == [
      ("create_repo", (REPO,), dict(repo_type="model", exist_ok=True, private=True)),
      ("repo_info", (REPO,), dict(repo_type="model")),
      ("create_branch", (REPO,), dict(branch="tst-s4", repo_type="model", exist_ok=True)),
      ("upload_folder", (), dict(repo_id=REPO, folder_path=str(out), revision="tst-s4",
                                 repo_type="model", commit_message=message))]
  assert fake.uploaded == FILES
  assert capsys.readouterr().out.splitlines() == [f"exported {workdir} to {out}",
                                                  f"pushed {out} to {COMMIT}"]


def test_pushes_to_main_with_the_owners_visibility(workdir, tmp_path, hub):
  """Without --private the Hub applies the owner's default visibility, and without --revision
  the upload goes to main."""
  fake = hub()
  _export(workdir, tmp_path / "hf")
  assert [(name, kwargs) for name, _, kwargs in fake.calls] == [
      ("create_repo", dict(repo_type="model", exist_ok=True)),
      ("upload_folder", dict(repo_id=REPO, folder_path=str(tmp_path / "hf"), revision=None,
                             repo_type="model",
                             commit_message="Upload a model exported by tst_jax"))]


def _closed_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


FAILURES = {
    "no token": (dict(token=None), "no Hugging Face token: set HF_TOKEN or run hf auth login"),
    "namespace refused": (dict(fail=dict(create_repo=_refusal(403, "You don't have the rights "
                                                                   "to create a model under "
                                                                   "the namespace \"me\""))),
                          "the Hub refused (HfHubHTTPError: "),
    "upload refused": (dict(fail=dict(upload_folder=_refusal(401, "Invalid credentials"))),
                       "the Hub refused (HfHubHTTPError: "),
    "public repository": (dict(public=True), "the repository is public and --private asks for "
                                             "a private one"),
    "network": (None, "the Hub cannot be reached (ConnectError: "),
}


@pytest.mark.parametrize("failure", sorted(FAILURES))
def test_a_hub_failure_is_one_error_line_and_the_export_stays(workdir, tmp_path, hub,
                                                              monkeypatch, capsys, failure):
  fake_args, said = FAILURES[failure]
  if fake_args is None:   # the real client, at a port nothing listens on
    real = hf_api.HfApi(endpoint=f"http://127.0.0.1:{_closed_port()}", token="hf_test")
    monkeypatch.setattr(huggingface_hub, "HfApi", lambda: real)
  else:
    hub(**fake_args)
  monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
  out = tmp_path / "hf"
  with pytest.raises(SystemExit) as e:
    errors.main(_export, workdir, out, "--private")
  line = capsys.readouterr().err.rstrip("\n")
  assert e.value.code == errors.EXIT_STATUS
  assert line.startswith(f"error: --push_to_hub {REPO}: {said}") and "\n" not in line, line
  assert line.endswith(f"the export in {out} stays: run the same command with --overwrite to "
                       "try again")
  assert sorted(os.listdir(out)) == FILES


@pytest.mark.parametrize("flags,said", [
    (["--push_to_hub", "tiny"], "error: --push_to_hub: 'tiny': name the repository's owner "
                                "too, as ORG/NAME"),
    (["--push_to_hub", "me/a/b"], "error: --push_to_hub: 'me/a/b' is not a repository of the "
                                  "Hub: Repo id must be in the form"),
    (["--push_to_hub", "me/bad name"], "error: --push_to_hub: 'me/bad name' is not a "
                                       "repository of the Hub: Repo id must use"),
    (["--push_to_hub", REPO, "--revision", " "], "error: --revision: must name a branch"),
    (["--private"], "error: --private: uploads only with --push_to_hub ORG/NAME"),
    (["--revision", "v1"], "error: --revision: uploads only with --push_to_hub ORG/NAME"),
    (["--push_to_hub", REPO, "--out", "gs://bucket/hf"], "error: --push_to_hub: uploads a "
                                                         "local --out, and gs://bucket/hf is "
                                                         "in a bucket"),
])
def test_bad_hub_flags_are_one_error_line_before_anything(workdir, tmp_path, hub, capsys,
                                                          flags, said):
  fake = hub()
  out = tmp_path / "hf"
  with pytest.raises(SystemExit) as e:
    errors.main(export.main, ["--workdir", workdir, "--out", str(out), *flags])
  line = capsys.readouterr().err
  assert e.value.code == errors.EXIT_STATUS
  assert line.startswith(said) and line.count("\n") == 1, line
  assert not out.exists() and fake.calls == []
