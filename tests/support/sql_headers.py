"""What each function of sql/ calls and writes, read from its body; the
`-- Calls:` / `-- Writes:` lines of its header and docs/sql-map.md, made from that.

Every function in sql/*.sql has a header comment right above its
``create or replace function``::

    -- Function: awa.name(arguments) returns type
    -- Prose: what it does, for whom, what it returns.
    -- Calls: awa.x, awa.y
    -- Writes: awa.t

The last two lines are generated from the body, never written by hand:

- ``Calls:`` the awa.* functions the body calls (pg_catalog's are not
  listed), ``nothing`` if none;
- ``Writes:`` the tables it INSERTs into, UPDATEs, DELETEs from, MERGEs into
  or TRUNCATEs itself (not through the functions it calls), ``nothing`` if
  none.

Names are sorted and wrapped at 100 characters with ``--   `` continuation
lines. A name found only in dynamic SQL (``execute format('...')``, read
from the format string with its placeholders filled in) is marked
``(dynamic)``. A dynamic statement whose table is a placeholder is listed as
the table DYNAMIC_WRITES names for that function, else as ``(dynamic)``
alone; a dynamic statement that is not a literal format string gives
``(dynamic)`` in both lines.

PL/pgSQL bodies are read with pglast.parse_plpgsql and the SQL of each
statement and expression with pglast.parse_sql; ``language sql`` bodies
with pglast.parse_sql.

    python -m tests.support.sql_headers --write   # (make sql-headers) rewrite the
                                                  # headers and docs/sql-map.md
    python -m tests.support.sql_headers           # list what is out of date, exit 1 if any

tests/test_sql_headers.py fails while a header or docs/sql-map.md is out of
date, or a function has no header.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from pglast import parser

from awa_sql.roles import RUNTIME_CAPABILITIES

ROOT = Path(__file__).resolve().parents[2]
SQL_DIR = ROOT / "sql"
MANIFEST = SQL_DIR / "manifest.txt"
SQL_MAP = ROOT / "docs" / "sql-map.md"

WIDTH = 100
CONTINUATION = "--   "
NOTHING = "nothing"
DYNAMIC = "(dynamic)"
WRITE_STATEMENTS = ("InsertStmt", "UpdateStmt", "DeleteStmt", "MergeStmt")
# Filled into a format string's %s and %I (%L: as a literal) to parse it.
PLACEHOLDER = "awa_dynamic_placeholder"

# The table a function's dynamic statements write when the SQL names it by
# a placeholder: the partitions of awa.finished, named by slot.
DYNAMIC_WRITES = {
    "awa._prune_slot": "awa.finished",
}

# Header lines that only the per-function lines may carry; a file's top
# comment has none (its functions' lines, summed up in docs/sql-map.md, say it).
FILE_LEVEL_LINES = re.compile(r"^--\s*(Calls|Writes|Tables directly manipulated):")


class HeaderError(Exception):
    """A function whose body cannot be read."""


@dataclass
class Uses:
    """What one body calls and writes: name -> True if named outside dynamic SQL."""

    calls: dict[str, bool] = field(default_factory=dict)
    writes: dict[str, bool] = field(default_factory=dict)
    dynamic_target: bool = False  # a dynamic write whose table is a placeholder
    opaque: bool = False  # dynamic SQL that is not a literal format string
    # Every piece of SQL read from the body: (its text, its parse tree, False
    # if from dynamic SQL's format string); what inserts() reads.
    statements: list[tuple[str, dict, bool]] = field(default_factory=list, compare=False,
                                                     repr=False)

    def add(self, kind: dict[str, bool], name: str, static: bool) -> None:
        kind[name] = kind.get(name, False) or static


@dataclass
class Function:
    name: str  # awa.x
    file: str  # enqueue.sql
    create_line: int  # 0-based index of the `create ... function` line
    header_start: int | None  # 0-based index of its `-- Function:` line, None: no header
    header: list[str]  # the header's lines, `-- Function:` line first
    signature_lines: int  # how many header lines the `-- Function:` line takes
    generated_start: int  # index in header of its `-- Calls:` line (len(header): none)
    uses: Uses
    roles: tuple[str, ...] | None = None  # None: no awa._grant_execute line

    @property
    def prose(self) -> list[str]:
        return [_comment_text(line) for line in
                self.header[self.signature_lines:self.generated_start]]

    @property
    def summary(self) -> str:
        return first_sentence(" ".join(p for p in self.prose if p))

    def expected_lines(self) -> list[str]:
        return render_lines(self)


@dataclass
class SqlFile:
    name: str
    text: str
    purpose: str
    top_comment: list[str]
    functions: list[Function]
    views: list[tuple[str, tuple[str, ...]]]  # (name, capabilities SELECT is granted to)


# Reading bodies.

def _json(sql: str) -> dict:
    return json.loads(parser.parse_sql_json(sql))


def _walk(node, visit) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if visit(key, value) is not False:
                _walk(value, visit)
    elif isinstance(node, list):
        for item in node:
            _walk(item, visit)


def _strings(items) -> list[str]:
    return [i["String"]["sval"] for i in items or () if "String" in i]


def _qualified(funcname) -> str:
    return ".".join(_strings(funcname))


def _range_var(node: dict) -> str:
    rv = node.get("RangeVar", node)
    return ".".join(p for p in (rv.get("schemaname"), rv.get("relname")) if p)


def _collect_sql(tree, uses: Uses, static: bool, text: str) -> None:
    uses.statements.append((text, tree, static))

    def visit(key, value):
        if key == "FuncCall":
            name = _strings(value.get("funcname"))
            if len(name) == 2 and name[0] == "awa":
                uses.add(uses.calls, ".".join(name), static)
        elif key in WRITE_STATEMENTS and "relation" in value:
            _note_write(_range_var(value["relation"]), uses, static)
        elif key == "TruncateStmt":
            for rel in value.get("relations", ()):
                _note_write(_range_var(rel), uses, static)
        return True

    _walk(tree, visit)


def _note_write(table: str, uses: Uses, static: bool) -> None:
    if PLACEHOLDER in table:
        uses.dynamic_target = True
    else:
        uses.add(uses.writes, table, static)


def _format_template(template: str) -> str:
    """A format() string with its placeholders filled in, parseable as SQL."""
    def fill(m: re.Match) -> str:
        if m.group(0) == "%%":
            return "%"
        return f"'{PLACEHOLDER}'" if m.group(0).endswith("L") else PLACEHOLDER
    return re.sub(r"%%|%(\d+\$)?-?(\d+|\*(\d+\$)?)?[sIL]", fill, template)


def _dynamic(query: str, uses: Uses) -> None:
    """The expression of EXECUTE, RETURN QUERY EXECUTE, FOR ... IN EXECUTE."""
    tree = _json(f"SELECT {query}")
    # The expression itself: format's arguments.
    _collect_sql(tree, uses, static=True, text=query)
    target = tree["stmts"][0]["stmt"]["SelectStmt"]["targetList"][0]["ResTarget"]["val"]
    template = None
    if "A_Const" in target and "sval" in target["A_Const"]:
        template = target["A_Const"]["sval"]["sval"]
    elif "FuncCall" in target and _qualified(target["FuncCall"]["funcname"]) in (
            "format", "pg_catalog.format"):
        first = target["FuncCall"].get("args", [{}])[0]
        if "A_Const" in first and "sval" in first["A_Const"]:
            template = first["A_Const"]["sval"]["sval"]
    if template is None:
        uses.opaque = True
        return
    filled = _format_template(template)
    try:
        inner = _json(filled)
    except parser.ParseError:
        uses.opaque = True
        return
    _collect_sql(inner, uses, static=False, text=filled)


def _assignment_sides(query: str) -> list[str]:
    """`target := expression` (or `=`): both sides, as expressions."""
    for op in (":=", "="):
        if op in query:
            lhs, rhs = query.split(op, 1)
            return [lhs, rhs]
    return [query]


def _expression(expr: dict, uses: Uses) -> None:
    query, mode = expr["query"], expr.get("parseMode", 0)
    if mode == 0:  # a whole statement
        _collect_sql(_json(query), uses, static=True, text=query)
    elif mode == 2:  # an expression
        _collect_sql(_json(f"SELECT {query}"), uses, static=True, text=query)
    else:  # an assignment (RAW_PARSE_PLPGSQL_ASSIGN1..3)
        for side in _assignment_sides(query):
            _collect_sql(_json(f"SELECT {side}"), uses, static=True, text=side)


def _collect_plpgsql(function_sql: str, uses: Uses) -> None:
    tree = json.loads(parser.parse_plpgsql_json(function_sql))

    def visit(key, value):
        if key in ("PLpgSQL_stmt_dynexecute", "PLpgSQL_stmt_dynfors") or (
                isinstance(value, dict) and "dynquery" in value):
            dyn_key = "dynquery" if "dynquery" in value else "query"
            _dynamic(value[dyn_key]["PLpgSQL_expr"]["query"], uses)
            _walk({k: v for k, v in value.items() if k != dyn_key}, visit)
            return False
        if key == "PLpgSQL_expr":
            _expression(value, uses)
            return False
        return True

    _walk(tree, visit)


def _option(stmt: dict, name: str):
    for opt in stmt.get("options", ()):
        if opt["DefElem"]["defname"] == name:
            return opt["DefElem"].get("arg")
    return None


def body_uses(function_sql: str) -> Uses:
    """Calls and writes of one CREATE FUNCTION statement's body."""
    stmt = _json(function_sql)["stmts"][0]["stmt"]["CreateFunctionStmt"]
    language = _option(stmt, "language")["String"]["sval"]
    uses = Uses()
    if stmt.get("sql_body"):  # BEGIN ATOMIC
        _collect_sql(stmt["sql_body"], uses, static=True, text=function_sql)
    elif language == "plpgsql":
        _collect_plpgsql(function_sql, uses)
    elif language == "sql":
        body = _strings(_option(stmt, "as")["List"]["items"])[0]
        _collect_sql(_json(body), uses, static=True, text=body)
    else:
        raise HeaderError(f"language {language}: no reader for its body")
    return uses


