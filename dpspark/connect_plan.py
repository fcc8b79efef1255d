"""Where a Spark Connect DataFrame's rows come from: ``check_reads_only`` (``DPClustering`` with a ledger).

A fit with a ledger is charged to ONE table's budget, ``ledgerInput``, so it must prove that every
row of the DataFrame comes from that table (``dpspark.lineage`` for a classic session, where the
analysed JVM plan is walked). A Spark Connect client has no analysed plan: it holds the
UNRESOLVED plan it sends (a ``spark.connect.Relation`` protobuf message, ``df._plan.plan(client)``),
which the server analyses anew at every action. Its nodes name what the user called (select,
filter, union, ...) with unresolved expressions, so only a shape whose meaning needs no analysis
can be proven, and only that shape is accepted:

    spark.read.format("delta").load(P)           ONE read: a path, no schema, no option, not a stream
    then any number of, in any order:
      .select(plain columns)                     "x", col("x"), df["x"] of this chain, .alias(...), "*"
      VectorAssembler(inputCols=[numeric columns], outputCol=..., handleInvalid="skip").transform(...)

and P must be ledgerInput itself: ``DESCRIBE DETAIL`` of both (the server resolves both paths as
it resolves the read) gives the same table id and location, and every file the read lists
(``inputFiles``) lies under that location (a SHALLOW CLONE lists its source's files).

Why this shape is safe: each step maps one row of the table to at most one row (a projection keeps
it; the assembler keeps or drops it) and evaluates nothing that can raise on a value (a column
reference is passed through; the assembler with handleInvalid='skip' drops a row with a null or
NaN input instead of raising, and its inputs are numeric columns, so nothing is cast). So every
row comes from one record of ledgerInput, and a failure after the charge cannot depend on one
record's value.

Everything else is refused with a ``LineageError`` that says how to pass the features instead
(``inputCols``; dpspark drops rows with a null, NaN or infinite feature itself), in particular:
any filter, withColumn, expression or cast (an expression's meaning, and whether it can raise, is
known only after analysis), union, join, createDataFrame, range, SQL, a named table, another
table, a parquet read of the table's files, Delta's change data feed, metadata columns, any read
option. Time travel (``versionAsOf``, ``timestampAsOf``) is refused too: a ``REPLACE TABLE ... AS
SELECT`` gives a table a new id, so an older version may be the rows of another table with a
balance of its own, and a Connect client cannot read the id of an older version (the classic
check reads it from the version's snapshot).

The check reads no row: plans, ``DESCRIBE DETAIL``, the read's schema and its file listing, before
anything is charged. Without a ledger nothing is checked (as on a classic session).
"""

from __future__ import annotations

from dpspark.errors import LineageError

ASSEMBLER = "org.apache.spark.ml.feature.VectorAssembler"
_ASSEMBLER_PARAMS = {"inputCols", "outputCol", "handleInvalid"}

_SHAPE = ("on a Spark Connect session only this lineage can be checked: spark.read.format('delta').load({path!r}), "
          "then select() of plain columns and VectorAssembler(inputCols=[...], outputCol=..., handleInvalid='skip'); "
          "select the feature columns and pass them as inputCols=[...] (dpspark drops rows with a null, NaN or "
          "infinite feature itself), or fit on a classic session, which checks more transformations")


def _refuse(found: str, ledger_input: str) -> LineageError:
    return LineageError(f"the DataFrame has {found}: a fit is charged to the budget of ledgerInput={ledger_input!r} "
                        f"alone, so every row must provably come from that table; " + _SHAPE.format(path=ledger_input))


def _other_table(found: str, ledger_input: str) -> LineageError:
    return LineageError(f"the DataFrame reads {found}, not only the table ledgerInput={ledger_input!r}: a fit is "
                        f"charged to ledgerInput's budget alone, so every row must come from that table; "
                        + _SHAPE.format(path=ledger_input))


def _plain_name(identifier: str) -> str | None:
    """The column name an unparsed identifier names when it is ONE name (``x``, or ```a.b``` with
    backquotes doubled inside), else None (a nested field ``a.b``, a qualified name, a quoting
    mistake)."""
    if len(identifier) >= 2 and identifier.startswith("`") and identifier.endswith("`"):
        inner = identifier[1:-1]
        if inner.replace("``", "").count("`"):
            return None
        return inner.replace("``", "`")
    if not identifier or "." in identifier or "`" in identifier:
        return None
    return identifier


def _param_string(value) -> str | None:
    return value.string if value.WhichOneof("literal_type") == "string" else None


