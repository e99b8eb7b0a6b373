#!/usr/bin/env python3
"""The map of src/ in doc/development.md matches the tree and the includes.

The map, under "## Map of `src/`", is two tables.

The folders (wings), in order from the bottom: "| <order> | `<folder>/` | <wing> |".
Checked:
- every file of src/ lives in a folder of the table (src/ itself is the top);
- a file includes ("...") headers of its own folder and of folders of a lower order only,
  never of one above;
- a wing's private header (`*_int.h`) is included by its own folder's files alone, and by
  the top (src/main.c, src/agent.c), which assembles the wings.

The modules: one row each, its layer first, then its files in backquotes, named from
src/ (`core/x.[ch]` is src/core/x.c and src/core/x.h; a name under spoa/ is from the top
of the repository), its purpose, and what it calls: layers ("0-3": modules of layers 0 to
3) and modules by name (a row's name is its first file's, without the extension). Checked:
- every file of src/ is in exactly one row, and every file named exists;
- a file includes only headers of its own row or of a lower layer (nothing above it,
  nothing beside it: the modules form no cycle), and of those only what its row's
  "Calls" allows;
- every module a row's "Calls" names is included by one of the row's files.

A decision's life has one owner: no file but src/decide/decision.c ends a SPOP request
(spoa_req_done()) or reads or writes the decisions' pool (struct decision_pool: the
unused decisions, the store calls owed, the parked list).

The agent's parts have one writer each: a part of the decision path's statistics,
st.<name> (struct decide_stats), is written (=, ++, --, +=...) by src/decide/<name>.c alone;
a cache of the decision path (struct decide_caches) is read and written by its file alone;
the top's own fields of the agent are written by src/agent.c alone (checked in the files that
see struct agent: those that include decide/agent_int.h).

And no function of src/ or spoa/ is longer than FUNC_MAX lines, from its name to its
closing brace (the house style puts a function's braces in the first column).

`make check-layers` runs it; so does tests/integration/test_docs.py.
Exits 1 with one line per problem."""
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "doc" / "development.md"
HEADING = "## Map of `src/`"
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
TOP = "src"
FUNC_MAX = 120
# what one file alone may do: (pattern, the file, what it is)
OWNED = [(re.compile(r"\bspoa_req_done\s*\("), "src/decide/decision.c", "ends a SPOP request"),
         (re.compile(r"->decisions\.\w"), "src/decide/decision.c",
          "reads or writes the decisions' pool (unused, owed, parked)")]
# the decision path's caches: which file alone reads and writes each
CACHES = {"tier": "src/decide/prepare.c", "tier_size": "src/decide/prepare.c",
          "digest": "src/decide/principal.c", "blocked": "src/decide/blocked.c",
          "held": "src/decide/charge.c", "nheld": "src/decide/charge.c",
          "held_closed": "src/decide/charge.c"}
CACHE_USE = re.compile(r"->caches\.(\w+)")
# the agent's fields that src/agent.c alone writes (the others read them)
TOP_FIELDS = ("loop|rs|srv|store|mem|local|quota|hb|gateways|ovr|metrics|ms|http|status_cache"
              "|publish|local_check|heap_check")
TOP_WRITE = re.compile(r"(?:\+\+|--)\s*(?:\ba|d->a)->(%s)\b"
                       r"|(?:\ba|d->a)->(%s)(?:\[[^\]]*\]|\.\w+)*\s*"
                       r"(?:\+\+|--|[-+*/%%|&^]?=(?!=)|<<=|>>=)" % (TOP_FIELDS, TOP_FIELDS))
# a write of the decision path's statistics: the part written is group 1 or 2
STAT_WRITE = re.compile(r"(?:\+\+|--)\s*[\w>.-]*->st\.(\w+)\."
                        r"|->st\.(\w+)\.\w+(?:\[[^\]]*\]|\.\w+)*\s*"
                        r"(?:\+\+|--|[-+*/%|&^]?=(?!=)|<<=|>>=)")


class Row:
    def __init__(self, n, layer, names, calls):
        self.n, self.layer = n, layer
        self.files = [p for name in names for p in expand(name)]
        self.name = Path(self.files[0]).stem if self.files else "?"
        self.upto, self.calls = -1, set()
        for tok in (t.strip() for t in calls.split(",")):
            m = re.fullmatch(r"(\d+)(?:\s*[-–]\s*(\d+))?", tok)
            if m:
                self.upto = max(self.upto, int(m.group(2) or m.group(1)))
            elif tok and tok not in ("—", "-"):
                self.calls.add(tok)


def expand(name):
    m = re.fullmatch(r"(.*)\.\[ch\]", name)
    names = [m.group(1) + ".c", m.group(1) + ".h"] if m else [name]
    return [n if n.startswith("spoa/") else "src/" + n for n in names]


def folder_of(path):
    """The folder of a file named from the top of the repository: "src/core", "src", "spoa"."""
    return str(Path(path).parent)


def read_map(text, bad):
    """The folder table ({folder: order}), the module rows, and {path: row}."""
    folders, rows, files, inside = {}, [], {}, False
    for line in text.splitlines():
        if line.startswith("## "):
            inside = line.strip() == HEADING
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if inside else []
        if len(cells) < 3 or not cells[0].isdigit():
            continue
        if len(cells) == 3:
            m = re.fullmatch(r"`([^`]+)/`", cells[1])
            if not m:
                bad.append("map: folder row '%s' does not name a folder as `name/`" % cells[1])
                continue
            folders[m.group(1)] = int(cells[0])
            continue
        row = Row(len(rows), int(cells[0]), re.findall(r"`([^`]+)`", cells[1]), cells[3])
        rows.append(row)
        for path in row.files:
            if path in files:
                bad.append("%s: in two rows of the map" % path)
            files[path] = row
    if not rows or not folders:
        bad.append("%s: no folder table or no module table under '%s'"
                   % (DOC.relative_to(REPO), HEADING))
    names = {r.name for r in rows}
    for row in rows:
        for name in sorted(row.calls - names):
            bad.append("map: row %s calls '%s', which is no row" % (row.name, name))
    return folders, rows, files


