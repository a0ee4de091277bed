"""Records conformance scenarios from a local Apache Spark (classic PySpark, local[2]).

Usage: python record.py OUT_DIR SCENARIO.in.json... [--runs N]

For each scenario (the neutral format of ../shared/conformance/spark/FORMAT.md, without
`expected`) it drives Spark as that corpus's generator did: every streaming source is a
JSON file source on its own directory (explicit schema, maxFilesPerTrigger=1); for
scenario batch i one file per source is renamed into place, then processAllAvailable().
The sink is foreachBatch. Each scenario runs `--runs` times on fresh directories; the
results must be identical, else the scenario is reported unstable and not written.
Writes OUT_DIR/NAME.json = the scenario with `expected`. Prints one line per scenario.

Kinds: project_filter, window_aggregate, dedup, stream_stream_join (inputs may be a
`union`); window_aggregate and dedup may have a `filter` on their input (an extension of
the corpus format, which ETLantic's conformance runner reads too). This is an oracle independent of ETLantic: it never goes through ETLantic's
plan or its Spark Connect translation.
"""

import json
import os
import shutil
import sys
import tempfile
import time

from pyspark.sql import SparkSession, functions as F, types as T

TYPES = {
    "string": T.StringType(),
    "long": T.LongType(),
    "double": T.DoubleType(),
    "boolean": T.BooleanType(),
    "timestamp": T.TimestampType(),
}

CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.streaming.multipleWatermarkPolicy": "min",
    "spark.sql.json.filterPushdown.enabled": "false",
    "spark.ui.enabled": "false",
}


def duration(text):
    n, unit = text.split()
    return f"{n} {unit}"


def struct(schema):
    return T.StructType([T.StructField(c["name"], TYPES[c["type"]], True) for c in schema])


def literal(value, typ):
    if value is None:
        return F.lit(None)
    if typ == "timestamp":
        return F.to_timestamp(F.lit(value))
    return F.lit(value)


def predicate(p, schema):
    if "and" in p:
        out = None
        for q in p["and"]:
            c = predicate(q, schema)
            out = c if out is None else (out & c)
        return out
    if "or" in p:
        out = None
        for q in p["or"]:
            c = predicate(q, schema)
            out = c if out is None else (out | c)
        return out
    if "not" in p:
        return ~predicate(p["not"], schema)
    col = F.col(p["col"])
    typ = next(c["type"] for c in schema if c["name"] == p["col"])
    op = p["op"]
    if op == "is_null":
        return col.isNull()
    if op == "is_not_null":
        return col.isNotNull()
    v = literal(p.get("value"), typ)
    return {
        "=": col == v,
        "!=": col != v,
        "<": col < v,
        "<=": col <= v,
        ">": col > v,
        ">=": col >= v,
    }[op]


