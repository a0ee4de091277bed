#!/usr/bin/env python3
"""Check that a DTCS portable plan (dtcs.transform-plan/2) loads in ETLantic-py.

Run with the interpreter of a virtualenv that has `pip install etlantic`
(see scripts/etlantic_py_fixtures.py):

    PY=/root/.cache/etlantic-py-venv/bin/python
    $PY scripts/etlantic_py_load_check.py path/to/plan.json
    $PY scripts/etlantic_py_load_check.py plan.json \\
        --input orders=orders.jsonl --param min_amount=20 --expected out.jsonl
    $PY scripts/etlantic_py_load_check.py --fixture tests/fixtures/etlantic-py/top_orders

Exit status: 0 = loads (and, if asked, runs and matches), 1 = rejected,
2 = usage error. Add --json for a machine-readable report on stdout.

A plan "loads" when every step ETLantic-py itself applies to a portable plan
passes:
  1. the file is a JSON object with planIdentity == "dtcs.transform-plan/2"
     (etlantic.transform.protocol.PLAN_PROTOCOL);
  2. dtcs.plan_fingerprint(plan) succeeds: the dtcs toolkit (Rust, via PyO3)
     deserialises the portable envelope and hashes it - this is the same call
     ETLantic uses to fingerprint plans it emits;
  3. etlantic.transform.validate.validate_plan_budgets() reports no errors
     (size/depth/node budgets, forbidden node kinds);
  4. etlantic's LocalTransformCompiler.analyze() runs without raising.
     If it reports the plan as unsupported that is printed as a warning
     (ETLantic-py loaded it but would refuse to run it on its local engine);
     with --strict it is an error. When supported, compile() must succeed.
With --input/--fixture the plan is also executed on the local engine, and
with --expected its rows are compared (order-insensitively unless the plan
contains dtcs:sort, same normalisation as etlantic's conformance suite).

The same script also accepts an ODCS/DTCS/DPCS contract document (YAML or
JSON); the kind is detected from apiVersion+kind / dtcsVersion / dpcsVersion
and the document is validated with pyodcs / dtcs / dpcs and loaded with
ETLantic's own loader (load_data_contract / Transformation.from_dtcs /
Pipeline.from_dpcs with the bundle root = parent of pipelines/).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from pathlib import Path
from typing import Any

PLAN_KEYS = {
    # Closed key set ETLantic applies to plans it fuses (transform/fusion.py).
    "planIdentity",
    "profile",
    "specificationVersion",
    "registryVersions",
    "transformation",
    "inputs",
    "outputs",
    "parameters",
    "actions",
    "rules",
    "lineage",
    "requirements",
    "errorMode",
}


class Report:
    def __init__(self) -> None:
        self.ok = True
        self.checks: list[dict[str, Any]] = []
        self.info: dict[str, Any] = {}

    def add(self, name: str, passed: bool, detail: str = "", *, warning: bool = False) -> None:
        level = "ok" if passed else ("warning" if warning else "error")
        if not passed and not warning:
            self.ok = False
        self.checks.append({"check": name, "result": level, "detail": detail})


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        value = json.loads(text)
        return list(value if isinstance(value, list) else [value])
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def normalize(rows: list[dict[str, Any]], *, ordered: bool) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        item = {}
        for k in sorted(row):
            v = row[k]
            if isinstance(v, float) and math.isnan(v):
                v = {"$etlantic.scalar": "nan"}
            item[k] = v
        out.append(item)
    return out if ordered else sorted(out, key=lambda r: tuple(str(r.get(k)) for k in sorted(r)))


def same(left: Any, right: Any) -> bool:
    """Equality without Python's bool/int conflation (as etlantic's suite)."""
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left == right
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(same(left[k], right[k]) for k in left)
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(same(a, b) for a, b in zip(left, right))
    return bool(left == right)


def load_document(path: Path) -> Any:
    text = path.read_text(encoding="utf-8")
    if path.suffix in {".yaml", ".yml"}:
        import yaml

        return yaml.safe_load(text)
    return json.loads(text)


# ---------------------------------------------------------------------------
# portable plan
# ---------------------------------------------------------------------------


def check_plan(plan: Any, args: argparse.Namespace, rep: Report) -> None:
    import dtcs
    from etlantic.transform.capabilities import requirements_from_plan
    from etlantic.transform.compiler import (
        TransformCompileContext,
        TransformExecutionContext,
        TransformPlanningContext,
    )
    from etlantic.transform.local_compiler import LocalTransformCompiler
    from etlantic.transform.protocol import PLAN_PROTOCOL
    from etlantic.transform.validate import validate_plan_budgets

    if not isinstance(plan, dict):
        rep.add("json-object", False, f"top level is {type(plan).__name__}")
        return
    rep.add(
        "planIdentity",
        plan.get("planIdentity") == PLAN_PROTOCOL,
        f"{plan.get('planIdentity')!r} (want {PLAN_PROTOCOL!r})",
    )
    extra = sorted(set(plan) - PLAN_KEYS)
    rep.add(
        "closed-key-set",
        not extra,
        f"keys outside ETLantic's plan key set: {extra}" if extra else "",
        warning=not args.strict,
    )

    try:
        fingerprint = dtcs.plan_fingerprint(plan)
        rep.info["fingerprint"] = fingerprint
        rep.add("dtcs.plan_fingerprint", True, fingerprint)
    except Exception as exc:  # noqa: BLE001 - report any toolkit rejection
        rep.add("dtcs.plan_fingerprint", False, f"{type(exc).__name__}: {exc}")

    try:
        diags = validate_plan_budgets(plan)
        errors = [f"{d.code}: {d.message}" for d in diags if str(d.severity).lower().endswith("error")]
        rep.add("etlantic.validate_plan_budgets", not errors, "; ".join(errors))
    except Exception as exc:  # noqa: BLE001
        rep.add("etlantic.validate_plan_budgets", False, f"{type(exc).__name__}: {exc}")

    try:
        req = requirements_from_plan(dict(plan), include_extended=True)
        rep.info["requirements"] = {k: sorted(v) for k, v in req.items()}
    except Exception as exc:  # noqa: BLE001
        rep.add("etlantic.requirements_from_plan", False, f"{type(exc).__name__}: {exc}")

    compiler = LocalTransformCompiler()
    try:
        analysis = compiler.analyze(
            plan, context=TransformPlanningContext("load-check", "step", "load-check", "local")
        )
    except Exception as exc:  # noqa: BLE001
        rep.add("etlantic.local.analyze", False, f"{type(exc).__name__}: {exc}")
        return
    findings = "; ".join(f"{f.code} {f.requirement}: {f.reason}" for f in analysis.findings)
    rep.info["local_supported"] = analysis.supported
    rep.add("etlantic.local.analyze", analysis.supported, findings, warning=not args.strict)
    if not analysis.supported:
        if args.inputs or args.expected:
            rep.add("etlantic.local.execute", False, "plan unsupported by the local engine")
        return

    try:
        compiled = compiler.compile(
            plan,
            context=TransformCompileContext("load-check", "plan", "step", "load-check", "local"),
        )
        rep.add("etlantic.local.compile", True, ",".join(compiled.output_ports))
    except Exception as exc:  # noqa: BLE001
        rep.add("etlantic.local.compile", False, f"{type(exc).__name__}: {exc}")
        return

    if not args.inputs:
        return
    try:
        bundle = asyncio.run(
            compiler.execute(
                compiled,
                inputs={k: read_jsonl(Path(v)) for k, v in args.inputs.items()},
                parameters=dict(args.params),
                context=TransformExecutionContext("load-check", "load-check", "plan", "step", "local"),
            )
        )
    except Exception as exc:  # noqa: BLE001
        rep.add("etlantic.local.execute", False, f"{type(exc).__name__}: {exc}")
        return
    port = args.output or ("result" if "result" in bundle.valid else next(iter(bundle.valid)))
    rows = [dict(r) for r in bundle.valid[port]]
    rep.info["output_port"] = port
    rep.info["rows"] = rows
    rep.add("etlantic.local.execute", True, f"{len(rows)} rows on port {port!r}")
    if args.expected:
        ordered = any(
            (a.get("kind") or {}).get("action") == "dtcs:sort"
            for a in plan.get("actions") or []
            if isinstance(a, dict)
        )
        expected = read_jsonl(Path(args.expected))
        got_n, want_n = normalize(rows, ordered=ordered), normalize(expected, ordered=ordered)
        rep.add(
            "expected-rows",
            same(got_n, want_n),
            f"ordered={ordered}" + ("" if same(got_n, want_n) else f"; got {got_n!r} want {want_n!r}"),
        )


# ---------------------------------------------------------------------------
# ODCS / DTCS / DPCS documents
# ---------------------------------------------------------------------------


def toolkit_errors(report: dict[str, Any]) -> list[str]:
    return [
        f"{d.get('id') or d.get('code')}: {d.get('message')}"
        for d in report.get("diagnostics", [])
        if d.get("severity") in (None, "error")
    ]


def check_contract_document(doc: dict[str, Any], path: Path, kind: str, rep: Report) -> None:
    text = path.read_text(encoding="utf-8")
    fmt = "json" if path.suffix == ".json" else "yaml"
    if kind == "odcs":
        import pyodcs
        from etlantic.interchange.odcs import load_data_contract

        errs = toolkit_errors(pyodcs.parse_and_validate(text, fmt))
        rep.add("pyodcs.parse_and_validate", not errs, "; ".join(errs))
        try:
            model = load_data_contract(path)
            rep.add("etlantic.load_data_contract", True, f"{model.__name__} {list(model.model_fields)}")
        except Exception as exc:  # noqa: BLE001
            rep.add("etlantic.load_data_contract", False, f"{type(exc).__name__}: {exc}")
    elif kind == "dtcs":
        import dtcs
        from etlantic.interchange.dtcs import transformation_from_dtcs

        errs = toolkit_errors(dtcs.parse_and_validate(text, fmt))
        rep.add("dtcs.parse_and_validate", not errs, "; ".join(errs))
        # Port contracts are referenced by id (etlantic:contractId /
        # contractRef); resolve them from the bundle's data/*.odcs.yaml.
        contracts: dict[str, Any] = {}
        data_dir = path.parent.parent / "data" if path.parent.name == "transformations" else path.parent
        if data_dir.is_dir():
            from etlantic.interchange.odcs import load_data_contract

            for odcs_path in sorted(data_dir.glob("*.odcs.y*ml")):
                try:
                    model = load_data_contract(odcs_path)
                    contracts[str(model.__published_id__)] = model
                except Exception:  # noqa: BLE001 - reported by the ODCS check
                    pass
        try:
            cls = transformation_from_dtcs(path, contracts=contracts)
            ports = [p.name for p in cls.__ports__]
            rep.add("etlantic.Transformation.from_dtcs", True, f"{cls.__name__} ports={ports}")
        except Exception as exc:  # noqa: BLE001
            rep.add("etlantic.Transformation.from_dtcs", False, f"{type(exc).__name__}: {exc}")
    elif kind == "dpcs":
        import dpcs
        from etlantic.interchange.dpcs import pipeline_from_dpcs

        yaml_text = text
        if fmt == "json":
            import yaml

            yaml_text = yaml.safe_dump(doc, sort_keys=False)
        errs = toolkit_errors(dpcs.validate_yaml(yaml_text))
        rep.add("dpcs.validate_yaml", not errs, "; ".join(errs))
        root = path.parent.parent if path.parent.name == "pipelines" else path.parent
        try:
            cls = pipeline_from_dpcs(path, root=root)
            graph = cls.build_graph()
            rep.add(
                "etlantic.Pipeline.from_dpcs",
                True,
                f"{cls.__name__} nodes={[n.name for n in graph.nodes]} (root={root})",
            )
        except Exception as exc:  # noqa: BLE001
            rep.add("etlantic.Pipeline.from_dpcs", False, f"{type(exc).__name__}: {exc}")


def detect_kind(doc: Any) -> str:
    if isinstance(doc, dict):
        if "planIdentity" in doc or ("actions" in doc and "profile" in doc):
            return "plan"
        if "dpcsVersion" in doc:
            return "dpcs"
        if "dtcsVersion" in doc:
            return "dtcs"
        if doc.get("kind") == "DataContract" or "apiVersion" in doc:
            return "odcs"
    return "plan"


# ---------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Load/validate a dtcs.transform-plan/2 (or ODCS/DTCS/DPCS doc) with ETLantic-py."
    )
    p.add_argument("path", nargs="?", type=Path, help="plan JSON (or ODCS/DTCS/DPCS document)")
    p.add_argument("--fixture", type=Path, help="fixture dir with plan.json, input/, expected/")
    p.add_argument("--input", action="append", default=[], metavar="PORT=FILE", help="input rows (.jsonl or .json array)")
    p.add_argument("--param", action="append", default=[], metavar="NAME=JSON", help="runtime parameter value")
    p.add_argument("--expected", type=Path, help="expected output rows (.jsonl or .json array)")
    p.add_argument("--output", help="output port to compare (default: result / the only port)")
    p.add_argument("--kind", choices=["auto", "plan", "odcs", "dtcs", "dpcs"], default="auto")
    p.add_argument("--strict", action="store_true", help="local-engine 'unsupported' and unknown plan keys are errors")
    p.add_argument("--json", action="store_true", help="print a JSON report")
    args = p.parse_args(argv)

    args.inputs = {}
    args.params = {}
    for item in args.input:
        port, sep, file = item.partition("=")
        if not sep:
            p.error(f"--input wants PORT=FILE, got {item!r}")
        args.inputs[port] = file
    for item in args.param:
        name, sep, raw = item.partition("=")
        if not sep:
            p.error(f"--param wants NAME=JSON, got {item!r}")
        try:
            args.params[name] = json.loads(raw)
        except json.JSONDecodeError:
            args.params[name] = raw

    if args.fixture is not None:
        fdir = args.fixture
        args.path = args.path or fdir / "plan.json"
        if not args.inputs and (fdir / "input").is_dir():
            args.inputs = {f.stem: str(f) for f in sorted((fdir / "input").glob("*.jsonl"))}
        if args.expected is None and (fdir / "expected" / "result.jsonl").is_file():
            args.expected = fdir / "expected" / "result.jsonl"
        manifest = fdir.parent / "manifest.json"
        if not args.params and manifest.is_file():
            for entry in json.loads(manifest.read_text(encoding="utf-8")).get("fixtures", []):
                if entry.get("name") == fdir.name:
                    args.params = dict(entry.get("parameters") or {})
    if args.path is None:
        p.error("give a plan path or --fixture DIR")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        import dpcs  # noqa: F401
        import dtcs  # noqa: F401
        import etlantic  # noqa: F401
        import pyodcs  # noqa: F401
    except ModuleNotFoundError as exc:
        print(
            f"{exc}. Run with a virtualenv that has `pip install etlantic`, e.g. "
            "/root/.cache/etlantic-py-venv/bin/python scripts/etlantic_py_load_check.py",
            file=sys.stderr,
        )
        return 2
    rep = Report()
    rep.info["path"] = str(args.path)
    try:
        doc = load_document(args.path)
        rep.add("parse", True)
    except Exception as exc:  # noqa: BLE001
        rep.add("parse", False, f"{type(exc).__name__}: {exc}")
        doc = None
    if doc is not None:
        kind = detect_kind(doc) if args.kind == "auto" else args.kind
        rep.info["kind"] = kind
        try:
            if kind == "plan":
                check_plan(doc, args, rep)
            else:
                check_contract_document(doc, args.path, kind, rep)
        except Exception as exc:  # noqa: BLE001 - never crash without a verdict
            rep.add("unexpected", False, f"{type(exc).__name__}: {exc}")

    if args.json:
        print(json.dumps({"ok": rep.ok, "checks": rep.checks, **rep.info}, indent=2, default=str))
    else:
        for c in rep.checks:
            detail = f" - {c['detail']}" if c["detail"] else ""
            print(f"[{c['result']}] {c['check']}{detail}")
        warnings = sum(1 for c in rep.checks if c["result"] == "warning")
        verdict = "LOADS" if rep.ok else "REJECTED"
        if rep.ok and warnings:
            verdict += f" with {warnings} warning(s); --strict would reject"
        print(f"{verdict}: {args.path} ({rep.info.get('kind', '?')})")
    return 0 if rep.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
