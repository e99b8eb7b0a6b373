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


def documented_defaults():
    """{key: its default cell} of every settings table in doc/*.md: rows whose first cell
    names keys in backquotes (`a.b`, `.c` for a sibling of the first) and whose second is
    the default."""
    rows = {}
    for path in sorted((REPO / "doc").glob("*.md")):
        for line in path.read_text().splitlines():
            if not line.startswith("| `"):
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) < 3:
                continue
            names = []
            for n in re.findall(r"`([^`]+)`", cells[0]):
                names.append(names[0].rsplit(".", 1)[0] + n if n.startswith(".") and names
                             else n)
            for n in names:
                rows.setdefault(n, cells[1])
    return rows


def duration_ms(text):
    m = re.fullmatch(r"(\d+)(ms|s|m|h|d)?", text)
    if not m:
        return None
    return int(m.group(1)) * {"ms": 1, "s": 1000, None: 1000, "m": 60000, "h": 3600000,
                              "d": 86400000}[m.group(2)]


def test_every_default_is_documented_as_the_code_has_it(agent_bin):
    """`spoa-ratelimit defaults` prints the default of every setting read from the key
    tables (src/config/config.c: the one place defaults are written); each is in a settings table
    of doc/ with the same value. A default of 0 that the agent derives (from another key,
    or from spoe_timeout) is documented in words or by that key's name."""
    import subprocess
    out = subprocess.run([str(agent_bin), "defaults"], capture_output=True, text=True,
                         timeout=10, check=True).stdout
    rows = documented_defaults()
    keys, bad = 0, []
    for line in out.splitlines():
        key, value = [x.strip() for x in line.split("=", 1)]
        keys += 1
        if key not in rows:
            bad.append("%s (default %s): in no settings table of doc/" % (key, value))
            continue
        cell = rows[key]
        lit = re.match(r"`([^`]*)`", cell)
        doc = lit.group(1).strip('"') if lit else None
        names_a_key = doc is not None and any(k == doc or k.endswith("." + doc) for k in rows)
        if value in ("0", "0ms") and (not lit or names_a_key or cell.startswith("derived")):
            continue                                    # derived
        if value.endswith("ms") and not value.startswith('"'):
            ok = doc is not None and duration_ms(doc) == int(value[:-2])
        else:
            ok = doc == value.strip('"')
        if not ok:
            bad.append("%s: the code says %s, the documentation %r" % (key, value, cell[:60]))
    assert keys > 30, out
    assert not bad, "\n".join(bad)
