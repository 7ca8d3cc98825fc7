"""What a run and a plan show agree with what they measured and planned: the live table's input and
output tokens, the run figure's µs axis past a host-clock spike, the memory map's bars and the plan
table's bytes."""
import io

import pytest
from rich.console import Console

from converter.costmodel import ModelSpec
from converter.ir import ModelConfig
from converter.planner import plan
from host.link.messages import PHASES, Generate, Hello, Token
from host.output import figure, live
from host.output.plan_figures import memory_map_segments
from host.session.result import RunResult

HELLO = Hello(3, True, b"\0" * 16, 1, 40, 40, 64, 0, "0.1.0", "native")


def _token(step: int, out_id, us: int = 100, **kw) -> Token:
    return Token(step, step, 10 + step, out_id, tuple([us] + [0] * (len(PHASES) - 1)), (0, 0, 0), 40 if out_id else 0,
                 0, b"" if out_id is None else b"<%d>" % out_id, **kw)


def test_live_view_shows_each_steps_input_and_the_token_it_produced():
    buf = io.StringIO()
    toks = [_token(0, None), _token(1, None), _token(2, 7), _token(3, 8)]
    with live.LiveView(Console(file=buf, width=250), HELLO, piece_of=lambda i: b"[%d]" % i) as v:
        for t in toks:
            v.on_token(t)
    lines = buf.getvalue().splitlines()
    head = next(ln for ln in lines if ln.lstrip().startswith("step"))
    assert head.split()[:5] == ["step", "pos", "pass", "in", "out"]
    rows = {int(ln.split()[0]): ln.split() for ln in lines if ln.strip()[:1].isdigit()}
    assert [rows[s][3:5] for s in range(4)] == [["'[10]'", "–"], ["'[11]'", "–"], ["'[12]'", "'<7>'"],
                                                ["'[13]'", "'<8>'"]]


def test_run_figure_keeps_its_steps_readable_past_a_host_clock_spike():
    toks = [_token(s, 1, us=120 + s % 3) for s in range(30)]
    toks[12] = _token(12, 1, us=90_000)        # the host switched the native board's process out
    res = RunResult(HELLO, Generate([1], 30), tokens=toks)
    ax = figure.run_figure(res).axes[0]
    assert ax.get_ylim()[1] < 1000                 # the other 29 steps are not flattened
    assert "90,000 ↑" in [t.get_text() for t in ax.texts]
    assert "1 step past" in ax.get_title()
    calm = RunResult(HELLO, Generate([1], 30), tokens=[_token(s, 1, us=120 + s % 3) for s in range(30)])
    ax = figure.run_figure(calm).axes[0]
    assert ax.get_ylim()[1] == pytest.approx(122 * 1.08) and not ax.texts


@pytest.mark.parametrize("batch", [1, 4])
def test_memory_map_draws_what_the_plan_table_counts(batch):
    """The default model on the Pico: its FFN staged in SRAM beside the state, sized for the batch."""
    spec = ModelSpec.from_config(ModelConfig(dim=128, n_layers=4, n_heads=4, n_kv_heads=1, vocab_size=1024,
                                             hidden_dim=352, max_seq_len=128, tied=True), "q8", 32)
    pl = plan(spec, "pico", kv="int8", batch=batch)
    for tier in ("sram",):
        segs = memory_map_segments(pl, tier)
        assert sum(n for _, _, n, _ in segs) == pl.need[tier]
        assert {name for name, *_ in segs} >= {"kv", "logits", "scratch"}
    assert sum(n for _, _, n, _ in memory_map_segments(pl, "flash")) == sum(t.length for t in spec.tensors)