@dataclass
class Insert:
    """One INSERT a body makes."""

    table: str  # awa.ready
    columns: tuple[str, ...] | None  # its column list; None: it gives none
    sql: str  # its text, from INSERT on (dynamic SQL: its format string's, filled in)
    static: bool  # False: from dynamic SQL


def _from_keyword(text: str, location: int | None, keyword: str) -> str:
    """The text from the last `keyword` before byte offset `location` on."""
    data = text.encode()
    if location is None or location < 0:
        return text
    start = data.lower().rfind(keyword.encode(), 0, location)
    return data[max(start, 0):].decode(errors="replace")


def inserts(uses: Uses) -> list[Insert]:
    """Every INSERT in a body, CTEs and dynamic SQL's format strings included."""
    out: list[Insert] = []
    for text, tree, static in uses.statements:
        def visit(key, value, text=text, static=static):
            if key == "InsertStmt" and "relation" in value:
                cols = value.get("cols")
                location = value["relation"].get("RangeVar", value["relation"]).get("location")
                out.append(Insert(
                    table=_range_var(value["relation"]),
                    columns=None if not cols else tuple(c["ResTarget"]["name"] for c in cols),
                    sql=_from_keyword(text, location, "insert"), static=static))
            return True
        _walk(tree, visit)
    return out


