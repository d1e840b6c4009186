"""The docs resolve: every ``docs/...md`` the code, the README and the docs name exists; every
field-case code used in ``src/`` is indexed in ``docs/field-cases.md``; no module docstring is an
essay (over 30 lines: the design goes to ``docs/design/``). The README is a front page (its two
commands first, at most 250 lines, no paragraph over 150 words, a table of contents into the docs
site), every docs page is in the site's navigation, and the examples use the public API only.
``mkdocs build --strict`` (in ``.ci/lint``) checks the links and anchors themselves."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import yaml

import squad

SRC = Path(squad.__file__).parent
ROOT = SRC.parent.parent

DOC_PATH = re.compile(r"(?<![\w/.:-])docs/[\w./-]+\.md")
"""A repo-relative docs path. Another project's file is written ``owner/repo:docs/x.md`` (or
inside a URL), which this does not match."""

CODE = re.compile(r"(?<![\w|`])F(\d{2})(?:-F(\d{2}))?(?![\w|`])")
"""A field-case code (``F04``) or range (``F05-F07``). Not a GGUF type written ``F16``/``|F32``
in code (a backtick or ``|`` next to it), nor ruff's ``F401``."""

MAX_MODULE_DOCSTRING = 30


def texts() -> dict[str, str]:
    """Everything that may cite a doc: the package, the top-level docs, docs/."""
    found = {str(p.relative_to(ROOT)): p.read_text() for p in SRC.rglob("*.py")}
    for name in ("README.md", "ARCHITECTURE.md", "CONTRIBUTING.md"):
        if (ROOT / name).exists():
            found[name] = (ROOT / name).read_text()
    found.update({str(p.relative_to(ROOT)): p.read_text() for p in (ROOT / "docs").rglob("*.md")})
    return found


def test_every_docs_path_mentioned_exists():
    missing = sorted({f"{where}: {path.rstrip('.')}" for where, text in texts().items()
                      for path in DOC_PATH.findall(text) if not (ROOT / path.rstrip(".")).is_file()})
    assert not missing, "\n".join(missing)


def test_the_doc_path_pattern_skips_other_projects_files():
    assert DOC_PATH.findall("see `docs/recipes.md` and `vllm-project/vllm:docs/design/metrics.md`") == [
        "docs/recipes.md"]


def codes_in(text: str) -> set[str]:
    found = set()
    for first, last in CODE.findall(text):
        found.update(f"F{n:02d}" for n in range(int(first), int(last or first) + 1))
    return found


def test_every_field_case_code_in_src_is_indexed():
    indexed = set(re.findall(r"^\| (F\d{2}) \|", (ROOT / "docs" / "field-cases.md").read_text(), flags=re.M))
    used = {code: path.relative_to(SRC) for path in SRC.rglob("*.py") for code in codes_in(path.read_text())}
    assert used, "no field-case code found: is the pattern right?"
    assert not set(used) - indexed, {code: str(used[code]) for code in set(used) - indexed}


def test_the_code_pattern():
    assert codes_in("field cases F05-F07, F17; ruff F401; ``F16``; BF16|F16|F32") == {"F05", "F06", "F07", "F17"}


def test_no_module_docstring_is_an_essay():
    long = {}
    for path in SRC.rglob("*.py"):
        doc = ast.get_docstring(ast.parse(path.read_text()))
        if doc and len(doc.splitlines()) > MAX_MODULE_DOCSTRING:
            long[str(path.relative_to(SRC))] = len(doc.splitlines())
    assert not long, f"module docstrings over {MAX_MODULE_DOCSTRING} lines (move the design to docs/design/): {long}"


def test_every_repo_file_the_code_and_docs_name_exists():
    """``tests/...py``, ``src/squad/...py``, ``bench/...py``, ``examples/...py`` and ``.ci/...`` paths
    in the package's source and in the docs (recipe paths in example output are made up)."""
    pattern = re.compile(r"(?<![\w/.:-])((?:tests|src/squad|bench|examples)/[\w./-]+\.py|\.ci/[\w.-]+)")
    missing = sorted({f"{where}: {path}" for where, text in texts().items()
                      for path in pattern.findall(text) if not (ROOT / path).exists()})
    assert not missing, "\n".join(missing)


def test_the_moved_paths_page_lists_every_moved_import_path():
    from squad._moved import MOVED

    page = (ROOT / "docs" / "moved-paths.md").read_text()
    missing = [f"{old} -> {new}" for old, new in MOVED.items() if f"| `{old}` | `{new}` |" not in page]
    assert not missing, "docs/moved-paths.md's 'Moved import paths' table lacks:\n" + "\n".join(missing)


# --- the README is a front page --------------------------------------------------------------

