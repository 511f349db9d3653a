"""The glossary at the top of docs/architecture.md against the code's names: one word per thing.

Each word of the glossary names one thing, and every class of the package named with that word
(an engine step, a paragraph, a plan, a lane, a worker, a kind) is named in the word's row: a class that is
not there either means something else (rename it) or is missing from the glossary (add it). No two
classes of the package share a name. Every public name of the package (module-level functions, classes
and constants; the public methods and attributes of its classes, ``self.x`` included), split into its
words (snake_case, CamelCase), uses none of the glossary's retired words (``hold``, ``member``,
``placed``, ...). The same checks run on controls that must fail: a glossary with a row's class left
out, a toy module with a retired word in its names, and the real package against a retired list that
holds one of its words. Parsed with ``ast``: nothing of the package (nor vLLM) is imported.
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
    "Kind": ("kind",),
}
RETIRED_ROW = "retired words"
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


def retired(rows: dict[str, str]) -> set[str]:
    """The glossary's retired words: the backticked words of its "retired words" row."""
    return {w.lower() for w in re.findall(r"`([A-Za-z]+)`", rows[RETIRED_ROW])}


def words(name: str) -> list[str]:
    """A name's words, lower case: ``num_aside`` -> num, aside; ``V2ForcedTokens`` -> v2, forced, tokens."""
    out = []
    for part in name.strip("_").split("_"):
        out += re.findall(r"[A-Z]+\d*(?![a-z])|[A-Z]?[a-z]+\d*|\d+[a-z]*", part)
    return [w.lower() for w in out if w]


def _public(name: str) -> bool:
    return not name.startswith("_")


def _targets(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def public_names(source: str) -> set[str]:
    """A module's public names: module-level functions, classes and constants; each public class's public
    methods, class attributes and fields, and the ``self.x`` its methods assign."""
    names: set[str] = set()
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _public(node.name):
            names.add(node.name)
        names.update(n for n in _targets(node) if _public(n))
        if isinstance(node, ast.ClassDef) and _public(node.name):
            names.add(node.name)
            for item in node.body:
                names.update(n for n in _targets(item) if _public(n))
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    if _public(item.name):
                        names.add(item.name)
                    for sub in ast.walk(item):
                        for target in getattr(sub, "targets", [getattr(sub, "target", None)]):
                            if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                                    and target.value.id == "self" and _public(target.attr)):
                                names.add(target.attr)
    return names


def package_names() -> dict[str, list[str]]:
    """Public name -> the modules defining it, over the whole package."""
    found = defaultdict(list)
    for path in sorted((ROOT / "vllm_hogwild").rglob("*.py")):
        for name in public_names(path.read_text()):
            found[name].append(str(path.relative_to(ROOT)))
    return found


def retired_uses(banned: set[str], names: dict[str, list[str]]) -> list[str]:
    return [f"{name} ({', '.join(where)}) uses the retired word(s) {sorted(set(words(name)) & banned)}"
            for name, where in sorted(names.items()) if set(words(name)) & banned]


def test_the_glossary_retires_the_words_of_issue_50() -> None:
    issue_50 = {"hold", "held", "holds", "member", "members", "placed", "place", "places"}
    assert issue_50 <= retired(glossary(DOC.read_text()))


def test_no_public_name_of_the_package_uses_a_retired_word() -> None:
    assert not retired_uses(retired(glossary(DOC.read_text())), package_names())


def test_words_split_snake_and_camel_case() -> None:
    assert words("num_aside") == ["num", "aside"]
    assert words("FED_AHEAD_LOGPROBS") == ["fed", "ahead", "logprobs"]
    assert words("V2ForcedTokens") == ["v2", "forced", "tokens"]
    assert words("HogwildCPUWorker") == ["hogwild", "cpu", "worker"]
    assert words("who_sits_out") == ["who", "sits", "out"]


def test_a_retired_word_in_a_public_name_is_found() -> None:
    toy = (
        "HOLD_NEWER = 1\n"
        "def _held(): pass\n"  # private: not checked
        "def place_tokens(): pass\n"
        "class MemberList:\n"
        "    num_held: int\n"
        "    def holds(self): self.placed = 1; self._members = 2\n"
    )
    names = {n: ["toy.py"] for n in public_names(toy)}
    found = retired_uses(retired(glossary(DOC.read_text())), names)
    for name in ("HOLD_NEWER", "place_tokens", "MemberList", "num_held", "holds", "placed"):
        assert any(p.startswith(f"{name} ") for p in found), (name, found)
    assert not any(p.startswith(("_held ", "_members ")) for p in found)


def test_the_package_check_can_fail() -> None:
    assert any(p.startswith("Worker ") for p in retired_uses({"worker"}, package_names()))