# Rendering the generated lines.

def _items(found: dict[str, bool], extra: str | None = None) -> list[str]:
    items = [name if static else f"{name} {DYNAMIC}" for name, static in sorted(found.items())]
    if extra:
        items.append(extra)
    return items or [NOTHING]


def call_items(f: Function) -> list[str]:
    return _items(f.uses.calls, DYNAMIC if f.uses.opaque else None)


def write_items(f: Function) -> list[str]:
    writes = dict(f.uses.writes)
    extra = DYNAMIC if f.uses.opaque else None
    if f.uses.dynamic_target:
        if f.name in DYNAMIC_WRITES:
            writes.setdefault(DYNAMIC_WRITES[f.name], False)
        else:
            extra = DYNAMIC
    return _items(writes, extra)


def wrap(label: str, items: list[str]) -> list[str]:
    lines: list[str] = []
    line = f"-- {label}:"
    for i, item in enumerate(items):
        piece = item + ("," if i < len(items) - 1 else "")
        if line not in (CONTINUATION,) and len(line) + 1 + len(piece) > WIDTH:
            lines.append(line)
            line = CONTINUATION + piece
        elif line == CONTINUATION:
            line += piece
        else:
            line += " " + piece
    lines.append(line)
    return lines


def render_lines(f: Function) -> list[str]:
    return wrap("Calls", call_items(f)) + wrap("Writes", write_items(f))


