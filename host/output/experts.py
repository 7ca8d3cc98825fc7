"""A mixture of experts in a run's report: which experts each step read (its token's choice in every
layer, from its TOKEN frame), how often each expert was read per layer over the run, and how many
each forward pass read (a pass reads a chosen expert's rows once for all its tokens routed to it)."""
from __future__ import annotations


def step_label(t) -> str:
    """A step's experts in a few characters: per layer its token's choice, largest weight first,
    layers apart by spaces ("1,3 2,0 ..."); "" for a dense model."""
    return " ".join(",".join(map(str, c)) for c in t.experts)


def mask_list(mask: int) -> list[int]:
    """The experts of a pass's bitmask, ascending."""
    return [e for e in range(mask.bit_length()) if mask >> e & 1]


def step_dict(t) -> dict:
    """A step's expert fields for the JSON (none for a dense model)."""
    if not t.n_experts:
        return {}
    return {"experts": [list(c) for c in t.experts], "pass_experts": [mask_list(m) for m in t.pass_experts]}


def expert_summary(tokens) -> dict | None:
    """Per layer the share of steps whose token read each expert (each row sums to top_k), the steps
    counted, and per forward pass (each counted once) the experts it read per layer, on average
    against its tokens; None for a dense model."""
    toks = [t for t in tokens if t.n_experts]
    if not toks:
        return None
    E, L, k = toks[0].n_experts, len(toks[0].experts), len(toks[0].experts[0])
    counts = [[0] * E for _ in range(L)]
    for t in toks:
        for layer, chosen in enumerate(t.experts):
            for e in chosen:
                counts[layer][e] += 1
    passes = {t.chunk: t for t in toks}.values()      # one step of each pass
    read = [sum(bin(m).count("1") for m in t.pass_experts) / L for t in passes]
    tokens_per_pass = [t.chunk_len for t in passes]
    return {"n_experts": E, "top_k": k, "layers": L, "steps": len(toks),
            "use": [[n / len(toks) for n in row] for row in counts],
            "passes": len(read),
            "experts_per_layer_per_pass": sum(read) / len(read),
            "tokens_per_pass": sum(tokens_per_pass) / len(tokens_per_pass)}


def summary_lines(s: dict | None) -> list[str]:
    """The summary's lines on the experts (none for a dense model)."""
    if s is None:
        return []
    use = " | ".join(f"layer {layer}: " + ", ".join(f"e{e} {100 * v:.0f} %" for e, v in enumerate(row))
                     for layer, row in enumerate(s["use"]))
    return [f"experts read per step ({s['top_k']} of {s['n_experts']} a layer, {s['steps']} steps): {use}",
            f"experts read per forward pass: {s['experts_per_layer_per_pass']:.2f} of {s['n_experts']} a layer on "
            f"average, for {s['tokens_per_pass']:.2f} tokens a pass ({s['passes']} passes; each chosen expert's rows "
            f"read once a pass)"]