_CLIENT_ROWS = ("local_relation", "cached_local_relation", "chunked_cached_local_relation")
# What a refusal calls a step of the plan (the Relation's rel_type); others are named by their type.
_STEPS = {
    "filter": "a filter (where)", "with_columns": "a withColumn", "with_columns_renamed": "a withColumnRenamed",
    "set_op": "a union/intersect/except", "join": "a join", "to_df": "a toDF", "aggregate": "an aggregate",
    "range": "spark.range (generated rows)", "sql": "a SQL query", "with_relations": "a SQL query",
    "ml_relation": "an ML step other than a transformer (a fitted model's output?)",
    **{kind: "rows held by the client (createDataFrame)" for kind in _CLIENT_ROWS},
}


def _chain(rel, ledger_input: str):
    """The steps from the DataFrame down to its read: [(kind, relation)], the read last."""
    steps = []
    while True:
        kind = rel.WhichOneof("rel_type")
        steps.append((kind, rel))
        if kind == "project":
            rel = rel.project.input
        elif (kind == "ml_relation" and rel.ml_relation.WhichOneof("ml_type") == "transform"
              and rel.ml_relation.transform.WhichOneof("operator") == "transformer"):
            rel = rel.ml_relation.transform.input
        elif kind == "read":
            return steps
        else:
            what = _STEPS.get(kind, f"a {kind} step")
            if kind not in _CLIENT_ROWS and any(type(m).__name__ == "Relation" and m.WhichOneof("rel_type") in _CLIENT_ROWS
                                                for m in _messages(rel)):
                what += " over rows held by the client (createDataFrame)"
            raise _refuse(what, ledger_input)


def _check_read(read, ledger_input: str) -> str:
    """The path of a plain Delta read (see the module docstring), or LineageError."""
    if read.WhichOneof("read_type") != "data_source":
        raise _refuse("a read of a named table (spark.read.table / a catalog name)", ledger_input)
    if read.is_streaming:
        raise _refuse("a streaming read", ledger_input)
    source = read.data_source
    fmt = source.format.lower() if source.HasField("format") else ""
    options = sorted(source.options)
    if fmt != "delta":
        raise _other_table(f"a {fmt or 'default-format'} read of {list(source.paths)}", ledger_input)
    if source.schema or len(source.paths) != 1 or list(source.predicates) or options:
        what = (f"read options {options} (time travel and other options cannot be checked there)" if options
                else f"a Delta read of {len(source.paths)} paths, or with a schema or predicates")
        raise _refuse(what, ledger_input)
    return source.paths[0]


def _same_table(spark, path: str, ledger_input: str):
    """A DataFrame of the read of ``path`` when that is the Delta table ledgerInput, else LineageError."""
    from dpspark import tables

    theirs = tables._delta_detail(spark, tables.qualify(ledger_input))
    if theirs is None:
        raise _refuse(f"ledgerInput={ledger_input!r}, which is not a Delta table (on Spark Connect only a Delta "
                      "ledgerInput can be checked)", ledger_input)
    try:
        mine = tables._delta_detail(spark, path)
    except Exception as exc:  # not a path Delta resolves as a table (a relative path, another file system)
        raise _other_table(f"the path {path!r}, which DESCRIBE DETAIL cannot resolve ({tables._first_line(exc)})",
                           ledger_input) from None
    if mine is None or mine[0] != theirs[0] or mine[1].rstrip("/") != theirs[1].rstrip("/"):
        raise _other_table(f"the Delta table at {path!r} (table id and location {mine}; ledgerInput's: {theirs})",
                           ledger_input)
    scan = spark.read.format("delta").load(path)
    root = theirs[1].rstrip("/") + "/"
    outside = [f for f in scan.inputFiles() if not str(f).startswith(root)]
    if outside:
        raise _other_table(f"the file {str(outside[0])!r}, outside ledgerInput's folder (a Delta shallow clone reads "
                           f"the files of the table it was cloned from)", ledger_input)
    return scan


def _project_columns(project, columns: dict, chain_ids: set, ledger_input: str) -> dict:
    """The columns (name -> data type, None when ambiguous) after a projection of plain columns."""
    out: dict = {}

    def add(name, dtype):
        out[name] = None if name in out else dtype

    for expr in project.expressions:
        kind = expr.WhichOneof("expr_type")
        name = None
        if kind == "alias":
            if len(expr.alias.name) != 1 or expr.alias.HasField("metadata"):
                raise _refuse("an alias with several names or with metadata", ledger_input)
            name = expr.alias.name[0]
            expr = expr.alias.expr
            kind = expr.WhichOneof("expr_type")
        if kind == "unresolved_star":
            star = expr.unresolved_star
            if name is not None or star.HasField("unparsed_target") or star.HasField("plan_id"):
                raise _refuse("a qualified star (df['*'] or t.*)", ledger_input)
            for column, dtype in columns.items():
                add(column, dtype)
            continue
        if kind != "unresolved_attribute":
            raise _refuse(f"an expression ({kind}) in a select: only plain column references can be checked",
                          ledger_input)
        attribute = expr.unresolved_attribute
        if attribute.is_metadata_column or (attribute.HasField("plan_id") and attribute.plan_id not in chain_ids):
            raise _other_table("a column of another DataFrame, or a metadata column", ledger_input)
        column = _plain_name(attribute.unparsed_identifier)
        if column is None or column not in columns or columns[column] is None:
            raise _refuse(f"the column reference {attribute.unparsed_identifier!r}, which is not one plain column of "
                          "the step below it", ledger_input)
        add(column if name is None else name, columns[column])
    return out