def parse_generated(lines: list[str]) -> dict[str, list[str]]:
    """{'Calls': [...], 'Writes': [...]} from a header's generated lines."""
    out: dict[str, list[str]] = {}
    label = None
    for line in lines:
        m = re.match(r"^-- (Calls|Writes):(.*)$", line)
        if m:
            label = m.group(1)
            out[label] = [m.group(2)]
        elif label and line.startswith(CONTINUATION):
            out[label].append(line[len(CONTINUATION):])
        else:
            out.setdefault("other", []).append(line)
    return {k: [i.strip() for i in " ".join(v).split(",") if i.strip()] if k != "other" else v
            for k, v in out.items()}


# Reading files.

def _comment_text(line: str) -> str:
    return line[2:].strip() if line.startswith("--") else line.strip()


def first_sentence(text: str) -> str:
    """Up to the first full stop that ends a sentence ("0 .. n", "e.g." and
    "awa.x" do not)."""
    m = re.search(r"(?<![.\s])(?<!\be\.g)(?<!\bi\.e)\.(?=\s|$)", text)
    return text[: m.end()] if m else text


def manifest() -> list[str]:
    return [line.strip() for line in MANIFEST.read_text().splitlines()
            if line.strip() and not line.startswith("#")]


def _grants(stmts: list[dict], function: str) -> dict[str, tuple[str, ...]]:
    out = {}
    for raw in stmts:
        select = raw["stmt"].get("SelectStmt")
        if not select or len(select.get("targetList", ())) != 1:
            continue
        call = select["targetList"][0]["ResTarget"]["val"].get("FuncCall")
        if not call or _qualified(call["funcname"]) != function:
            continue
        args = [a["A_Const"]["sval"]["sval"] for a in call.get("args", ())
                if "A_Const" in a and "sval" in a["A_Const"]]
        out[args[0].split("(")[0].strip()] = tuple(args[1:])
    return out


def _signature_lines(header: list[str]) -> int:
    depth, n = 0, 0
    for line in header:
        text = _comment_text(line)
        if n and depth <= 0 and not line.startswith("--   "):
            break
        depth += text.count("(") - text.count(")")
        n += 1
    return n


def read_sql_file(name: str) -> SqlFile:
    text = (SQL_DIR / name).read_text()
    data = text.encode()
    lines = text.splitlines()
    stmts = _json(text)["stmts"]
    grants = _grants(stmts, "awa._grant_execute")
    selects = _grants(stmts, "awa._grant_select")
    # A view is made as a scratch view that awa._ensure_view(view, scratch)
    # puts in place: list it by its own name.
    scratches = {args[0]: view for view, args in _grants(stmts, "awa._ensure_view").items()}
    functions, views = [], []
    for raw in stmts:
        start = raw.get("stmt_location", 0)
        sql = data[start:start + raw["stmt_len"]].decode()
        if "ViewStmt" in raw["stmt"]:
            made = _range_var(raw["stmt"]["ViewStmt"]["view"])
            if made not in scratches:
                raise HeaderError(f"{name}: view {made} is not made through awa._ensure_view "
                                  "(CREATE OR REPLACE VIEW locks out its readers)")
            view = scratches[made]
            views.append((view, selects.get(view, ())))
        if "CreateFunctionStmt" not in raw["stmt"]:
            continue
        fname = _qualified(raw["stmt"]["CreateFunctionStmt"]["funcname"])
        m = re.search(r"(?im)^[ \t]*create\s+(or\s+replace\s+)?function\b", sql)
        if not m:
            raise HeaderError(f"{name}: cannot find the CREATE line of {fname}")
        create_line = data[:start].decode().count("\n") + sql[:m.start()].count("\n")
        top = create_line
        while top > 0 and lines[top - 1].startswith("--"):
            top -= 1
        block = lines[top:create_line]
        starts = [i for i, line in enumerate(block) if line.startswith("-- Function:")]
        header_start = top + starts[-1] if starts else None
        header = lines[header_start:create_line] if header_start is not None else []
        generated = [i for i, line in enumerate(header) if re.match(r"^-- (Calls|Writes):",
                                                                      line)]
        try:
            uses = body_uses(sql[m.start():])
        except (parser.ParseError, KeyError, IndexError) as err:
            raise HeaderError(f"{name}: cannot read the body of {fname}: {err}") from err
        functions.append(Function(
            name=fname, file=name, create_line=create_line, header_start=header_start,
            header=header, signature_lines=_signature_lines(header),
            generated_start=generated[0] if generated else len(header), uses=uses,
            roles=grants.get(fname)))
    top_comment = []
    for line in lines:
        if not line.startswith("--"):
            break
        top_comment.append(line)
    first_paragraph = []
    for line in top_comment:
        if _comment_text(line) == "":
            break
        first_paragraph.append(_comment_text(line))
    purpose = first_sentence(re.sub(rf"^{re.escape(name)}:\s*", "", " ".join(first_paragraph)))
    return SqlFile(name=name, text=text, purpose=purpose, top_comment=top_comment,
                   functions=functions, views=views)