class Run:
    def __init__(self, spark, scenario, root):
        self.spark = spark
        self.s = scenario
        self.root = root
        self.dirs = {}
        for name, spec in scenario["sources"].items():
            if spec.get("static"):
                continue
            d = os.path.join(root, "src", name)
            os.makedirs(d)
            self.dirs[name] = d
        self.staging = os.path.join(root, "staging")
        os.makedirs(self.staging)
        self.rows = {}

    def stream(self, inp):
        name = inp["source"]
        df = (
            self.spark.readStream.schema(struct(self.s["sources"][name]["schema"]))
            .option("maxFilesPerTrigger", 1)
            .json(self.dirs[name])
        )
        w = inp.get("watermark")
        if w:
            df = df.withWatermark(w["column"], duration(w["delay"]))
        return df

    def single_input(self, q):
        """The input of a single-input kind and its schema (a union: by name)."""
        if "union" in q:
            dfs = [self.stream(i) for i in q["union"]]
            df = dfs[0]
            for other in dfs[1:]:
                df = df.unionByName(other)
            return df, self.s["sources"][q["union"][0]["source"]]["schema"]
        inp = {"source": q["source"], "watermark": q.get("watermark")}
        return self.stream(inp), self.s["sources"][q["source"]]["schema"]

    def query(self):
        q = self.s["query"]
        kind = q["kind"]
        if kind == "project_filter":
            df, schema = self.single_input(q)
            if q.get("filter"):
                df = df.filter(predicate(q["filter"], schema))
            cols = q.get("columns")
            if cols:
                df = df.select(
                    *[
                        F.col(c) if isinstance(c, str) else F.col(c["col"]).alias(c.get("as", c["col"]))
                        for c in cols
                    ]
                )
            return df, q.get("output_mode", "append")
        if kind == "dedup":
            df, schema = self.single_input(q)
            if q.get("filter"):
                df = df.filter(predicate(q["filter"], schema))
            if q.get("mode") == "within_watermark":
                df = df.dropDuplicatesWithinWatermark(q["keys"])
            else:
                df = df.dropDuplicates(q["keys"])
            return df, "append"
        if kind == "window_aggregate":
            df, schema = self.single_input(q)
            if q.get("filter"):
                df = df.filter(predicate(q["filter"], schema))
            w = q.get("window")
            keys = []
            if w:
                if w["type"] == "tumbling":
                    keys.append(F.window(w["column"], duration(w["size"])).alias("window"))
                elif w["type"] == "sliding":
                    keys.append(
                        F.window(w["column"], duration(w["size"]), duration(w["slide"])).alias("window")
                    )
                else:
                    keys.append(F.session_window(w["column"], duration(w["gap"])).alias("window"))
            keys += [F.col(g) for g in q.get("group_by", [])]
            aggs = []
            for a in q["aggregates"]:
                fn, col = a["fn"], a.get("column")
                if fn == "count":
                    e = F.count(F.lit(1)) if col in (None, "*") else F.count(F.col(col))
                else:
                    e = getattr(F, fn)(F.col(col))
                aggs.append(e.alias(a["as"]))
            df = df.groupBy(*keys).agg(*aggs)
            if w:
                rest = [c for c in df.columns if c != "window"]
                df = df.select(
                    F.col("window.start").alias("window_start"),
                    F.col("window.end").alias("window_end"),
                    *rest,
                )
            return df, q.get("output_mode", "append")
        if kind == "stream_stream_join":
            left = self.stream(q["left"]).alias("l")
            right = self.stream(q["right"]).alias("r")
            cond = None
            for k in q["keys"]:
                c = F.col(f"l.{k['left']}") == F.col(f"r.{k['right']}")
                cond = c if cond is None else cond & c
            tr = q.get("time_range")
            if tr:
                lt, rt = F.col(f"l.{tr['left']}"), F.col(f"r.{tr['right']}")
                c = (lt >= rt - F.expr(f"INTERVAL {duration(tr['lower'])}")) & (
                    lt <= rt + F.expr(f"INTERVAL {duration(tr['upper'])}")
                )
                cond = c if cond is None else cond & c
            how = {"inner": "inner", "left_outer": "left_outer", "right_outer": "right_outer"}[
                q.get("join_type", "inner")
            ]
            df = left.join(right, cond, how)
            sel = [
                F.col(f"{'l' if s['from'] == 'left' else 'r'}.{s['col']}").alias(s.get("as", s["col"]))
                for s in q["select"]
            ]
            return df.select(*sel), "append"
        raise ValueError(f"unsupported kind {kind}")

    def run(self):
        df, mode = self.query()
        chk = os.path.join(self.root, "chk")

        def sink(batch_df, batch_id):
            self.rows[batch_id] = [r.asDict() for r in batch_df.collect()]

        query = (
            df.writeStream.outputMode(mode)
            .foreachBatch(sink)
            .option("checkpointLocation", chk)
            .trigger(processingTime="200 milliseconds")
            .start()
        )
        out_cols = [{"name": f.name, "type": type_name(f.dataType)} for f in df.schema.fields]
        batches = []
        seen = -1
        q = self.s["query"]
        inputs = list(q.get("union") or []) + [q[k] for k in ("left", "right") if q.get(k)]
        has_wm = bool(q.get("watermark")) or any(x.get("watermark") for x in inputs)
        try:
            for i, batch in enumerate(self.s["batches"]):
                paths = []
                for name, d in self.dirs.items():
                    p = os.path.join(self.staging, f"{name}-{i:05d}.json")
                    with open(p, "w") as f:
                        for r in batch.get(name, []):
                            f.write(json.dumps(r) + "\n")
                    paths.append((p, os.path.join(d, f"{i:05d}.json")))
                for src, dst in paths:
                    os.rename(src, dst)
                query.processAllAvailable()
                progress = [p for p in query.recentProgress if p["batchId"] > seen]
                micro = []
                out = []
                for p in progress:
                    bid = p["batchId"]
                    seen = max(seen, bid)
                    ops = p.get("stateOperators") or []
                    moved = any(s.get("startOffset") != s.get("endOffset") for s in p["sources"])
                    micro.append(
                        {
                            "batch_id": bid,
                            "kind": "data" if moved else "no_data",
                            "watermark": p.get("eventTime", {}).get("watermark"),
                            "next_watermark": next_watermark(chk, bid),
                            "input_rows": p.get("numInputRows", 0),
                            "dropped_by_watermark": sum(o.get("numRowsDroppedByWatermark", 0) for o in ops),
                            "state_rows_total": sum(o.get("numRowsTotal", 0) for o in ops),
                        }
                    )
                    out += [row(r, out_cols) for r in self.rows.get(bid, [])]
                data = [m for m in micro if m["kind"] == "data"]
                if len(data) != 1:
                    raise RuntimeError(f"batch {i}: {len(data)} data micro-batches")
                during = data[0]["watermark"] if has_wm else None
                after = micro[-1]["next_watermark"] if has_wm else None
                batches.append(
                    {
                        "index": i,
                        "output": sort_rows(out, out_cols),
                        "watermark_during": iso(during) if during else None,
                        "watermark_after": after,
                        "last_progress_watermark": iso(query.lastProgress.get("eventTime", {}).get("watermark"))
                        if has_wm and query.lastProgress
                        else None,
                        "micro_batches": micro,
                    }
                )
        finally:
            query.stop()
        final = []
        if mode == "complete":
            final = batches[-1]["output"] if batches else []
        else:
            for b in batches:
                final += b["output"]
        return {
            "engine": f"Apache Spark {self.spark.version} (pyspark, local[2])",
            "spark_conf": dict(CONF, trigger="ProcessingTime 200 ms", source="json files", sink="foreachBatch"),
            "output_mode": mode,
            "output_columns": out_cols,
            "batches": batches,
            "final": sort_rows(final, out_cols),
        }


