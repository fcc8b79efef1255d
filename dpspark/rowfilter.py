"""``input.where``: a row filter that cannot fail on any row.

Why a grammar of our own. The filter is applied to the private rows AFTER the ledger is charged, so
"the run failed" versus "the run succeeded" must never depend on a row's value: otherwise one run
at a tiny epsilon answers an exact yes/no question about one record (``id = 42 AND salary >
100000``, with an expression that raises when the predicate holds). Spark SQL has many expressions
that raise on some values even with ANSI mode off (a LIKE whose pattern is computed from a row,
casts to intervals, datetime parsing with a computed format, interval arithmetic overflow), so an
allowlist of Spark's node names is not enough. Instead the filter is parsed HERE, into a small
grammar in which every construct is total (defined for every value of every allowed type), and the
Column that Spark runs is built from that parse tree, never from the text:

    filter     := disjunct (OR disjunct)*
    disjunct   := conjunct (AND conjunct)*
    conjunct   := NOT conjunct | predicate
    predicate  := operand [ comparison operand
                          | [NOT] IN '(' literal (',' literal)* ')'
                          | [NOT] BETWEEN operand AND operand
                          | IS [NOT] NULL ]
    comparison := = | == | <=> | <> | != | < | <= | > | >=
    operand    := literal | column | function '(' operand (',' operand)* ')' | '(' filter ')'
    literal    := [-]number | 'string' | "string" | TRUE | FALSE | NULL | DATE 'yyyy-mm-dd'
                | TIMESTAMP 'yyyy-mm-dd[ hh:mm:ss[.ffffff]]'
    column     := name | `quoted name`

and the functions of ``FUNCTIONS`` (each total: string case and trimming, null and NaN tests,
coalesce, prefix/suffix/substring tests, the year/month/day/hour of a date or timestamp, and
``to_date`` / ``date`` / ``timestamp`` of one argument, which are casts). No arithmetic (overflow
under ANSI), no casts to other types, no patterns or formats, no subqueries, no user functions.

Why it cannot raise: comparisons, AND/OR/NOT, IN over literals, IS NULL and the listed functions
are total on the allowed types. The only other node Spark adds is the implicit Cast of type
coercion (e.g. a string column compared with a number); the Column is analysed with ANSI mode off,
so those casts give NULL instead of raising, and ``check_analysed`` verifies on the analysed plan,
before the charge, that every node is of an allowed kind, every Cast is a non-ANSI cast between
atomic types (never to or from an interval, array, map, struct or variant), and every column a
filter reads has an atomic type. Tested with filters drawn at random from this grammar on hostile
rows (NaN, +-inf, 1e308, empty, very long and invalid UTF-8 strings, nulls, extreme dates and
integers) with ANSI on and off at execution (tests/test_where_filter.py).

On a Spark Connect session (``apply_connect``) the client holds no analysed plan, and the server
analyses the plan again at every action with its session's settings at that moment. The same
guarantee is kept by pinning, not by inspecting: ANSI mode is set off on the run's session and
never put back, read back and probed before the charge; every column the filter reads must have an
atomic type (the table's schema, which is metadata); and the one node a total grammar still gets
from Spark's function builders that the classic check refuses (``startswith``/``endswith``/
``contains`` of two binary values, a ``BinaryPredicate``) is refused from the column types. See
``apply_connect`` for the argument.

``parse`` needs no Spark (``dpspark validate`` uses it); ``to_column`` and ``check_analysed`` (or,
on Spark Connect, ``pin_non_ansi`` and ``connect_problem``) run in ``dpspark.tables.load_input``,
before the charge.
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from dpspark.errors import ConfigError

KEY = "input.where"
MAX_LENGTH = 10_000  # characters of filter text
MAX_DEPTH = 64  # nesting: a deeper filter is refused (no deep recursion in Spark's analyser)

# name -> (min args, max args); each is total on every value of the types Spark lets it take.
FUNCTIONS = {
    "isnull": (1, 1), "isnotnull": (1, 1), "isnan": (1, 1), "coalesce": (1, 16),
    "lower": (1, 1), "upper": (1, 1), "trim": (1, 1), "ltrim": (1, 1), "rtrim": (1, 1),
    "startswith": (2, 2), "endswith": (2, 2), "contains": (2, 2),
    "year": (1, 1), "month": (1, 1), "day": (1, 1), "dayofmonth": (1, 1), "hour": (1, 1),
    "to_date": (1, 1), "date": (1, 1), "timestamp": (1, 1),
}
_COMPARISONS = ("<=>", "==", "<>", "!=", "<=", ">=", "=", "<", ">")
_KEYWORDS = {"and", "or", "not", "in", "between", "is", "null", "true", "false", "date", "timestamp"}


# ---------------------------------------------------------------------------------------------
# Parse tree


@dataclass(frozen=True)
class Column:
    name: str


@dataclass(frozen=True)
class Literal:
    value: object  # None, bool, int, Decimal, float, str, datetime.date, datetime.datetime


@dataclass(frozen=True)
class Call:
    name: str
    args: tuple


@dataclass(frozen=True)
class Compare:
    op: str
    left: object
    right: object


@dataclass(frozen=True)
class InList:
    operand: object
    values: tuple  # of Literal
    negated: bool


@dataclass(frozen=True)
class Between:
    operand: object
    low: object
    high: object
    negated: bool


@dataclass(frozen=True)
class IsNull:
    operand: object
    negated: bool


@dataclass(frozen=True)
class Not:
    operand: object


@dataclass(frozen=True)
class BoolOp:
    op: str  # "and" | "or"
    parts: tuple


# ---------------------------------------------------------------------------------------------
# Lexer

_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<string>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
  | (?P<quoted>`(?:[^`]|``)+`)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op><=>|==|<>|!=|<=|>=|=|<|>)
  | (?P<punct>[(),.\-])
""", re.VERBOSE | re.DOTALL)
_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "t": "\t", "r": "\r", "0": "\0", "%": "\\%", "_": "\\_"}


