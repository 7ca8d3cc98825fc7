"""Microcontroller-sized models people know, by name (``flashlm pull NAME``; ``convert``, ``plan``,
``compare`` and ``demo --model`` take the name where they take a path). Each file has a pinned
revision and, where one could be checked, a sha256; how each pin was obtained is said beside it.
A file with no sha256 here is trusted on its first download and its sha256 recorded (host/hub.py).

The karpathy/tinyllamas commit is the head of its ``main`` as the hub's file listing shows it (the
commit that rewrote the stories260K tokenizers into llama2.c's current tokenizer.bin format)."""
from __future__ import annotations

from dataclasses import dataclass

from .hub import HubFile

TINYLLAMAS = "karpathy/tinyllamas"
TINYLLAMAS_REV = "0bd21da7698eaf29a0d7de3992de8a46ef624add"
STORIES15M_HF = "nm-testing/llama2.c-stories15M"


@dataclass(frozen=True)
class Entry:
    name: str
    about: str
    files: tuple[HubFile, ...]
    kind: str               # "llama2c": files are (checkpoint, tokenizer); "hf": a Hugging Face folder
    pins: str               # how the revision and the sha256s were obtained

    @property
    def checkpoint(self) -> HubFile:
        return self.files[0]

    @property
    def tokenizer(self) -> HubFile | None:
        return self.files[1] if self.kind == "llama2c" else None


def _tiny(path: str, sha256: str | None = None) -> HubFile:
    return HubFile(TINYLLAMAS, path, TINYLLAMAS_REV, sha256)


def _stories15m_hf(path: str) -> HubFile:
    return HubFile(STORIES15M_HF, path)


CATALOGUE = {e.name: e for e in (
    Entry("stories260K", "llama2.c TinyStories, 260K parameters (dim 64, 5 layers, vocab 512, context 512)",
          (_tiny("stories260K/stories260K.bin", "b0a507e7ad0f626624f17112325e66691f9076d622e1d3274d103d00299f2696"),
           _tiny("stories260K/tok512.bin", "037cb335abb25d1fa9e8ecae30ed2a3a8ace9302862ebcdc05d51a6bbb10c312")),
          "llama2c", "sha256 verified: computed from copies byte-identical to the ones the llama2.c ESP32 ports ship"),
    Entry("stories15M", "llama2.c TinyStories, 15M parameters (dim 288, 6 layers, vocab 32000, context 256)",
          (_tiny("stories15M.bin", "cd590644d963867a2b6e5a1107f51fad663c41d79c149fbecbbb1f95fa81f49a"),
           _stories15m_hf("tokenizer.json")),
          "llama2c", "checkpoint sha256: the hub's published Git LFS pointer (commit 32cc248), not downloaded here; "
                     "tokenizer (Llama 2's, which tinyllamas does not carry): trusted on first download"),
    Entry("stories42M", "llama2.c TinyStories, 42M parameters (dim 512, 8 layers, vocab 32000, context 1024)",
          (_tiny("stories42M.bin", "9f65a1000e17d0bc167dd6332e0ce5119a0222a3d920cead5bce413bfab2ee7b"),
           _stories15m_hf("tokenizer.json")),
          "llama2c", "checkpoint sha256: the hub's published Git LFS pointer (commit 58e1696), not downloaded here; "
                     "tokenizer (Llama 2's): trusted on first download"),
    Entry("stories15M-hf", f"stories15M as a Hugging Face Llama folder ({STORIES15M_HF}: safetensors, tokenizer.json)",
          tuple(_stories15m_hf(p) for p in ("config.json", "generation_config.json", "model.safetensors",
                                            "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")),
          "hf", "revision main and every sha256 trusted on first download (none could be checked here)"),
)}
