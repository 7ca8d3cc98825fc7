"""Files of public model repositories on the Hugging Face hub, fetched through ``huggingface_hub``
(its cache, progress bar, resume, offline mode ``HF_HUB_OFFLINE`` and ``HF_ENDPOINT``) and each
checked against a sha256: the one a catalogue entry pins, else the one recorded the first time the
file was downloaded (trust on first use). A branch such as ``main`` is likewise resolved to a commit
once and that commit is used from then on. The record is ``$HF_HOME/flashlm/pins.json`` (delete an
entry there to trust a new upload). A file whose sha256 differs is deleted from the cache."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from converter.files import sha256_file

from .errors import UserError
from .files import write_json

# what convert reads of a Hugging Face folder: the config, the weights and the tokenizer
FOLDER_PATTERNS = ("config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
                   "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@dataclass(frozen=True)
class HubFile:
    repo: str
    path: str
    revision: str = "main"
    sha256: str | None = None      # None: none that could be verified; trusted on first download

    @property
    def label(self) -> str:
        return f"{self.repo}/{self.path}"


def pins_path() -> Path:
    from huggingface_hub import constants
    return Path(constants.HF_HOME) / "flashlm" / "pins.json"


def _pins() -> dict:
    p = pins_path()
    if not p.is_file():
        return {"revisions": {}, "files": {}}
    try:
        doc = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{p}: cannot read the recorded sha256s ({e}); delete it to record them anew")
    return {"revisions": doc.get("revisions", {}), "files": doc.get("files", {})}


def _record(section: str, key: str, value: str) -> None:
    pins = _pins()
    pins[section][key] = value
    write_json(pins_path(), pins, sort_keys=True)


def _fetch_error(e: Exception, what: str, revision: str) -> UserError:
    """One line for a file the hub did not give: offline or unreachable without it in the cache, or
    no such repository, revision or file."""
    from huggingface_hub import constants, errors
    if isinstance(e, errors.LocalEntryNotFoundError):
        why = ("offline (HF_HUB_OFFLINE is set)" if constants.HF_HUB_OFFLINE
               else f"the hub at {constants.ENDPOINT} cannot be reached")
        return UserError(f"{what}@{revision} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and {why}")
    if isinstance(e, errors.RepositoryNotFoundError):
        return UserError(f"{what}: no such repository on {constants.ENDPOINT} (or it needs a token: 'hf auth login')")
    if isinstance(e, errors.RevisionNotFoundError):
        return UserError(f"{what}: the repository has no revision {revision}")
    if isinstance(e, errors.EntryNotFoundError):
        return UserError(f"{what}: no such file at revision {revision}")
    return UserError(f"{what}@{revision}: {e}")


def _revision(repo: str, revision: str) -> str:
    """The commit a branch was first resolved to here, else ``revision`` itself."""
    return _pins()["revisions"].get(f"{repo}@{revision}", revision)


def _commit_of(local: Path, path: str) -> str:
    """The commit of a file in the cache: its snapshot folder's name (snapshots/COMMIT/PATH)."""
    return local.parents[len(Path(path).parts) - 1].name


def _check(repo: str, path: str, local: Path, commit: str, want: str | None) -> None:
    """Compare a cached file with the sha256 pinned (``want``) or recorded; record it if neither."""
    key = f"{repo}@{commit}/{path}"
    recorded = _pins()["files"].get(key)
    got = sha256_file(local)
    if want:
        expected, source = want, "the catalogue's"
    else:
        expected, source = recorded, f"the one recorded at first download in {pins_path()}"
    if expected is None:
        _record("files", key, got)
        return
    if got != expected:
        blob = local.resolve()
        local.unlink(missing_ok=True)
        blob.unlink(missing_ok=True)
        raise UserError(f"{repo}/{path}@{commit[:12]}: sha256 {got} is not {source} ({expected}); "
                        f"the download was deleted from the Hugging Face cache")


def download(f: HubFile) -> Path:
    """The file in the Hugging Face cache, downloaded if it is not there, its sha256 checked."""
    from huggingface_hub import errors, hf_hub_download
    revision = _revision(f.repo, f.revision)
    try:
        local = Path(hf_hub_download(f.repo, f.path, revision=revision))
    except (errors.HfHubHTTPError, errors.LocalEntryNotFoundError, errors.EntryNotFoundError, ValueError) as e:
        raise _fetch_error(e, f.label, revision) from e
    commit = _commit_of(local, f.path)
    if commit != revision:
        _record("revisions", f"{f.repo}@{f.revision}", commit)
    _check(f.repo, f.path, local, commit, f.sha256)
    return local


def download_folder(repo: str, revision: str = "main") -> Path:
    """A Hugging Face model folder (config, weights, tokenizer) in the cache; each file's sha256 is
    recorded at first download and checked from then on."""
    from huggingface_hub import errors, snapshot_download
    try:
        folder = Path(snapshot_download(repo, revision=revision, allow_patterns=list(FOLDER_PATTERNS)))
    except (errors.HfHubHTTPError, errors.LocalEntryNotFoundError, ValueError) as e:
        raise _fetch_error(e, repo, revision) from e
    for local in sorted(p for p in folder.rglob("*") if p.is_file()):
        _check(repo, local.relative_to(folder).as_posix(), local, folder.name, None)
    if not (folder / "config.json").is_file():
        raise UserError(f"{repo}@{revision} has no config.json: not a Hugging Face model folder convert reads")
    return folder
