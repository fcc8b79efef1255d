"""Where a DataFrame's rows come from: ``check_reads_only`` (``DPClustering`` with a privacy ledger).

A fit with a ledger is charged to the balance of ONE table, ``ledgerInput``. A DataFrame has no path
of its own, so the fit walks its analysed logical plan (``dataset._jdf.queryExecution().analyzed()``,
through py4j) and accepts it only when every leaf is a file scan of that table:

- ledgerInput is a Delta table: each leaf is Delta's own scan (a ``LogicalRelation`` over Delta's
  ``HadoopFsRelation`` with a ``TahoeLogFileIndex``) whose table root canonicalises to ledgerInput's
  and whose table id (the ledger key) is ledgerInput's. Time travel (``versionAsOf``) is the same table.
- ledgerInput is a Parquet/CSV folder: each leaf is a non-Delta file scan whose root paths lie in it.
- Every file each accepted scan lists lies under ledgerInput's root (a Delta SHALLOW CLONE lists the
  files of the table it was cloned from: refused).

Anything else is refused: rows held by the driver (``LocalRelation``: ``createDataFrame``, a
``toPandas`` round trip), an RDD (``LogicalRDD``: ``checkpoint``, ``localCheckpoint``, ``.rdd``),
``spark.range``, ``SELECT`` without ``FROM``, a scan of another table (join, union), Delta's change
data feed, a non-file source, and any subquery in an expression (even over ledgerInput: a row would
then depend on other rows or tables). Cached data (``InMemoryRelation``) is checked through the plan
it caches and refused when that plan is unknown. ``df.cache()`` keeps the analysed plan, so a cached
scan of the table passes. Between the scans and the fit, only row-wise steps (``_ROW_WISE``: select, filter, sample,
repartition, sort, limit, distinct) whose expressions cannot raise on any value
(``dpspark.rowfilter.total_expression_problem``; a VectorAssembler only with handleInvalid='skip') are
accepted: a union, join, explode, window, aggregate or Python map would give one record the influence of
several rows, and an expression that can raise would make the fit's failure, after the charge, depend
on one record.

A Spark Connect DataFrame has no analysed plan on the client: ``check_reads_only`` hands it to
``dpspark.connect_plan``, which checks its unresolved plan and accepts only the simplest lineage (a
Delta read of ledgerInput, plain column selections, VectorAssembler(handleInvalid='skip')). The
check reads no row (only plans, the Delta log and file listings), before anything is charged.
"""

from __future__ import annotations

from dpspark.errors import LineageError

_HOW_TO = ("read the table with spark.read.format('delta').load({path!r}) (parquet/csv for such a folder) and "
           "transform that DataFrame (select, filter, withColumn, VectorAssembler); do not go through toPandas/"
           "createDataFrame, checkpoint/localCheckpoint, an RDD, or join/union/subqueries with other data")

_WHAT = {
    "LocalRelation": "rows held by the driver (spark.createDataFrame of pandas/Python data, e.g. a toPandas "
                     "round trip)",
    "LogicalRDD": "an RDD (checkpoint()/localCheckpoint(), or a DataFrame built from an RDD)",
    "ExternalRDD": "an RDD (a DataFrame built from an RDD)",
    "Range": "spark.range (generated rows)",
    "OneRowRelation": "a row without a table (SELECT without FROM)",
    "InMemoryRelation": "cached data whose origin is unknown",
}


def _class_name(obj) -> str:
    return str(obj.getClass().getName())


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _is_a(obj, class_name: str) -> bool:
    """``obj`` is an instance of the JVM class ``class_name`` (by its superclass chain)."""
    c = obj.getClass()
    while c is not None:
        if str(c.getName()) == class_name:
            return True
        c = c.getSuperclass()
    return False


def _seq(scala_seq) -> list:
    return [scala_seq.apply(i) for i in range(scala_seq.size())]


def _analyzed_plan(dataset):
    try:
        jdf = getattr(dataset, "_jdf", None)
    except Exception:  # Spark Connect raises its own AttributeError kinds
        jdf = None
    if jdf is None:
        raise LineageError(
            f"the DataFrame ({type(dataset).__module__}.{type(dataset).__name__}) has no JVM plan to check "
            "(Spark Connect?): with a privacy ledger the fit must verify that the DataFrame reads ledgerInput "
            "alone, which needs a classic (py4j) SparkSession; fit in a classic session, or run `dpspark run`")
    return jdf.queryExecution().analyzed()


def _under(spark, file_path: str, root: str) -> bool:
    from dpspark import tables

    prefix = root.rstrip("/") + "/"
    text = str(file_path)
    if tables.local_path(text) is None:  # already qualified by Spark: no py4j call per file when it matches
        scheme, sep, rest = text.partition("://")
        lowered = scheme.lower() + sep + rest
        if lowered == root or lowered.startswith(prefix):
            return True
    canonical = tables.canonical_path(spark, text)
    return canonical == root or canonical.startswith(prefix)


