"""The documentation stays usable: the README is a short first-hour guide, every relative link in it
and in docs/ reaches an existing file (and heading), and docs/bench.md is exactly what
bench/docs_page.py writes from bench/results.json, so no benchmark figure is copied by hand."""
import json
import re
from pathlib import Path

import pytest

from bench import docs_page

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "boards" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def without_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def prose(text: str) -> str:
    """``text`` without code blocks and inline code, where brackets are not links."""
    return re.sub(r"`[^`\n]*`", "", without_code_blocks(text))


def headings(path: Path) -> set[str]:
    """The anchors of ``path``'s headings (inline code in a heading keeps its text in the anchor)."""
    text = without_code_blocks(path.read_text())
    return {docs_page.anchor(m.group(1).strip()) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


def test_readme_is_a_first_hour_guide():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_reach_files_and_headings(page):
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z]+:", target):           # http:, https:, mailto: are not checked here
            continue
        path, _, frag = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif frag and dest.suffix == ".md" and frag not in headings(dest):
            broken.append(f"{target}: no heading #{frag} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_bench_page_is_what_the_generator_writes():
    results = json.loads(docs_page.RESULTS.read_text())
    assert docs_page.PAGE.read_text() == docs_page.render(results), \
        "docs/bench.md is stale: run python -m bench.docs_page"
