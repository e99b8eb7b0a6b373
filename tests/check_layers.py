#!/usr/bin/env python3
"""The map of src/ in doc/development.md matches the includes.

The map is the table under "## Map of `src/`": one row per module, its layer
first, then its files in backquotes (`x.[ch]` is x.c and x.h; a name with a
slash is from the top of the repository, any other is in src/), its purpose,
and what it calls: layers ("0-3": modules of layers 0 to 3) and modules by
name (a row's name is its first file's, without the extension). Checked:

- every file of src/ is in exactly one row, and every file named exists;
- a file includes ("...") only headers of its own row or of a lower layer
  (nothing above it, nothing beside it: the modules form no cycle), and of
  those only what its row's "Calls" allows;
- every module a row's "Calls" names is included by one of the row's files.

`make check-layers` runs it; so does tests/integration/test_docs.py.
Exits 1 with one line per problem."""
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "doc" / "development.md"
HEADING = "## Map of `src/`"
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


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
    return [n if "/" in n else "src/" + n for n in names]


def read_map(text, bad):
    """The rows of the table under HEADING, and {path: row}."""
    rows, files, inside = [], {}, False
    for line in text.splitlines():
        if line.startswith("## "):
            inside = line.strip() == HEADING
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if inside else []
        if len(cells) < 4 or not cells[0].isdigit():
            continue
        row = Row(len(rows), int(cells[0]), re.findall(r"`([^`]+)`", cells[1]), cells[3])
        rows.append(row)
        for path in row.files:
            if path in files:
                bad.append("%s: in two rows of the map" % path)
            files[path] = row
    if not rows:
        bad.append("%s: no table under '%s'" % (DOC.relative_to(REPO), HEADING))
    names = {r.name for r in rows}
    for row in rows:
        for name in sorted(row.calls - names):
            bad.append("map: row %s calls '%s', which is no row" % (row.name, name))
    return rows, files


def resolve(inc, src):
    for d in (src.parent, REPO / "src", REPO / "spoa"):
        if (d / inc).exists():
            return str((d / inc).relative_to(REPO))
    return None


def main():
    bad = []
    rows, files = read_map(DOC.read_text(), bad)
    present = {str(p.relative_to(REPO)) for p in (REPO / "src").iterdir()
               if p.suffix in (".c", ".h")}
    for path in sorted(present - set(files)):
        bad.append("%s: not in the map of doc/development.md" % path)
    for path in sorted(f for f in files if not (REPO / f).exists()):
        bad.append("%s: in the map, but no such file" % path)
    used = {row.name: set() for row in rows}
    n = 0
    for path in sorted(present & set(files)):
        row = files[path]
        for inc in INCLUDE.findall((REPO / path).read_text()):
            dest = resolve(inc, REPO / path)
            n += 1
            if dest is None:
                continue        # generated or missing: the build says so
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
    for line in bad:
        print("check-layers: " + line, file=sys.stderr)
    if not bad:
        print("check-layers: %d files, %d includes: each goes down the map, as it says"
              % (len(present), n))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