def read_all() -> list[SqlFile]:
    return [read_sql_file(name) for name in manifest()]


# Checking and writing.

def header_problems(f: Function) -> list[str]:
    where = f"sql/{f.file}:{f.create_line + 1}: {f.name}"
    if f.header_start is None:
        return [f"{where}: no header (a '-- Function: {f.name}(...)' comment right above it)"]
    if not re.match(rf"^-- Function: {re.escape(f.name)}\b", f.header[0]):
        return [f"{where}: its header names another function: {f.header[0]!r}"]
    expected = f.expected_lines()
    actual = f.header[f.generated_start:]
    if actual == expected:
        return []
    have, want = parse_generated(actual), parse_generated(expected)
    out = []
    for label in ("Calls", "Writes"):
        if label not in have:
            out.append(f"{where}: no '-- {label}:' line; the body says: "
                       f"{', '.join(want[label])}")
            continue
        missing = [i for i in want[label] if i not in have[label]]
        extra = [i for i in have[label] if i not in want[label]]
        if missing:
            out.append(f"{where}: {label}: the body also has {', '.join(missing)}")
        if extra:
            out.append(f"{where}: {label}: lists {', '.join(extra)}, which the body has not")
    if "other" in have:
        out.append(f"{where}: lines after Calls:/Writes: {have['other']}")
    if not out:
        out.append(f"{where}: Calls:/Writes: agree with the body but are laid out differently")
    return out


def file_problems(sf: SqlFile) -> list[str]:
    out = [f"sql/{sf.name}:{i + 1}: a file-level {FILE_LEVEL_LINES.match(line).group(1)}: "
           "line; the per-function lines and docs/sql-map.md say it"
           for i, line in enumerate(sf.top_comment) if FILE_LEVEL_LINES.match(line)]
    for f in sf.functions:
        if f.roles is None:
            out.append(f"sql/{sf.name}: {f.name} has no awa._grant_execute line")
        if f.name in DYNAMIC_WRITES and not f.uses.dynamic_target:
            out.append(f"sql/{sf.name}: {f.name} is in DYNAMIC_WRITES but writes no table "
                       "named by a placeholder")
    return out


def rewrite(sf: SqlFile) -> str:
    lines = sf.text.splitlines()
    for f in sorted(sf.functions, key=lambda f: f.create_line, reverse=True):
        if f.header_start is None:
            continue  # the check names it; a header's prose is the author's to write
        begin = f.header_start + f.generated_start
        lines[begin:f.create_line] = f.expected_lines()
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    text = re.sub(r"`?\b(awa\.[a-z_][a-z0-9_]*(\(\))?)`?", r"`\1`", text)
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _roles(caps: tuple[str, ...] | None) -> str:
    if not caps:
        return "—"
    if sorted(caps) == sorted(RUNTIME_CAPABILITIES):
        return "every runtime role"
    return ", ".join(f"awa_{c}" for c in caps)


def _names(names) -> str:
    return ", ".join(f"`{n}`" if n != DYNAMIC else n for n in names)