def _error(text: str, message: str) -> ConfigError:
    shown = text if len(text) <= 200 else text[:200] + "..."
    return ConfigError(KEY, f"{shown!r}: {message}. A row filter allows column comparisons with =, <>, <, <=, >, "
                            f">=, <=>, AND/OR/NOT, IN (literals), BETWEEN, IS [NOT] NULL and the functions "
                            f"{', '.join(sorted(FUNCTIONS))} (see docs/privacy.md, 'input.where')")


def _unescape(text: str, body: str) -> str:
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c == "\\":
            nxt = body[i + 1]
            if nxt not in _ESCAPES:
                raise _error(text, f"the escape '\\{nxt}' in a string literal is not supported")
            out.append(_ESCAPES[nxt])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise _error(text, f"unexpected character {text[pos]!r} at position {pos}")
        kind = m.lastgroup
        pos = m.end()
        if kind != "ws":
            out.append((kind, m.group(kind)))
    out.append(("end", ""))
    return out


# ---------------------------------------------------------------------------------------------
# Parser


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.toks = _tokens(text)
        self.i = 0
        self.depth = 0

    def peek(self, offset: int = 0):
        return self.toks[min(self.i + offset, len(self.toks) - 1)]

    def word(self, offset: int = 0) -> str | None:
        kind, value = self.peek(offset)
        return value.lower() if kind == "name" else None

    def take(self):
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def expect(self, kind: str, value: str | None = None):
        tok = self.take()
        if tok[0] != kind or (value is not None and tok[1].lower() != value):
            raise _error(self.text, f"expected {value or kind}, found {tok[1] or 'the end'!r}")
        return tok

    def nest(self):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _error(self.text, f"nested deeper than {MAX_DEPTH} levels")

    def parse(self):
        node = self.filter()
        kind, value = self.peek()
        if kind == "name":
            raise _error(self.text, f"{value.upper()} is not allowed in a row filter")
        if kind != "end":
            raise _error(self.text, f"unexpected {value!r} after a complete filter")
        return node

    def filter(self):
        parts = [self.disjunct()]
        while self.word() == "or":
            self.take()
            parts.append(self.disjunct())
        return parts[0] if len(parts) == 1 else BoolOp("or", tuple(parts))

    def disjunct(self):
        parts = [self.conjunct()]
        while self.word() == "and":
            self.take()
            parts.append(self.conjunct())
        return parts[0] if len(parts) == 1 else BoolOp("and", tuple(parts))

    def conjunct(self):
        if self.word() == "not":
            self.take()
            self.nest()
            node = Not(self.conjunct())
            self.depth -= 1
            return node
        return self.predicate()

    def predicate(self):
        left = self.operand()
        kind, value = self.peek()
        if kind == "op":
            self.take()
            return Compare("=" if value == "==" else ("<>" if value == "!=" else value), left, self.operand())
        negated = False
        if self.word() == "not" and self.word(1) in ("in", "between"):
            self.take()
            negated = True
        w = self.word()
        if w == "in":
            self.take()
            self.expect("punct", "(")
            values = [self.literal_only()]
            while self.peek() == ("punct", ","):
                self.take()
                values.append(self.literal_only())
            self.expect("punct", ")")
            return InList(left, tuple(values), negated)
        if w == "between":
            self.take()
            low = self.operand()
            self.expect("name", "and")
            return Between(left, low, self.operand(), negated)
        if w == "is":
            self.take()
            neg = False
            if self.word() == "not":
                self.take()
                neg = True
            if self.word() != "null":
                raise _error(self.text, f"IS {'NOT ' if neg else ''}must be followed by NULL, found {self.peek()[1] or 'the end'!r}")
            self.take()
            return IsNull(left, neg)
        return left  # a boolean operand on its own (a boolean column, isnan(x), ...)

    def literal_only(self):
        node = self.operand()
        if not isinstance(node, Literal):
            raise _error(self.text, "IN takes literals only (numbers, strings, dates, TRUE/FALSE/NULL)")
        return node

    def operand(self):
        kind, value = self.peek()
        if kind == "punct" and value == "(":
            self.take()
            self.nest()
            node = self.filter()
            self.depth -= 1
            self.expect("punct", ")")
            return node
        if kind == "punct" and value == "-":
            self.take()
            kind2, value2 = self.peek()
            if kind2 != "number":
                raise _error(self.text, "a minus sign is allowed only before a number (no arithmetic on columns)")
            self.take()
            return Literal(_number(self.text, "-" + value2))
        if kind == "number":
            self.take()
            return Literal(_number(self.text, value))
        if kind == "string":
            self.take()
            return Literal(_unescape(self.text, value[1:-1]))
        if kind == "quoted":
            self.take()
            return Column(value[1:-1].replace("``", "`"))
        if kind == "name":
            w = value.lower()
            if w in ("true", "false"):
                self.take()
                return Literal(w == "true")
            if w == "null":
                self.take()
                return Literal(None)
            if w in ("date", "timestamp") and self.peek(1)[0] == "string":
                self.take()
                return Literal(_typed(self.text, w, _unescape(self.text, self.take()[1][1:-1])))
            if self.peek(1) == ("punct", "("):
                return self.call()
            if w in _KEYWORDS:
                raise _error(self.text, f"unexpected keyword {value.upper()}")
            self.take()
            name = value
            if self.peek() == ("punct", ".") and self.peek(1)[0] in ("name", "quoted"):
                raise _error(self.text, f"{value}.{self.peek(1)[1]}: nested fields and qualified names are not allowed; "
                                        "name a top-level column (quote it with backquotes if its name has a dot)")
            return Column(name)
        raise _error(self.text, f"unexpected {value or 'end of the filter'!r}")

    def call(self):
        name = self.take()[1].lower()
        if name not in FUNCTIONS:
            raise _error(self.text, f"the function {name!r} is not allowed in a row filter")
        self.expect("punct", "(")
        self.nest()
        args = [self.operand()]
        while self.peek() == ("punct", ","):
            self.take()
            args.append(self.operand())
        self.expect("punct", ")")
        self.depth -= 1
        low, high = FUNCTIONS[name]
        if not low <= len(args) <= high:
            want = str(low) if low == high else f"{low} to {high}"
            raise _error(self.text, f"{name} takes {want} argument(s), got {len(args)}")
        return Call(name, tuple(args))