def type_name(t):
    for k, v in TYPES.items():
        if v == t:
            return k
    return t.simpleString()


def iso(text):
    """Spark's watermark text (`2024-01-01T00:00:05.000Z`) as the corpus writes it."""
    if text is None:
        return None
    return text if text.endswith("Z") and len(text) == 24 else text


def next_watermark(chk, batch_id):
    path = os.path.join(chk, "commits", str(batch_id))
    for _ in range(50):
        if os.path.exists(path):
            break
        time.sleep(0.02)
    with open(path) as f:
        lines = f.read().splitlines()
    ms = json.loads(lines[-1]).get("nextBatchWatermarkMs", 0)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


def value(v, typ):
    if v is None:
        return None
    if typ == "timestamp":
        return v.strftime("%Y-%m-%dT%H:%M:%S.") + f"{v.microsecond // 1000:03d}Z"
    return v


def row(r, cols):
    return {c["name"]: value(r.get(c["name"]), c["type"]) for c in cols}


def sort_rows(rows, cols):
    def key(r):
        return [(r[c["name"]] is not None, r[c["name"]] if r[c["name"]] is not None else 0) for c in cols]

    return sorted(rows, key=key)


def main():
    # Collected timestamps are naive datetimes in the Python process's zone.
    os.environ["TZ"] = "UTC"
    time.tzset()
    args = sys.argv[1:]
    runs = 2
    if "--runs" in args:
        k = args.index("--runs")
        runs = int(args[k + 1])
        del args[k : k + 2]
    out_dir, paths = args[0], args[1:]
    os.makedirs(out_dir, exist_ok=True)
    builder = SparkSession.builder.master("local[2]").appName("etlantic-spark-diff")
    for k, v in CONF.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    for path in paths:
        with open(path) as f:
            scenario = json.load(f)
        scenario.pop("expected", None)
        name = scenario["name"]
        results = []
        error = None
        for _ in range(runs):
            root = tempfile.mkdtemp(prefix="spark-diff-")
            try:
                results.append(Run(spark, scenario, root).run())
            except Exception as e:  # recorded as a failure of this scenario, not of the tool
                error = f"{type(e).__name__}: {e}".splitlines()[0]
                break
            finally:
                shutil.rmtree(root, ignore_errors=True)
        if error:
            print(f"ERROR {name}: {error}", flush=True)
            continue
        if any(json.dumps(r, sort_keys=True) != json.dumps(results[0], sort_keys=True) for r in results):
            print(f"UNSTABLE {name}: runs differ", flush=True)
            continue
        expected = results[0]
        expected["runs_compared"] = runs
        scenario["expected"] = expected
        with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
            json.dump(scenario, f, indent=1)
            f.write("\n")
        print(f"RECORDED {name}", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
