"""The docs resolve: every ``docs/...md`` the code, the README and the docs name exists; every
field-case code used in ``src/`` is indexed in ``docs/field-cases.md``; no module docstring is an
essay (over 30 lines: the design goes to ``docs/design/``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

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


def test_the_readme_lists_every_moved_import_path():
    from squad._moved import MOVED

    readme = (ROOT / "README.md").read_text()
    missing = [f"{old} -> {new}" for old, new in MOVED.items() if f"| `{old}` | `{new}` |" not in readme]
    assert not missing, "README's 'Moved import paths' table lacks:\n" + "\n".join(missing)