def _number(text: str, token: str):
    if re.fullmatch(r"-?\d+", token):
        value = int(token)
        if -(2 ** 63) <= value < 2 ** 63:
            return value
        try:
            return Decimal(token) if len(token.lstrip("-")) <= 38 else _raise(text, f"the number {token} has more than 38 digits")
        except InvalidOperation:
            raise _error(text, f"{token} is not a number") from None
    if "e" in token.lower():
        value = float(token)
        if value != value or value in (float("inf"), float("-inf")):
            raise _error(text, f"the number {token} is not finite")
        return value
    digits = token.lstrip("-").replace(".", "").lstrip("0")
    if len(digits) > 38:
        raise _error(text, f"the number {token} has more than 38 digits")
    return Decimal(token)


def _raise(text, message):
    raise _error(text, message)


def _typed(text: str, kind: str, value: str):
    try:
        if kind == "date":
            return _dt.date.fromisoformat(value)
        parsed = _dt.datetime.fromisoformat(value)
    except ValueError:
        raise _error(text, f"{kind.upper()} {value!r} is not a valid {kind} (ISO 8601: 2026-11-30"
                           f"{'' if kind == 'date' else ' 12:00:00'})") from None
    if parsed.tzinfo is not None:
        raise _error(text, f"TIMESTAMP {value!r}: give the time without a zone (it is read in the session's time zone)")
    return parsed