def _assembler_columns(transform, columns: dict, ledger_input: str) -> dict:
    """The columns after a VectorAssembler with handleInvalid='skip' over numeric columns, else LineageError."""
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import types as T

    name = transform.transformer.name
    params = dict(transform.params.params.items())
    if name != ASSEMBLER:
        raise _refuse(f"the ML transformer {name} (only VectorAssembler can be checked)", ledger_input)
    handle = _param_string(params["handleInvalid"]) if "handleInvalid" in params else None
    if handle != "skip":
        raise _refuse(f"a VectorAssembler with handleInvalid={handle or 'error (its default)'!r} (only 'skip' is "
                      "checked: 'error' fails the fit on one record's null or NaN value)", ledger_input)
    if set(params) - _ASSEMBLER_PARAMS or "inputCols" not in params:
        raise _refuse(f"a VectorAssembler with the params {sorted(params)}", ledger_input)
    inputs = params["inputCols"]
    if inputs.WhichOneof("literal_type") != "array":
        raise _refuse("a VectorAssembler whose inputCols is not a list of names", ledger_input)
    for element in inputs.array.elements:
        column = _param_string(element)
        if column is None or column not in columns or not isinstance(columns[column], T.NumericType):
            raise _refuse(f"a VectorAssembler input {column!r} that is not one numeric column of the step below it",
                          ledger_input)
    output = _param_string(params["outputCol"]) if "outputCol" in params else f"{transform.transformer.uid}__output"
    if output is None or output in columns:
        raise _refuse(f"a VectorAssembler output column {output!r} that is not a new name", ledger_input)
    return {**columns, output: VectorUDT()}


def check_reads_only(dataset, ledger_input: str) -> None:
    """Refuse (``LineageError``) a Spark Connect DataFrame that is not provably rows of the Delta table
    ``ledger_input`` (see the module docstring)."""
    spark = dataset.sparkSession
    steps = _chain(dataset._plan.plan(spark.client), ledger_input)
    path = _check_read(steps[-1][1].read, ledger_input)
    scan = _same_table(spark, path, ledger_input)
    columns = {field.name: field.dataType for field in scan.schema.fields}
    chain_ids = {rel.common.plan_id for _, rel in steps if rel.HasField("common") and rel.common.HasField("plan_id")}
    for kind, rel in reversed(steps[:-1]):  # from the read up
        if kind == "project":
            columns = _project_columns(rel.project, columns, chain_ids, ledger_input)
        else:
            columns = _assembler_columns(rel.ml_relation.transform, columns, ledger_input)


def _messages(message):
    """``message`` and every protobuf message inside it (fields, repeated fields, map values), depth first."""
    from google.protobuf.message import Message

    stack = [message]
    while stack:
        current = stack.pop()
        yield current
        for _, value in current.ListFields():
            if isinstance(value, Message):
                stack.append(value)
            elif not isinstance(value, (str, bytes, int, float, bool)):  # a repeated field or a map
                items = value.values() if hasattr(value, "values") else value
                stack.extend(v for v in items if isinstance(v, Message))


def assemblers_that_raise(dataset) -> int:
    """How many VectorAssembler steps of a Spark Connect DataFrame's plan fail on a null or NaN input
    (handleInvalid 'error', its default; 'keep' and 'skip' do not). For the warning before a fit
    without a ledger; 0 when the plan cannot be read."""
    try:
        found = 0
        for message in _messages(dataset._plan.plan(dataset.sparkSession.client)):
            if type(message).__name__ != "Transform" or not hasattr(message, "transformer"):
                continue
            if not message.HasField("transformer") or message.transformer.name != ASSEMBLER:
                continue
            params = dict(message.params.params.items())
            handle = _param_string(params["handleInvalid"]) if "handleInvalid" in params else "error"
            found += handle not in ("skip", "keep")
        return found
    except Exception:
        return 0