def _refuse(found: str, ledger_input: str) -> LineageError:
    return LineageError(f"the DataFrame reads {found}, not only the table ledgerInput={ledger_input!r}: a fit is "
                        f"charged to ledgerInput's budget alone, so every row must come from that table; "
                        + _HOW_TO.format(path=ledger_input))


def _check_scan(spark, node, ledger_input: str, root: str, table_id: str | None, checked: list) -> None:
    """One ``LogicalRelation`` leaf: a file scan of ledgerInput, or LineageError. ``checked``: the file
    indexes already checked (a plan that reads the table twice lists its files once)."""
    from dpspark import tables

    relation = node.relation()
    relation_class = _class_name(relation)
    if not _is_a(relation, "org.apache.spark.sql.execution.datasources.HadoopFsRelation"):
        if "CDF" in relation_class or "CDC" in relation_class:
            raise _refuse(f"Delta's change data feed ({_short(relation_class)})", ledger_input)
        raise _refuse(f"a relation that is not a file table ({_short(relation_class)})", ledger_input)
    location = relation.location()
    is_delta = _is_a(location, "org.apache.spark.sql.delta.files.TahoeLogFileIndex")
    if is_delta:
        data_path = str(location.dataPath().toString())
        scan_root = tables.canonical_path(spark, data_path)
        try:
            scan_id = str(location.getSnapshot().metadata().id())
        except Exception:  # another Delta version: the log's current snapshot
            scan_id = str(location.deltaLog().unsafeVolatileSnapshot().metadata().id())
        if table_id is None:
            raise _refuse(f"the Delta table {data_path!r} (ledgerInput is not a Delta table)", ledger_input)
        if scan_root != root or scan_id != table_id:
            raise _refuse(f"the Delta table {data_path!r} (table id {scan_id}; ledgerInput's table is {root!r}, "
                          f"id {table_id})", ledger_input)
    else:
        if _short(_class_name(location)).startswith("Tahoe"):
            raise _refuse(f"a Delta file index of another kind ({_short(_class_name(location))})", ledger_input)
        roots = [str(p.toString()) for p in _seq(location.rootPaths())]
        fmt = _short(_class_name(relation.fileFormat()))
        outside = [r for r in roots if not _under(spark, r, root)]
        if outside:
            raise _refuse(f"{fmt} files at {outside[0]!r}", ledger_input)
        if table_id is not None:
            raise _refuse(f"the files of the Delta table ledgerInput read as {fmt} (that also reads rows the table "
                          f"has removed; read it as Delta)", ledger_input)
    if any(location.equals(seen) for seen in checked):
        return
    checked.append(location)
    outside_files = [f for f in location.inputFiles() if not _under(spark, f, root)]
    if outside_files:
        raise _refuse(f"the file {str(outside_files[0])!r}, outside ledgerInput's folder (a Delta shallow clone "
                      f"reads the files of the table it was cloned from)", ledger_input)


# Plan nodes allowed between the scan and the fit: each maps one input row to at most one output row
# (never several: no union, join, explode, window or aggregate, which would give one record the
# influence of several or of a group), and their expressions are checked to be total.
_ROW_WISE = {"Project", "Filter", "SubqueryAlias", "Repartition", "RepartitionByExpression", "Sample",
             "ResolvedHint", "Sort", "LocalLimit", "GlobalLimit", "WithCTE", "CTERelationDef", "View",
             "Deduplicate", "Distinct"}
_ROW_WISE_WHY = ("between the table and the fit only row-wise steps are allowed (select, filter, withColumn with "
                 "expressions that cannot raise, sample, repartition, VectorAssembler(handleInvalid='skip')): a {what} "
                 "could give one record the weight of several rows, or fail after the charge because of one record's "
                 "value; pass the feature columns as inputCols (dpspark drops rows with a null, NaN or infinite "
                 "feature itself), and compute derived columns in the table you charge")
_ROW_WISE_HOW = " (read ledgerInput with spark.read.format('delta').load({path!r}) and apply row-wise steps only)"


def _vector_assemblers_proven_total(project, children) -> list:
    """The VectorAssembler UDFs of ``project`` that cannot raise: its input columns are filtered just
    below by ``na.drop`` (``AtLeastNNonNulls`` over all of them: what handleInvalid='skip' plans), so it
    never sees a null or NaN (with 'error' it raises on them; 'keep' cannot be told apart from 'error'
    in the plan, so it is refused)."""
    if len(children) != 1 or _short(_class_name(children[0])) != "Filter":
        return []
    condition = children[0].condition()
    if _short(_class_name(condition)) != "AtLeastNNonNulls":
        return []
    filtered = _seq(condition.children())
    if int(condition.n()) != len(filtered):
        return []
    filtered_ids = {str(a.exprId()) for a in filtered if _short(_class_name(a)) == "AttributeReference"}
    proven = []
    stack = _seq(project.expressions())
    while stack:
        e = stack.pop()
        if _short(_class_name(e)) == "ScalaUDF" and "VectorAssembler" in _class_name(e.function()):
            inputs, inner = [], _seq(e.children())
            while inner:
                x = inner.pop()
                if _short(_class_name(x)) == "AttributeReference":
                    inputs.append(str(x.exprId()))
                else:
                    inner.extend(_seq(x.children()))
            if inputs and set(inputs) <= filtered_ids:
                proven.append(e)
            continue
        stack.extend(_seq(e.children()))
    return proven