def parse(text: str):
    """The parse tree of an ``input.where`` filter, or ConfigError naming what is not allowed."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(KEY, "must be a non-empty SQL row filter")
    if len(text) > MAX_LENGTH:
        raise ConfigError(KEY, f"is {len(text)} characters long; at most {MAX_LENGTH}")
    return _Parser(text).parse()


def columns(node) -> set[str]:
    """The column names a parse tree reads."""
    if isinstance(node, Column):
        return {node.name}
    out: set[str] = set()
    for child in _children(node):
        out |= columns(child)
    return out


def _children(node):
    if isinstance(node, Call):
        return node.args
    if isinstance(node, Compare):
        return (node.left, node.right)
    if isinstance(node, InList):
        return (node.operand, *node.values)
    if isinstance(node, Between):
        return (node.operand, node.low, node.high)
    if isinstance(node, (IsNull, Not)):
        return (node.operand,)
    if isinstance(node, BoolOp):
        return node.parts
    return ()


# ---------------------------------------------------------------------------------------------
# Spark: the Column built from the tree, and the check of its analysed form


def resolve(name: str, names) -> str:
    """The table column a filter's ``name`` reads: matched exactly, else case-insensitively as Spark
    would (ConfigError when none or several match)."""
    names = list(names)
    if name in names:
        return name
    folded = [c for c in names if c.lower() == name.lower()]
    if len(folded) != 1:
        raise ConfigError(KEY, f"column {name!r} not found (or ambiguous); the table has columns {sorted(names)}")
    return folded[0]


def to_column(node, column_names):
    """The pyspark Column of a parse tree. ``column_names``: the table's columns (a name is matched
    exactly, else case-insensitively as Spark would; an unknown name is a ConfigError)."""
    from pyspark.sql import functions as F

    names = list(column_names)

    def col(name: str):
        name = resolve(name, names)
        return F.col("`" + name.replace("`", "``") + "`")

    def lit(value):
        if isinstance(value, _dt.datetime):
            return F.lit(value.isoformat(sep=" ")).cast("timestamp")
        if isinstance(value, _dt.date):
            return F.lit(value.isoformat()).cast("date")
        return F.lit(value)

    def build(n):
        if isinstance(n, Column):
            return col(n.name)
        if isinstance(n, Literal):
            return lit(n.value)
        if isinstance(n, Call):
            args = [build(a) for a in n.args]
            fn = {"day": "dayofmonth", "date": "to_date"}.get(n.name, n.name)
            if fn == "timestamp":
                return args[0].cast("timestamp")
            return F.call_function(fn, *args)
        if isinstance(n, Compare):
            a, b = build(n.left), build(n.right)
            return {"=": a == b, "<>": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b,
                    "<=>": a.eqNullSafe(b)}[n.op]
        if isinstance(n, InList):
            c = build(n.operand).isin(*[lit(v.value) for v in n.values])
            return ~c if n.negated else c
        if isinstance(n, Between):
            c = build(n.operand).between(build(n.low), build(n.high))
            return ~c if n.negated else c
        if isinstance(n, IsNull):
            c = build(n.operand)
            return c.isNotNull() if n.negated else c.isNull()
        if isinstance(n, Not):
            return ~build(n.operand)
        if isinstance(n, BoolOp):
            out = build(n.parts[0])
            for p in n.parts[1:]:
                out = (out & build(p)) if n.op == "and" else (out | build(p))
            return out
        raise TypeError(f"not a filter node: {n!r}")

    return build(node)


# Expression classes (Catalyst's simple names) allowed in the analysed filter, besides Cast.
ALLOWED_NODES = {
    "AttributeReference", "Literal", "EqualTo", "EqualNullSafe", "LessThan", "LessThanOrEqual",
    "GreaterThan", "GreaterThanOrEqual", "And", "Or", "Not", "In", "InSet", "IsNull", "IsNotNull",
    "IsNaN", "Coalesce", "Lower", "Upper", "StringTrim", "StringTrimLeft", "StringTrimRight",
    "StartsWith", "EndsWith", "Contains", "Year", "Month", "DayOfMonth", "Hour", "ParseToDate",
    "Between", "Alias", "AtLeastNNonNulls", "SortOrder",
}
# Catalyst type names allowed for any node's value and for a Cast's source and target.
ATOMIC_TYPES = re.compile(r"^(boolean|tinyint|smallint|int|bigint|float|double|decimal\(\d+,\d+\)|string|"
                          r"char\(\d+\)|varchar\(\d+\)|binary|date|timestamp|timestamp_ntz|void)$")


def check_analysed(df, text: str) -> None:
    """Verify, before the charge, that the analysed filter of ``df`` (a ``Filter`` on top of the
    table's plan) is made of total nodes only: allowed classes, atomic types, non-ANSI casts
    between atomic types. A no-op where the plan cannot be inspected (Spark Connect, where
    ``apply`` pins ANSI off and runs ``connect_problem`` instead: see ``apply_connect``)."""
    try:
        plan = df._jdf.queryExecution().analyzed()
    except Exception:
        return
    if plan.getClass().getSimpleName() != "Filter":
        raise _error(text, f"the analysed plan is a {plan.getClass().getSimpleName()}, not a row filter")
    problem = total_expression_problem(plan.condition())
    if problem is not None:
        raise _error(text, problem)


_INTEGRAL_WIDTH = {"tinyint": 1, "smallint": 2, "int": 3, "bigint": 4}


def _never_fails(source: str, target: str) -> bool:
    """An ANSI cast that cannot raise whatever the value: to a string, an integral type to a floating
    one or to a wider integral one, float to double, a date to a timestamp, a type to itself."""
    if source == target or target == "string" or source == "void":
        return True
    if target == "double" and (source in _INTEGRAL_WIDTH or source == "float"):
        return True
    if target == "float" and source in _INTEGRAL_WIDTH:
        return True
    if source in _INTEGRAL_WIDTH and target in _INTEGRAL_WIDTH:
        return _INTEGRAL_WIDTH[target] >= _INTEGRAL_WIDTH[source]
    return source == "date" and target in ("timestamp", "timestamp_ntz")


def total_expression_problem(expr, allowed_udfs=()) -> str | None:
    """Why the analysed Catalyst expression ``expr`` (a py4j object) could raise on some row value,
    or None when every node is total: a class of ``ALLOWED_NODES`` with an atomic type, an
    attribute (passed through, never evaluated), or a non-ANSI Cast between atomic types.
    ``allowed_udfs``: ScalaUDF nodes (by identity) the caller has proven total, e.g. a
    VectorAssembler whose inputs are filtered for nulls and NaN."""
    stack = [expr]
    while stack:
        node = stack.pop()
        kind = node.getClass().getSimpleName()
        if kind == "AttributeReference":
            continue
        if kind == "Alias":  # a name for its child, whatever the child's type; the child is checked
            stack.append(node.child())
            continue
        if kind == "ScalaUDF" and any(node.equals(u) for u in allowed_udfs):
            continue  # its children (a struct of attributes) are what the caller checked
        type_name = str(node.dataType().simpleString()) if node.resolved() else "?"
        if not ATOMIC_TYPES.match(type_name):
            return f"a value of type {type_name} ({kind}) is computed"
        if kind == "Cast":
            source = str(node.child().dataType().simpleString())
            mode = str(node.evalMode().toString())
            if (mode == "ANSI" and not _never_fails(source, type_name)) or not ATOMIC_TYPES.match(source):
                return f"the implicit cast from {source} to {type_name} ({mode}) could fail on a row"
        elif kind not in ALLOWED_NODES:
            return f"{kind} is not allowed (only expressions that cannot raise on a value are)"
        children = node.children().iterator()
        while children.hasNext():
            stack.append(children.next())
    return None


def apply(spark, df, text: str):
    """``df`` filtered by ``input.where`` (parsed, built, analysed with ANSI off and checked; see
    the module docstring). Every error is a ConfigError on ``input.where``, raised before any charge.
    On a Spark Connect session: ``apply_connect`` (ANSI pinned off for the rest of the session)."""
    from dpspark.session import is_connect

    if is_connect(spark):
        return apply_connect(spark, df, text)
    node = parse(text)
    condition = to_column(node, df.columns)
    saved = spark.conf.get("spark.sql.ansi.enabled", None)
    spark.conf.set("spark.sql.ansi.enabled", "false")
    try:
        try:
            filtered = df.where(condition)
        except ConfigError:
            raise
        except Exception as exc:
            raise _error(text, f"not a valid predicate on this table ({str(exc).splitlines()[0][:300]})") from None
        check_analysed(filtered, text)
        return filtered
    finally:
        if saved is None:
            spark.conf.unset("spark.sql.ansi.enabled")
        else:
            spark.conf.set("spark.sql.ansi.enabled", saved)


# ---------------------------------------------------------------------------------------------
# Spark Connect: the same guarantee, pinned instead of inspected

ANSI_KEY = "spark.sql.ansi.enabled"
_STRING_TESTS = ("startswith", "endswith", "contains")
_CLASSIC_ADVICE = ("run this config on a classic session (`dpspark run` locally or with spark-submit, against the "
                   "same ledger), or without input.where. Do not copy the rows into a table of their own: it would "
                   "get a second, fresh balance for the same people")
# A constant row (no private value) whose implicit cast raises under ANSI mode and gives NULL without it.
PROBE_VALUE = "not a number"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


def _may_be_binary(node, types: dict) -> bool:
    """Whether the operand ``node`` may have type binary: a binary column, or a coalesce with such an
    argument (Spark's common type of binary and string is binary). Literals never are (the grammar has
    no binary literal; NULL is void), and every other function returns a string, a number, a date,
    a timestamp or a boolean."""
    if isinstance(node, Column):
        return types[node.name] == "binary"
    if isinstance(node, Call) and node.name == "coalesce":
        return any(_may_be_binary(a, types) for a in node.args)
    return False


def connect_problem(node, column_types) -> str | None:
    """Why the filter ``node`` is refused on a Spark Connect session (where ``check_analysed`` cannot
    run), or None. ``column_types``: (name, Spark type ``simpleString``) of each table column, from
    its schema: metadata, never a row. Pure Python (tested without Spark Connect). Unknown or
    ambiguous names are ConfigErrors, as in ``to_column``.

    - Every column the filter reads has an atomic type (``ATOMIC_TYPES``). The grammar's literals
      are atomic and its functions compute atomic values from atomic ones, so every value in the
      analysed filter is atomic and every implicit cast Spark adds goes between atomic types (never
      to or from an interval, array, map, struct, variant or collated string): with ANSI off each
      of those returns NULL on a value it cannot convert. Stricter than the classic check, which
      lets an attribute of any type through when nothing computes on it (``struct_col IS NULL``).
    - ``startswith``/``endswith``/``contains`` never take two values that may be binary: Spark's
      builder makes those a ``BinaryPredicate`` (a StaticInvoke), which the classic check refuses;
      with any other argument types they are ``StartsWith``/``EndsWith``/``Contains`` over strings.
      These are the only builders of ``FUNCTIONS`` whose node depends on the argument types
      (tests/test_where_filter.py compares this function with ``check_analysed`` over every
      construct and column type)."""
    pairs = [(str(n), str(t)) for n, t in column_types]
    names = [n for n, _ in pairs]
    types: dict = {}
    for name in sorted(columns(node)):
        resolved = resolve(name, names)
        type_name = dict(pairs)[resolved]
        if not ATOMIC_TYPES.match(type_name):
            return (f"column {resolved!r} has type {type_name}: on a Spark Connect session a row filter reads "
                    f"only columns of atomic types (numbers, strings, binary, booleans, dates, timestamps)")
        types[name] = type_name
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, Call) and n.name in _STRING_TESTS and all(_may_be_binary(a, types) for a in n.args):
            return (f"{n.name} of two binary values is not allowed (Spark makes it a BinaryPredicate; only "
                    f"expressions that cannot raise on a value are): compare a binary column with a string instead")
        stack.extend(_children(n))
    return None


def pin_non_ansi(spark) -> None:
    """Set ``spark.sql.ansi.enabled=false`` on the Spark Connect session ``spark`` for the rest of its
    life (never put back: see ``apply_connect``) and verify that its server keeps it: the setting is
    read back, then a probe on a constant row (``'not a number' = 1``, no private value) must give
    NULL instead of raising. ConfigError on input.where, before any charge, otherwise."""
    from pyspark.sql import functions as F

    try:
        spark.conf.set(ANSI_KEY, "false")
        seen = spark.conf.get(ANSI_KEY)
    except Exception as exc:
        raise ConfigError(KEY, f"needs {ANSI_KEY}=false on this Spark Connect session, and its server refused the "
                               f"setting ({_first_line(exc)}): {_CLASSIC_ADVICE}") from None
    if str(seen).strip().lower() != "false":
        raise ConfigError(KEY, f"needs {ANSI_KEY}=false on this Spark Connect session, and its server reads back "
                               f"{seen!r} after it was set: {_CLASSIC_ADVICE}")
    try:
        probe = spark.createDataFrame([(PROBE_VALUE,)], "s string").select((F.col("s") == F.lit(1)).alias("c"))
        rows = [tuple(r) for r in probe.collect()]
    except Exception as exc:
        rows = f"it raised {_first_line(exc)}"
    if rows != [(None,)]:
        raise ConfigError(KEY, f"needs {ANSI_KEY}=false on this Spark Connect session, and its server still casts "
                               f"with ANSI mode on ({PROBE_VALUE!r} = 1 gave {rows!r}, not NULL): {_CLASSIC_ADVICE}")


def apply_connect(spark, df, text: str):
    """``apply`` on a Spark Connect session: ``df`` filtered by ``input.where``, every error a
    ConfigError on ``input.where`` raised before any charge. Leaves the session with ANSI mode OFF.

    What the classic path proves on the analysed plan, and how it is proven here:

    1. The casts Spark adds are non-ANSI (NULL, never an error, on a value they cannot convert). A
       Connect server analyses the plan again at every action, with its session's settings at that
       moment (measured: the same DataFrame raised on 'abc' after ANSI was switched back on, and no
       longer raised once it was off again). So ANSI is set off on THIS session and never put back
       (the filtered DataFrame is executed by the fit after the charge; dpspark's CLI builds one
       session per run, which ends with it). The server keeps settings per session (another
       session on the same server keeps its own: measured), only dpspark's process knows the
       session's id, dpspark sets ``spark.sql.ansi.*`` nowhere else and a job config may not
       (``dpspark.config``); a server restarted under the run has a new server-side session id,
       which the client refuses (it sends the id it observed; INVALID_HANDLE.SESSION_CHANGED): the
       run then fails whatever the rows. ``pin_non_ansi`` reads the
       setting back and probes it on a constant row, before the charge: a server that does not keep
       it refuses the filter. The explicit casts of ``to_date``/``date``/``timestamp`` and of
       DATE/TIMESTAMP literals are planned with the session's setting too. No other setting makes
       a non-ANSI cast or a comparison raise: ``spark.sql.storeAssignmentPolicy`` applies to table
       writes only, the other ``spark.sql.ansi.*`` settings to the parsing of SQL text (which this
       Column never is), ``spark.sql.legacy.timeParserPolicy`` to datetime patterns (the grammar
       has none; one-argument ``to_date`` is a cast), and the rest of ``spark.sql.legacy.*`` is
       the deployment's on both kinds of session (a job config may not set it). The pin also holds
       for the rest of the run's plans (the fit, the ledger), which dpspark writes to run with
       ANSI mode on or off alike: a deployment may set either.
    2. Every value is atomic and every cast goes between atomic types: every column the filter reads
       has an atomic type in the table's schema (metadata), see ``connect_problem``.
    3. Every node is of an allowed kind: the Column is built from the parse tree, so its nodes are
       the grammar's comparisons, AND/OR/NOT, IN, IS NULL and the calls of ``FUNCTIONS``, resolved
       by the server as Spark's built-in functions (a temporary function of the same name never
       shadows a built-in: measured with a Python UDF registered as ``lower``), plus the implicit
       casts of 1. The one built-in whose node depends on its argument types is refused from the
       column types (``connect_problem``: a BinaryPredicate).
    4. The Filter itself is analysed by the server now (``semanticHash``: analysis only, never
       optimized or run, no row read), so a filter Spark cannot analyse on this table is refused
       here, not at the fit's first action after the charge. Not ``schema``: the Connect client gives
       a filter its child's cached schema without asking the server (measured: filters that do not
       analyse passed it).

    Not used: the server's explain string. It carries no cast's evaluation mode, its text does not
    delimit literals, and producing it optimizes and plans the query, which evaluates the filter on
    values (a local relation's rows, and for a table its partition values and file statistics):
    measured on a local relation, an extended explain under ANSI mode raised the rows' cast error."""
    node = parse(text)
    fields = [(f.name, f.dataType.simpleString()) for f in df.schema.fields]
    problem = connect_problem(node, fields)
    if problem is not None:
        raise _error(text, problem)
    pin_non_ansi(spark)
    condition = to_column(node, [name for name, _ in fields])
    try:
        filtered = df.where(condition)
        filtered.semanticHash()  # the server analyses the Filter now (ANSI off): refused before the charge if it cannot
    except ConfigError:
        raise
    except Exception as exc:
        raise _error(text, f"not a valid predicate on this table ({_first_line(exc)})") from None
    return filtered