def render_map(files: list[SqlFile]) -> str:
    order = [sf.name for sf in files]
    defined = {f.name: sf.name for sf in files for f in sf.functions}
    out = [
        "# The SQL map",
        "",
        "<!-- GENERATED by `python -m tests.support.sql_headers --write` from the",
        "     headers in sql/: do not edit. tests/test_sql_headers.py fails when",
        "     it is out of date. -->",
        "",
        "The table of contents of the function layer: the files of `sql/`, in the",
        "order `awa migrate` applies them (`sql/manifest.txt`), and the functions",
        "of each. What callers may rely on is [docs/sql-api.md](sql-api.md); this",
        "page is for changing them. The fast paths, each with the general path it",
        "repeats for one input shape and the test that compares the two, are in",
        "[docs/fast-paths.md](fast-paths.md).",
        "",
        "- **role**: the roles that may execute the function, from the file's",
        "  `awa._grant_execute` lines, by their default names (`awa migrate",
        "  --role-prefix` changes them). Every runtime role: `awa_producer`,",
        "  `awa_worker`, `awa_maintenance`, `awa_operator` and `awa_reader`. A",
        "  dash: none; only the owner may, which is to say the functions of the",
        "  layer that call it.",
        "- **summary**: the first sentence of the function's header.",
        "",
        "Each function's header in its file ends with two generated lines:",
        "`-- Calls:` (the `awa.*` functions its body calls) and `-- Writes:` (the",
        "tables it inserts into, updates, deletes from or truncates itself);",
        "`(dynamic)` marks a name found only in dynamic SQL. Under each file's",
        "table, the same summed up: the tables the file writes and the functions",
        "of other files it calls. After changing a body or a header, regenerate",
        "the lines and this page rather than edit them:",
        "",
        "```sh",
        "make sql-headers   # .venv/bin/python -m tests.support.sql_headers --write",
        "```",
        "",
    ]
    for sf in files:
        purpose = sf.purpose[:1].upper() + sf.purpose[1:]
        out += [f"## {sf.name}", "", _md(purpose), ""]
        if not sf.functions:
            out += ["No functions.", ""]
        else:
            out += ["| function | role | summary |", "|---|---|---|"]
            for f in sf.functions:
                out.append(f"| `{f.name}` | {_roles(f.roles)} | {_md(f.summary) or '—'} |")
            out.append("")
            writes = sorted({w.removesuffix(f" {DYNAMIC}") for f in sf.functions
                             for w in write_items(f) if w != NOTHING})
            outside: dict[str, set[str]] = {}
            for f in sf.functions:
                for c in f.uses.calls:
                    if defined.get(c) != sf.name:
                        outside.setdefault(defined.get(c, "?"), set()).add(c)
            calls = "; ".join(
                f"{where}: {_names(sorted(outside[where]))}"
                for where in sorted(outside, key=lambda w: (w not in order, order.index(w)
                                                            if w in order else 0, w)))
            out.append(f"- Writes: {_names(writes) if writes else 'nothing'}.")
            out.append(f"- Calls in other files: {calls or 'nothing'}.")
        if sf.views:
            views = ", ".join(f"`{v}` ({_roles(caps)})" for v, caps in sf.views)
            if sf.functions:
                out.append(f"- Views: {views}.")
            else:
                out += [f"Views: {views}."]
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def problems(files: list[SqlFile] | None = None) -> list[str]:
    files = read_all() if files is None else files
    out = [p for sf in files for f in sf.functions for p in header_problems(f)]
    out += [p for sf in files for p in file_problems(sf)]
    current = SQL_MAP.read_text() if SQL_MAP.exists() else ""
    if current != render_map(files):
        out.append("docs/sql-map.md is out of date")
    return out


def write() -> list[str]:
    """Rewrites the headers' generated lines and docs/sql-map.md; returns what changed."""
    changed = []
    for name in manifest():
        sf = read_sql_file(name)
        new = rewrite(sf)
        if new != sf.text:
            (SQL_DIR / name).write_text(new)
            changed.append(f"sql/{name}")
    text = render_map(read_all())
    if not SQL_MAP.exists() or SQL_MAP.read_text() != text:
        SQL_MAP.write_text(text)
        changed.append("docs/sql-map.md")
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.support.sql_headers",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true",
                    help="rewrite the Calls:/Writes: lines and docs/sql-map.md")
    args = ap.parse_args(argv)
    if args.write:
        for path in write():
            print(f"wrote {path}")
    found = problems()
    for p in found:
        print(p, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