def _check_transformation(node, short: str, children, ledger_input: str) -> None:
    """A plan node between the scan and the fit: row-wise, with total expressions (see ``_ROW_WISE``)."""
    from dpspark import rowfilter

    if short == "Sample" and bool(node.withReplacement()):  # a row drawn several times: several rows of one record
        short = "Sample with replacement"
    if short not in _ROW_WISE:
        raise LineageError(f"the DataFrame's plan has a {short} step: " + _ROW_WISE_WHY.format(what=short)
                           + _ROW_WISE_HOW.format(path=ledger_input))
    allowed_udfs = _vector_assemblers_proven_total(node, children) if short == "Project" else []
    for expression in _seq(node.expressions()):
        problem = rowfilter.total_expression_problem(expression, allowed_udfs)
        if problem is not None:
            raise LineageError(f"the DataFrame's plan has a {short} step in which {problem}: "
                               + _ROW_WISE_WHY.format(what="step that can raise") + _ROW_WISE_HOW.format(path=ledger_input))


def assemblers_that_raise(dataset) -> int:
    """How many VectorAssembler steps of ``dataset``'s plan can raise on a null or NaN input column
    (handleInvalid 'error', its default, or 'keep', which the plan cannot tell apart): such a row
    fails the fit once it has started. Best effort, for a warning before a fit WITHOUT a ledger (with
    one, ``check_reads_only`` refuses them): 0 when the plan cannot be read. On Spark Connect:
    ``dpspark.connect_plan.assemblers_that_raise`` (there 'keep' is told apart and not counted)."""
    from dpspark.session import is_connect

    if is_connect(dataset.sparkSession):
        from dpspark import connect_plan

        return connect_plan.assemblers_that_raise(dataset)
    try:
        stack = [_analyzed_plan(dataset)]
        found = 0
        while stack:
            node = stack.pop()
            children = _seq(node.children())
            stack.extend(children)
            if _short(_class_name(node)) != "Project":
                continue
            # py4j hands out a new proxy per call: the proven UDFs are matched by their text
            proven = {str(e.toString()) for e in _vector_assemblers_proven_total(node, children)}
            exprs = _seq(node.expressions())
            while exprs:
                e = exprs.pop()
                if _short(_class_name(e)) == "ScalaUDF" and "VectorAssembler" in _class_name(e.function()):
                    if str(e.toString()) not in proven:
                        found += 1
                    continue
                exprs.extend(_seq(e.children()))
        return found
    except Exception:
        return 0


def check_reads_only(dataset, ledger_input: str) -> None:
    """Refuse (``LineageError``) a DataFrame whose plan reads anything but the table ``ledger_input``.

    See the module docstring. ``SchemaError`` when ``ledger_input`` does not exist. A Spark Connect
    DataFrame is checked by ``dpspark.connect_plan`` (stricter: see there).
    """
    from dpspark import tables
    from dpspark.session import is_connect

    if is_connect(dataset.sparkSession):
        from dpspark import connect_plan

        return connect_plan.check_reads_only(dataset, ledger_input)
    plan = _analyzed_plan(dataset)
    spark = dataset.sparkSession
    qualified = tables.qualify(ledger_input)
    key = tables.ledger_key_of(spark, qualified)
    table_id = key[len("delta-table:"):] if key.startswith("delta-table:") else None
    root = tables.canonical_path(spark, qualified)

    cte_defs, cte_refs, checked, steps = set(), [], [], []
    stack = [plan]
    while stack:
        node = stack.pop()
        short = _short(_class_name(node))
        if node.subqueries().size() > 0:
            raise _refuse(f"a subquery in an expression of {short} (a row would depend on other rows or tables)",
                          ledger_input)
        if short == "CTERelationDef":
            cte_defs.add(int(node.id()))
        children = _seq(node.children())
        if children:
            steps.append((node, short, children))
            stack.extend(children)
            continue
        if short == "LogicalRelation":
            _check_scan(spark, node, ledger_input, root, table_id, checked)
        elif short == "InMemoryRelation":
            try:
                cached = node.cacheBuilder().logicalPlan()
            except Exception:
                cached = None
            if cached is None:
                raise _refuse(_WHAT["InMemoryRelation"], ledger_input)
            stack.append(cached)
        elif short == "CTERelationRef":
            cte_refs.append(int(node.cteId()))
        else:
            raise _refuse(_WHAT.get(short) or f"a {short} leaf (not a file scan)", ledger_input)
    unknown = [ref for ref in cte_refs if ref not in cte_defs]
    if unknown:
        raise _refuse(f"a common table expression (WITH) defined outside the DataFrame's plan (id {unknown[0]})",
                      ledger_input)
    for node, short, children in steps:  # every leaf is ledgerInput: now the steps between it and the fit
        _check_transformation(node, short, children, ledger_input)
