"""The documentation's internal references resolve: every relative link of README.md,
doc/*.md and the other READMEs names a file that exists (and, for a `#anchor` into a
Markdown file, a heading of that file), and every `doc/<name>.md` a source or sample file
mentions exists. Runs no process: cheap, and it keeps the README and doc/ split honest."""
import importlib.util
import re

from conftest import REPO

DOCS = ["README.md", "contrib/README.md", "tests/integration/README.md",
        "tests/fuzz/README.md"] + sorted(str(p.relative_to(REPO))
                                         for p in (REPO / "doc").glob("*.md"))
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    h = heading.strip().lower()
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def anchors(path):
    out, code = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            code = not code
        elif not code and line.startswith("#"):
            out.add(slug(line.lstrip("#")))
    return out


def links(path):
    code = False
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("```"):
            code = not code
        elif not code:
            for m in LINK.finditer(line):
                yield n, m.group(1)


def test_relative_links_resolve():
    bad = []
    for doc in DOCS:
        src = REPO / doc
        for n, target in links(src):
            if re.match(r"[a-z]+:", target):          # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (src.parent / path).resolve() if path else src
            if not dest.exists():
                bad.append("%s:%d: %s: no such file" % (doc, n, target))
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append("%s:%d: %s: no such heading" % (doc, n, target))
    assert not bad, "\n".join(bad)


def test_doc_files_named_in_sources_exist():
    """Comments and samples point readers at doc/<name>.md: the file must exist."""
    bad = []
    files = [p for d in ("src", "spoa", "haproxy", "contrib", "lua", "tests")
             for p in (REPO / d).rglob("*") if p.is_file() and p.suffix not in (".png",)
             and "corpus" not in p.parts]
    files += [REPO / "Makefile", REPO / ".ci" / "run"]
    for p in files:
        try:
            text = p.read_text()
        except UnicodeDecodeError:
            continue
        for m in re.finditer(r"\bdoc/([A-Za-z0-9_-]+\.md)", text):
            if not (REPO / "doc" / m.group(1)).exists():
                bad.append("%s: doc/%s" % (p.relative_to(REPO), m.group(1)))
    assert not bad, "\n".join(bad)


def test_src_map_matches_includes(capsys):
    """doc/development.md's map of src/ (make check-layers): every file of src/ in one row, and
    every #include goes to a lower layer, as the row's "Calls" says."""
    spec = importlib.util.spec_from_file_location("check_layers", REPO / "tests" / "check_layers.py")
    check_layers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check_layers)
    assert check_layers.main() == 0, capsys.readouterr().err