README_MAX_LINES = 250
PARAGRAPH_MAX_WORDS = 150
MAIN_JOB = "./setup.sh && .venv/bin/squad run recipes/review.yaml"
TEST_COMMAND = "./setup.sh --tests && .venv/bin/pytest"


def paragraphs(markdown: str) -> list[str]:
    """The prose paragraphs of a markdown text: blocks between blank lines, without fenced code,
    tables and headings."""
    prose, in_code = [], False
    block: list[str] = []
    for line in [*markdown.splitlines(), ""]:
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code or line.startswith(("|", "#")):
            continue
        if line.strip():
            block.append(line)
        elif block:
            prose.append(" ".join(block))
            block = []
    return prose


def test_the_paragraph_splitter():
    text = "# T\n\none two\nthree\n\n```\nnot prose\n```\n| a | b |\n\nfour\n"
    assert paragraphs(text) == ["one two three", "four"]


def test_the_readme_is_a_front_page():
    readme = (ROOT / "README.md").read_text()
    lines = readme.splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"
    long = [(len(p.split()), p[:80]) for p in paragraphs(readme) if len(p.split()) > PARAGRAPH_MAX_WORDS]
    assert not long, f"README paragraphs over {PARAGRAPH_MAX_WORDS} words: {long}"


def test_the_readme_opens_with_its_two_commands():
    """The first code block holds the main job and the test command, as written; ``.ci/run`` runs
    the test command exactly."""
    readme = (ROOT / "README.md").read_text()
    first_block = readme.split("```", 2)[1]
    assert MAIN_JOB in first_block and TEST_COMMAND in first_block, first_block
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(rf"^{re.escape(TEST_COMMAND)}$", ci, flags=re.M), ".ci/run does not run the README's test command"


def nav_pages() -> set[str]:
    """The pages in mkdocs.yml's nav, as paths under docs/."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    found: set[str] = set()

    def walk(item: object) -> None:
        if isinstance(item, str):
            found.add(item)
        elif isinstance(item, list):
            for sub in item:
                walk(sub)
        elif isinstance(item, dict):
            for sub in item.values():
                walk(sub)

    walk(config["nav"])
    return found


def test_every_docs_page_is_in_the_site_nav_and_every_nav_page_exists():
    on_disk = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    nav = nav_pages()
    assert not nav - on_disk, f"mkdocs.yml's nav names pages that do not exist: {sorted(nav - on_disk)}"
    assert not on_disk - nav, f"pages not in mkdocs.yml's nav: {sorted(on_disk - nav)}"


def test_the_readme_contents_table_points_into_the_docs_site():
    readme = (ROOT / "README.md").read_text()
    contents = readme.split("## The documentation", 1)[1]
    linked = set(re.findall(r"\]\(docs/([\w./-]+\.md)\)", contents))
    assert len(linked) >= 10, linked
    assert not linked - nav_pages(), f"README links pages outside the site's nav: {sorted(linked - nav_pages())}"
    for page in ("serve.md", "attach.md", "scaling.md", "tools.md", "models.md", "sizing.md", "troubleshooting.md",
                 "cli.md", "moved-paths.md", "api.md"):
        assert page in linked, f"the README's table of contents lacks docs/{page}"


def test_the_api_page_documents_every_public_name():
    page = (ROOT / "docs" / "api.md").read_text()
    documented = set(re.findall(r"^::: squad\.(\w+)$", page, flags=re.M))
    errors = {name for name in squad.__all__ if name in squad.errors.__all__}
    missing = set(squad.__all__) - documented - errors - {"__version__"}
    assert not missing, f"docs/api.md lacks ::: squad.NAME for {sorted(missing)}"
    assert "errors" in documented


# --- the examples teach the public API ---------------------------------------------------------

def test_examples_import_squad_only_through_its_public_api():
    bad = []
    for path in sorted((ROOT / "examples").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                bad += [f"{path.name}: import {a.name}" for a in node.names if a.name.startswith("squad")]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("squad"):
                if node.module != "squad":
                    bad.append(f"{path.name}: from {node.module} import ...")
                else:
                    bad += [f"{path.name}: {a.name} is not in squad.__all__" for a in node.names
                            if a.name not in squad.__all__]
    assert not bad, "examples must use `from squad import ...` (the public API):\n" + "\n".join(bad)


def test_examples_take_threads_as_an_option():
    """No example hard-codes the engine's threads; those that launch an engine take --threads."""
    for path in sorted((ROOT / "examples").glob("*.py")):
        text = path.read_text()
        assert not re.search(r"threads\s*=\s*\d", text), f"{path.name} hard-codes threads"
        if "Squad(" in text and "url=url" not in text:
            assert '"--threads"' in text, f"{path.name} launches an engine but takes no --threads"
