"""The glossary at the top of docs/architecture.md against the code's names: one word per thing.

Each word of the glossary names one thing, and every class of the package named with that word
(an engine step, a paragraph, a plan, a lane, a worker) is named in the word's row: a class that is
not there either means something else (rename it) or is missing from the glossary (add it). No two
classes of the package share a name. The same checks run on a control glossary with a row's class
left out, which must fail.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
# word in class names -> the glossary rows (their terms) that must name every such class
WORDS = {
    "Step": ("engine step",),
    "Paragraph": ("paragraph",),
    "Plan": ("plan",),
    "Lane": ("lane", "paragraph"),
    "Worker": ("worker", "worker process, model runner"),
}
VLLM_NAMES = {"CPUWorker", "Worker", "GPUModelRunner"}  # vLLM's own classes the rows name beside the plugin's


def glossary(text: str) -> dict[str, str]:
    section = text.split("## Glossary", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0] not in ("term", "---"):
            rows[cells[0]] = cells[1]
    return rows


def classes() -> dict[str, list[str]]:
    """Class name (leading underscores dropped) -> the modules defining it, over the whole package."""
    found = defaultdict(list)
    for path in (ROOT / "vllm_hogwild").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                found[node.name.lstrip("_")].append(str(path.relative_to(ROOT)))
    return found


def problems(rows: dict[str, str], code: dict[str, list[str]]) -> list[str]:
    out = []
    for word, terms in WORDS.items():
        named = {n for term in terms for n in re.findall(r"`([A-Za-z_][\w.]*)`", rows[term])}
        named = {n.split(".")[0] for n in named}
        for cls in sorted(c for c in code if word in c):
            if cls not in named:
                out.append(f"class {cls} ({', '.join(code[cls])}) is named for '{word}' but the glossary's "
                           f"{' / '.join(terms)} row does not name it")
        for name in sorted(n for n in named if word in n and n[0].isupper()):
            if name not in code and name not in VLLM_NAMES:
                out.append(f"the glossary's {' / '.join(terms)} row names {name}, which no class is")
    return out


def test_every_class_named_for_a_glossary_word_is_in_its_row() -> None:
    assert not problems(glossary(DOC.read_text()), classes())


def test_no_two_classes_share_a_name() -> None:
    assert not {name: where for name, where in classes().items() if len(where) > 1}


@pytest.mark.parametrize("word", sorted(WORDS))
def test_a_class_left_out_of_its_row_is_found(word: str) -> None:
    rows, code = glossary(DOC.read_text()), classes()
    cls, term = next((c, t) for c in sorted(code) for t in WORDS[word] if word in c
                     and [f"`{c}`" in rows[r] for r in WORDS[word]].count(True) == 1 and f"`{c}`" in rows[t])
    rows[term] = rows[term].replace(f"`{cls}`", "it")
    assert any(f"class {cls} " in p for p in problems(rows, code))