def resolve(inc, src, dirs):
    for d in [src.parent] + dirs:
        if (d / inc).exists():
            return str((d / inc).relative_to(REPO))
    return None


def check_folders(folders, path, dest, bad):
    """The folder rules for <path> including <dest> (both from the top of the repository)."""
    src, dst = folder_of(path), folder_of(dest)
    if src not in folders or dst not in folders:
        return                          # reported once per file by main()
    if folders[dst] > folders[src]:
        bad.append("%s (folder %s/) includes %s: folder %s/ is above it"
                   % (path, src, dest, dst))
    if dest.endswith("_int.h") and dst != src and src != TOP:
        bad.append("%s includes %s: the private header of wing %s/" % (path, dest, dst))


def long_functions(path, bad):
    """Functions of <path> longer than FUNC_MAX lines (a body from a "{" to a "}" in the
    first column, its name on the last line before it that opens a parenthesis)."""
    lines = path.read_text().split("\n")
    i = 0
    while i < len(lines):
        if lines[i] == "{" and i:
            j = i - 1
            while j > 0 and "(" not in lines[j]:
                j -= 1
            k = i + 1
            while k < len(lines) and lines[k] != "}":
                k += 1
            m = re.search(r"(\w+)\s*\(", lines[j])
            if k - j + 1 > FUNC_MAX:
                bad.append("%s:%d: %s() is %d lines long (at most %d: tell its parts apart)"
                           % (path.relative_to(REPO), j + 1, m.group(1) if m else "?",
                              k - j + 1, FUNC_MAX))
            i = k
        i += 1


def owners(path, bad):
    """What one file alone may do (OWNED), and the agent's parts each file writes, in <path>."""
    rel, text = str(path.relative_to(REPO)), path.read_text()
    agent = '#include "agent_int.h"' in text
    for ln, line in enumerate(text.split("\n"), 1):
        for pat, owner, what in OWNED:
            if rel != owner and pat.search(line):
                bad.append("%s:%d: %s: only %s does (a decision's life has one owner)"
                           % (rel, ln, what, owner))
        for m in STAT_WRITE.finditer(line):
            part = m.group(1) or m.group(2)
            if rel != "src/decide/%s.c" % part:
                bad.append("%s:%d: writes st.%s: only src/decide/%s.c does (each part of "
                           "the agent has one writer)" % (rel, ln, part, part))
        for m in TOP_WRITE.finditer(line) if agent and rel != "src/agent.c" else ():
            bad.append("%s:%d: writes the agent's %s: only src/agent.c does (each part of the "
                       "agent has one writer)" % (rel, ln, m.group(1) or m.group(2)))
        for m in CACHE_USE.finditer(line):
            owner = CACHES.get(m.group(1), "no file (no such cache)")
            if rel != owner:
                bad.append("%s:%d: uses caches.%s: only %s does (each part of the agent "
                           "has one writer)" % (rel, ln, m.group(1), owner))


def main():
    bad = []
    folders, rows, files = read_map(DOC.read_text(), bad)
    dirs = [REPO / "src"] + sorted(p for p in (REPO / "src").iterdir() if p.is_dir()) \
        + [REPO / "spoa"]
    present = {str(p.relative_to(REPO)) for p in (REPO / "src").rglob("*")
               if p.suffix in (".c", ".h")}
    for path in sorted(present):
        if folder_of(path) not in folders:
            bad.append("%s: its folder is not in the map's folder table" % path)
    for path in sorted(present - set(files)):
        bad.append("%s: not in the map of doc/development.md" % path)
    for path in sorted(f for f in files if not (REPO / f).exists()):
        bad.append("%s: in the map, but no such file" % path)
    used = {row.name: set() for row in rows}
    n = 0
    for path in sorted(present & set(files)):
        row = files[path]
        for inc in INCLUDE.findall((REPO / path).read_text()):
            dest = resolve(inc, REPO / path, dirs)
            n += 1
            if dest is None:
                continue        # generated or missing: the build says so
            check_folders(folders, path, dest, bad)
            to = files.get(dest)
            if to is None:
                bad.append("%s: includes %s, which is not in the map" % (path, dest))
                continue
            if to is row:
                continue
            elif to.layer >= row.layer:
                bad.append("%s (layer %d) includes %s (layer %d): a layer %s"
                           % (path, row.layer, dest, to.layer,
                              "above it" if to.layer > row.layer else "beside it"))
            elif to.layer > row.upto and to.name not in row.calls:
                bad.append("%s includes %s: not in what row %s calls"
                           % (path, dest, row.name))
            used[row.name].add(to.name)
    for row in rows:
        for name in sorted(row.calls - used[row.name]):
            bad.append("map: row %s calls %s, but none of its files includes it"
                       % (row.name, name))
    for path in sorted(list((REPO / "src").rglob("*.c")) + list((REPO / "spoa").glob("*.c"))):
        long_functions(path, bad)
    for path in sorted((REPO / "src").rglob("*.c")):
        owners(path, bad)
    for line in bad:
        print("check-layers: " + line, file=sys.stderr)
    if not bad:
        print("check-layers: %d files in %d folders, %d includes: each goes down the map, "
              "as it says; no function over %d lines"
              % (len(present), len({folder_of(p) for p in present}), n, FUNC_MAX))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
