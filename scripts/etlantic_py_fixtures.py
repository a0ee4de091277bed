#!/usr/bin/env python3
"""Generate interop fixtures from ETLantic-py (the `etlantic` PyPI package).

Run with the interpreter of a virtualenv that has `pip install etlantic`:

    python3 -m venv /root/.cache/etlantic-py-venv
    /root/.cache/etlantic-py-venv/bin/pip install etlantic
    /root/.cache/etlantic-py-venv/bin/python scripts/etlantic_py_fixtures.py

For each fixture it declares a typed ETLantic pipeline (Data contracts,
one portable Transformation, Extract sources and a Load sink) and writes,
under tests/fixtures/etlantic-py/<fixture>/:

    plan.json               dtcs.transform-plan/2 emitted by
                            Transformation.to_transform_plan()
    input/<port>.jsonl      input rows, one JSON object per line
    expected/result.jsonl   output rows computed by ETLantic-py itself
    contracts/data/*.odcs.yaml
    contracts/transformations/*.dtcs.yaml
    contracts/pipelines/*.dpcs.yaml   Pipeline.write_contracts() bundle

plus a top-level manifest.json. The expected output is computed twice and
the two must agree: once by running the whole pipeline
(`Pipeline.run`, built-in "local" engine, json:// assets) and once by
reloading plan.json from disk and executing it with ETLantic's
LocalTransformCompiler (analyze -> compile -> execute).

Only the fixture folder is written; nothing is fetched from the network.
"""

from __future__ import annotations

import os
import sys

# ETLantic-py's DPCS emitter orders `dataFlow` entries of multi-input steps by
# set iteration order, which depends on str hash randomisation. Pin the seed
# (by re-executing) so regenerated fixtures are byte-identical.
if __name__ == "__main__" and os.environ.get("PYTHONHASHSEED") != "0":
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "PYTHONHASHSEED": "0"})

import argparse
import asyncio
import contextlib
import json
import math
import shutil
import tempfile
from dataclasses import dataclass, field
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import Any

try:
    import dpcs
    import dtcs
    import etlantic as etl
    import pyodcs
    import yaml
except ModuleNotFoundError as exc:  # pragma: no cover - environment hint
    sys.exit(
        f"{exc}. Run with a virtualenv that has `pip install etlantic`, e.g. "
        "/root/.cache/etlantic-py-venv/bin/python scripts/etlantic_py_fixtures.py"
    )
from etlantic.interchange.bundle import generate_contracts, load_bundle
from etlantic.interchange.odcs import load_data_contract
from etlantic.transform import functions as F
from etlantic.transform.compiler import (
    TransformCompileContext,
    TransformExecutionContext,
    TransformPlanningContext,
)
from etlantic.transform.local_compiler import LocalTransformCompiler

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "tests" / "fixtures" / "etlantic-py"

# ---------------------------------------------------------------------------
# Data contracts (ODCS via ContractModel). Amounts are binary-exact
# (x.0 / x.5 / x.25) so float sums/averages print identically everywhere.
# ---------------------------------------------------------------------------


class Order(etl.Data):
    order_id: int
    customer_id: int
    amount: float
    status: str


class OrderSummary(etl.Data):
    order_id: int
    customer_id: int
    amount: float
    status_code: str
    tier: str


class Customer(etl.Data):
    customer_id: int
    name: str
    email: str | None = None
    internal_code: str


class CustomerPublic(etl.Data):
    customer_id: int
    full_name: str
    email: str


class CustomerTotals(etl.Data):
    customer_id: int
    order_count: int
    total_amount: float
    avg_amount: float
    max_amount: float


class OrderWithCustomer(etl.Data):
    order_id: int
    amount: float
    name: str | None = None


class Event(etl.Data):
    event_id: int
    user_id: int
    event: str


class UserEvent(etl.Data):
    user_id: int
    event: str


# ---------------------------------------------------------------------------
# Portable transformations. __published_id__ pins stable ids (otherwise the
# id is "<module>:<qualname>", i.e. "__main__:X" when run as a script).
# ---------------------------------------------------------------------------


class FilterEnrichOrders(etl.Transformation):
    """filter (with a runtime parameter) + with_fields + project."""

    __published_id__ = "etlantic_py_fixtures.filter_enrich_orders"
    orders: etl.Input[Order]
    result: etl.Output[OrderSummary]
    min_amount: etl.Parameter[int] = 10


@FilterEnrichOrders.portable
def _filter_enrich_orders(orders, min_amount):
    return (
        orders.filter(
            (F.col("amount") >= min_amount)
            & ((F.col("status") == "paid") | (F.col("status") == "shipped"))
        )
        .withColumns(
            {
                "status_code": F.upper(F.col("status")),
                "tier": F.when(F.col("amount") >= 100, "gold").otherwise("standard"),
            }
        )
        .select("order_id", "customer_id", "amount", "status_code", "tier")
    )


class PublishCustomers(etl.Transformation):
    """with_fields (coalesce/lower) + rename_fields + drop_fields."""

    __published_id__ = "etlantic_py_fixtures.publish_customers"
    customers: etl.Input[Customer]
    result: etl.Output[CustomerPublic]


@PublishCustomers.portable
def _publish_customers(customers):
    return (
        customers.withColumn("email", F.coalesce(F.lower(F.col("email")), "unknown"))
        .withColumnRenamed("name", "full_name")
        .drop("internal_code")
    )


class CustomerTotalsT(etl.Transformation):
    """filter + aggregate (group by, count_all/sum/average/max) + sort."""

    __published_id__ = "etlantic_py_fixtures.customer_totals"
    orders: etl.Input[Order]
    result: etl.Output[CustomerTotals]


@CustomerTotalsT.portable
def _customer_totals(orders):
    return (
        orders.filter(F.col("status") != "cancelled")
        .groupBy("customer_id")
        .agg(
            order_count=F.count_all(),
            total_amount=F.sum(F.col("amount")),
            avg_amount=F.avg(F.col("amount")),
            max_amount=F.max(F.col("amount")),
        )
        .sort(F.col("customer_id").asc())
    )


class OrdersLeftJoinCustomers(etl.Transformation):
    """two inputs: left join on a shared key + project."""

    __published_id__ = "etlantic_py_fixtures.orders_left_join_customers"
    orders: etl.Input[Order]
    customers: etl.Input[Customer]
    result: etl.Output[OrderWithCustomer]


@OrdersLeftJoinCustomers.portable
def _orders_left_join_customers(orders, customers):
    slim = customers.select("customer_id", "name")
    return orders.join(slim, on="customer_id", how="left").select(
        "order_id", "amount", "name"
    )


class TopOrders(etl.Transformation):
    """two inputs: union by name + sort (desc, asc) + limit."""

    __published_id__ = "etlantic_py_fixtures.top_orders"
    orders_2024: etl.Input[Order]
    orders_2025: etl.Input[Order]
    result: etl.Output[Order]


@TopOrders.portable
def _top_orders(orders_2024, orders_2025):
    return (
        orders_2024.unionByName(orders_2025)
        .sort(F.col("amount").desc(), F.col("order_id").asc())
        .limit(3)
    )


class UniqueUserEvents(etl.Transformation):
    """deduplicate (keys) + project + distinct + sort."""

    __published_id__ = "etlantic_py_fixtures.unique_user_events"
    events: etl.Input[Event]
    result: etl.Output[UserEvent]


@UniqueUserEvents.portable
def _unique_user_events(events):
    return (
        events.dropDuplicates("event_id")
        .select("user_id", "event")
        .distinct()
        .sort("user_id", "event")
    )


class DoubleAmount(etl.Transformation):
    """Negative case: field arithmetic. ETLantic-py emits the plan but its
    local compiler refuses it at analyze time (PMXFORM302)."""

    __published_id__ = "etlantic_py_fixtures.double_amount"
    orders: etl.Input[Order]
    result: etl.Output[Order]


@DoubleAmount.portable
def _double_amount(orders):
    return orders.withColumn("amount", F.col("amount") * 2)


# ---------------------------------------------------------------------------
# Pipelines (sources -> one step -> sink). Asset names == input port names.
# ---------------------------------------------------------------------------


class FilterEnrichOrdersPipeline(etl.Pipeline):
    __published_id__ = "etlantic_py_fixtures.filter_enrich_orders_pipeline"
    orders: etl.Extract[Order] = etl.Extract(asset="orders")
    step = FilterEnrichOrders.step(orders=orders, min_amount=20)
    out: etl.Load[OrderSummary] = etl.Load(input=step.result, asset="out")


class PublishCustomersPipeline(etl.Pipeline):
    __published_id__ = "etlantic_py_fixtures.publish_customers_pipeline"
    customers: etl.Extract[Customer] = etl.Extract(asset="customers")
    step = PublishCustomers.step(customers=customers)
    out: etl.Load[CustomerPublic] = etl.Load(input=step.result, asset="out")


class CustomerTotalsPipeline(etl.Pipeline):
    __published_id__ = "etlantic_py_fixtures.customer_totals_pipeline"
    orders: etl.Extract[Order] = etl.Extract(asset="orders")
    step = CustomerTotalsT.step(orders=orders)
    out: etl.Load[CustomerTotals] = etl.Load(input=step.result, asset="out")


class OrdersLeftJoinCustomersPipeline(etl.Pipeline):
    __published_id__ = "etlantic_py_fixtures.orders_left_join_customers_pipeline"
    orders: etl.Extract[Order] = etl.Extract(asset="orders")
    customers: etl.Extract[Customer] = etl.Extract(asset="customers")
    step = OrdersLeftJoinCustomers.step(orders=orders, customers=customers)
    out: etl.Load[OrderWithCustomer] = etl.Load(input=step.result, asset="out")


class TopOrdersPipeline(etl.Pipeline):
    __published_id__ = "etlantic_py_fixtures.top_orders_pipeline"
    orders_2024: etl.Extract[Order] = etl.Extract(asset="orders_2024")
    orders_2025: etl.Extract[Order] = etl.Extract(asset="orders_2025")
    step = TopOrders.step(orders_2024=orders_2024, orders_2025=orders_2025)
    out: etl.Load[Order] = etl.Load(input=step.result, asset="out")


class UniqueUserEventsPipeline(etl.Pipeline):
    __published_id__ = "etlantic_py_fixtures.unique_user_events_pipeline"
    events: etl.Extract[Event] = etl.Extract(asset="events")
    step = UniqueUserEvents.step(events=events)
    out: etl.Load[UserEvent] = etl.Load(input=step.result, asset="out")


# ---------------------------------------------------------------------------
# Input data
# ---------------------------------------------------------------------------

ORDERS = [
    {"order_id": 1, "customer_id": 10, "amount": 120.5, "status": "paid"},
    {"order_id": 2, "customer_id": 10, "amount": 15.0, "status": "paid"},
    {"order_id": 3, "customer_id": 11, "amount": 42.25, "status": "shipped"},
    {"order_id": 4, "customer_id": 12, "amount": 300.0, "status": "cancelled"},
    {"order_id": 5, "customer_id": 11, "amount": 20.0, "status": "open"},
    {"order_id": 6, "customer_id": 13, "amount": 99.75, "status": "paid"},
    {"order_id": 7, "customer_id": 99, "amount": 20.0, "status": "shipped"},
]

CUSTOMERS = [
    {"customer_id": 10, "name": "Ada", "email": "ADA@Example.com", "internal_code": "x1"},
    {"customer_id": 11, "name": "Grace", "email": None, "internal_code": "x2"},
    {"customer_id": 12, "name": "Linus", "email": "linus@example.org", "internal_code": "x3"},
    {"customer_id": 13, "name": "Barbara", "email": "Barbara@Example.COM", "internal_code": "x4"},
]

ORDERS_2024 = [
    {"order_id": 101, "customer_id": 10, "amount": 50.0, "status": "paid"},
    {"order_id": 102, "customer_id": 11, "amount": 75.5, "status": "paid"},
    {"order_id": 103, "customer_id": 12, "amount": 10.0, "status": "open"},
]

ORDERS_2025 = [
    {"order_id": 201, "customer_id": 10, "amount": 75.5, "status": "shipped"},
    {"order_id": 202, "customer_id": 13, "amount": 200.0, "status": "paid"},
    {"order_id": 203, "customer_id": 11, "amount": 5.25, "status": "cancelled"},
]

EVENTS = [
    {"event_id": 1, "user_id": 2, "event": "login"},
    {"event_id": 2, "user_id": 1, "event": "view"},
    {"event_id": 2, "user_id": 1, "event": "view"},
    {"event_id": 3, "user_id": 1, "event": "login"},
    {"event_id": 4, "user_id": 2, "event": "login"},
    {"event_id": 5, "user_id": 1, "event": "view"},
    {"event_id": 6, "user_id": 3, "event": "logout"},
]


@dataclass
class Fixture:
    name: str
    description: str
    transformation: type[Any]
    pipeline: type[Any] | None
    inputs: dict[str, list[dict[str, Any]]]
    parameters: dict[str, Any] = field(default_factory=dict)
    expect_supported: bool = True


FIXTURES: list[Fixture] = [
    Fixture(
        "filter_enrich_orders",
        "filter with runtime parameter (min_amount=20), and/or/eq/gte, with_fields "
        "(upper, case_when), project",
        FilterEnrichOrders,
        FilterEnrichOrdersPipeline,
        {"orders": ORDERS},
        parameters={"min_amount": 20},
    ),
    Fixture(
        "publish_customers",
        "with_fields (coalesce(lower(email), 'unknown')), rename_fields, drop_fields",
        PublishCustomers,
        PublishCustomersPipeline,
        {"customers": CUSTOMERS},
    ),
    Fixture(
        "customer_totals",
        "filter (not_eq), aggregate group by with count_all/sum/average/max, sort",
        CustomerTotalsT,
        CustomerTotalsPipeline,
        {"orders": ORDERS},
    ),
    Fixture(
        "orders_left_join_customers",
        "two inputs: project on the right side, left join on customer_id, project",
        OrdersLeftJoinCustomers,
        OrdersLeftJoinCustomersPipeline,
        {"orders": ORDERS, "customers": CUSTOMERS},
    ),
    Fixture(
        "top_orders",
        "two inputs: union byName, sort (amount desc, order_id asc), limit 3",
        TopOrders,
        TopOrdersPipeline,
        {"orders_2024": ORDERS_2024, "orders_2025": ORDERS_2025},
    ),
    Fixture(
        "unique_user_events",
        "deduplicate on event_id, project, distinct, sort",
        UniqueUserEvents,
        UniqueUserEventsPipeline,
        {"events": EVENTS},
    ),
    Fixture(
        "unsupported_field_arithmetic",
        "NEGATIVE: with_fields amount * 2 on a field; ETLantic-py emits the plan "
        "but LocalTransformCompiler.analyze() rejects it (PMXFORM302), so no "
        "expected output and no pipeline/contracts",
        DoubleAmount,
        None,
        {"orders": ORDERS[:2]},
        expect_supported=False,
    ),
]


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in rows)
    path.write_text(text, encoding="utf-8")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def plan_is_ordered(plan: dict[str, Any]) -> bool:
    return any(
        (a.get("kind") or {}).get("action") == "dtcs:sort" for a in plan.get("actions") or []
    )


def normalize(rows: list[dict[str, Any]], *, ordered: bool) -> list[dict[str, Any]]:
    """Same normalisation as etlantic.testing.portable_transform_conformance."""
    out = []
    for row in rows:
        item = {}
        for k in sorted(row):
            v = row[k]
            if isinstance(v, float) and math.isnan(v):
                v = {"$etlantic.scalar": "nan"}
            item[k] = v
        out.append(item)
    if ordered:
        return out
    return sorted(out, key=lambda r: tuple(str(r.get(k)) for k in sorted(r)))


def run_plan_locally(
    plan: dict[str, Any],
    inputs: dict[str, list[dict[str, Any]]],
    parameters: dict[str, Any],
    requirements: dict[str, list[str]] | None = None,
) -> tuple[bool, list[dict[str, Any]], dict[str, Any]]:
    """analyze -> compile -> execute a portable plan with ETLantic's local engine.

    `requirements` are the authoring-time requirements (what Pipeline.run's
    planner passes); analyze() always merges in requirements derived from
    the plan itself.
    """
    compiler = LocalTransformCompiler()
    report = compiler.analyze(
        plan,
        context=TransformPlanningContext("fixtures", "step", "fixtures", "local"),
        requirements=requirements,
    )
    info = {
        "supported": report.supported,
        "findings": [
            {"code": f.code, "requirement": f.requirement, "reason": f.reason}
            for f in report.findings
        ],
    }
    if not report.supported:
        return False, [], info
    compiled = compiler.compile(
        plan,
        context=TransformCompileContext("fixtures", "plan", "step", "fixtures", "local"),
        requirements=requirements,
    )
    bundle = asyncio.run(
        compiler.execute(
            compiled,
            inputs={k: [dict(r) for r in v] for k, v in inputs.items()},
            parameters=dict(parameters),
            context=TransformExecutionContext("run", "fixtures", "plan", "step", "local"),
        )
    )
    valid = dict(bundle.valid)
    info["output_ports"] = sorted(valid)
    return True, list(valid["result"]), info


@contextlib.contextmanager
def chdir(path: Path):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def run_pipeline(fx: Fixture, work: Path) -> list[dict[str, Any]]:
    """Run the full ETLantic pipeline with the local engine and json:// assets."""
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    assets = {}
    for port, rows in fx.inputs.items():
        write_jsonl(data / f"{port}.jsonl", rows)
        assets[port] = f"json://data/{port}.jsonl"
    assets["out"] = "json://data/out.jsonl"
    profile = {
        "name": "fixtures",
        "orchestrator": "local",
        "dataframe_engine": "local",
        "portable_transform_policy": "require",
        "security_mode": "development",
        "validation_policy": "default",
        "assets": assets,
    }
    write_json(work / "profiles" / "fixtures.json", profile)
    with chdir(work):
        report = fx.pipeline.run(profile="profiles/fixtures.json")
        status = str(getattr(report, "status", report))
        if "succeeded" not in status.lower():
            raise SystemExit(f"{fx.name}: pipeline run did not succeed: {status}")
        return read_jsonl(data / "out.jsonl")


def toolkit_errors(report: dict[str, Any]) -> list[str]:
    return [
        f"{d.get('id') or d.get('code')}: {d.get('message')}"
        for d in report.get("diagnostics", [])
        if d.get("severity") in (None, "error")
    ]


def check_contracts(contracts_dir: Path, pipeline: type[Any]) -> dict[str, Any]:
    """Validate every bundle document with its toolkit and round-trip the bundle."""
    result: dict[str, Any] = {"files": {}, "roundtrip": {}}
    for path in sorted(contracts_dir.rglob("*.yaml")):
        rel = path.relative_to(contracts_dir).as_posix()
        text = path.read_text(encoding="utf-8")
        if rel.endswith(".odcs.yaml"):
            errors = toolkit_errors(pyodcs.parse_and_validate(text))
            load_data_contract(path)  # ETLantic ODCS -> Data class
            kind = "odcs"
        elif rel.endswith(".dtcs.yaml"):
            errors = toolkit_errors(dtcs.parse_and_validate(text))
            kind = "dtcs"
        elif rel.endswith(".dpcs.yaml"):
            errors = toolkit_errors(dpcs.validate_yaml(text))
            kind = "dpcs"
        else:
            continue
        if errors:
            raise SystemExit(f"{rel}: toolkit validation failed: {errors}")
        result["files"][rel] = {"kind": kind, "toolkit_valid": True}

    # Round trip: load the written bundle back into a Pipeline class
    # (ODCS -> Data, DTCS -> Transformation, DPCS -> Pipeline) and re-emit.
    loaded = load_bundle(contracts_dir)
    original = generate_contracts(pipeline).documents
    regenerated = generate_contracts(loaded.pipeline).documents
    for rel, doc in sorted(original.items()):
        on_disk = yaml.safe_load((contracts_dir / rel).read_text(encoding="utf-8"))
        result["roundtrip"][rel] = {
            "disk_equals_in_memory": on_disk == doc,
            "reloaded_equals_original": regenerated.get(rel) == doc,
        }
    for rel in sorted(set(regenerated) - set(original)):
        result["roundtrip"][rel] = {"unexpected_after_reload": False}
    return result


def dump_corpus(path: Path) -> None:
    """Write etlantic's built-in portable-transform conformance cases.

    Note: these hand-written plans omit `profile` (and some other envelope
    fields), so dtcs.plan_fingerprint() rejects them; ETLantic's compilers
    accept them.
    """
    from etlantic.testing.portable_fixtures import FIXTURES as CORPUS

    cases = []
    for case in CORPUS:
        cases.append(
            {
                "name": case.name,
                "plan": case.plan,
                "inputs": case.inputs,
                "parameters": case.parameters or {},
                "expected": case.expected,
                "expect_unsupported": case.expect_unsupported,
                "unsupported_requirement_substr": case.unsupported_requirement_substr,
                "ordered": plan_is_ordered(case.plan),
                "required_profiles": sorted(case.required_profiles),
                "required_actions": sorted(case.required_actions),
                "required_functions": sorted(case.required_functions),
                "required_operators": sorted(case.required_operators),
                "required_types": sorted(case.required_types),
                "required_semantic_modes": sorted(case.required_semantic_modes),
                "required_join_modes": sorted(case.required_join_modes),
                "required_union_modes": sorted(case.required_union_modes),
                "required_collision_policies": sorted(case.required_collision_policies),
            }
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {"etlantic": etl.__version__, "cases": cases},
            ensure_ascii=False,
            default=str,
            indent=1,
        )
        + "\n",
        encoding="utf-8",
    )
    print(f"wrote {len(cases)} corpus cases to {path}")


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--corpus",
        type=Path,
        default=None,
        help="also dump ETLantic's own portable conformance corpus "
        "(etlantic.testing.portable_fixtures.FIXTURES, ~43 cases, ~60 KB) to this "
        "JSON file; off by default to keep the fixture set small",
    )
    args = parser.parse_args()
    out: Path = args.out
    if args.corpus is not None:
        dump_corpus(args.corpus)

    # Regenerate only what this script owns; keep README.md.
    for fx in FIXTURES:
        shutil.rmtree(out / fx.name, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)

    manifest: dict[str, Any] = {
        "generator": "scripts/etlantic_py_fixtures.py",
        "versions": {
            "python": sys.version.split()[0],
            "etlantic": etl.__version__,
            "dtcs": dtcs.__version__,
            "dtcs_spec": dtcs.SPEC_VERSION,
            "dpcs": dpcs.version(),
            "dpcs_spec": dpcs.dpcs_spec_version(),
            "pyodcs": dist_version("pyodcs"),
            "odcs_upstream_spec": pyodcs.UPSTREAM_SPEC_VERSION,
            "contractmodel": dist_version("contractmodel"),
        },
        "expected_output_engine": "etlantic local engine (LocalTransformCompiler, "
        "python-records/1), cross-checked against Pipeline.run",
        "row_comparison": "order-insensitive unless ordered=true (plan has dtcs:sort); "
        "compare rows as JSON objects (key order irrelevant)",
        "fixtures": [],
    }

    with tempfile.TemporaryDirectory(prefix="etlantic-py-fixtures-") as tmp:
        for fx in FIXTURES:
            fdir = out / fx.name
            plan = fx.transformation.to_transform_plan()
            write_json(fdir / "plan.json", plan)
            fingerprint = dtcs.plan_fingerprint(plan)
            assert fingerprint == fx.transformation.portable_fingerprint(), fx.name
            for port, rows in fx.inputs.items():
                write_jsonl(fdir / "input" / f"{port}.jsonl", rows)

            # Reload everything from disk so the expected output is what the
            # *serialised* plan produces.
            disk_plan = json.loads((fdir / "plan.json").read_text(encoding="utf-8"))
            assert dtcs.plan_fingerprint(disk_plan) == fingerprint, fx.name
            disk_inputs = {
                p.stem: read_jsonl(p) for p in sorted((fdir / "input").glob("*.jsonl"))
            }
            ordered = plan_is_ordered(disk_plan)
            requirements = fx.transformation.portable_definition().requirements
            supported, rows, analysis = run_plan_locally(
                disk_plan, disk_inputs, fx.parameters, requirements
            )
            if supported != fx.expect_supported:
                raise SystemExit(f"{fx.name}: supported={supported}, analysis={analysis}")

            entry: dict[str, Any] = {
                "name": fx.name,
                "description": fx.description,
                "transformation_id": fx.transformation.identity(),
                "plan": f"{fx.name}/plan.json",
                "plan_fingerprint": fingerprint,
                "inputs": {k: f"{fx.name}/input/{k}.jsonl" for k in fx.inputs},
                "parameters": fx.parameters,
                "actions": [
                    (a.get("kind") or {}).get("action") for a in disk_plan.get("actions") or []
                ],
                "requirements": requirements,
                "etlantic_local_supported": analysis["supported"],
                "ordered": ordered,
            }
            if analysis["findings"]:
                entry["etlantic_local_findings"] = analysis["findings"]
            if supported:
                pipeline_rows = run_pipeline(fx, Path(tmp) / fx.name)
                if normalize(pipeline_rows, ordered=ordered) != normalize(rows, ordered=ordered):
                    raise SystemExit(
                        f"{fx.name}: Pipeline.run {pipeline_rows!r} != local plan {rows!r}"
                    )
                write_jsonl(fdir / "expected" / "result.jsonl", rows)
                entry["expected"] = {"result": f"{fx.name}/expected/result.jsonl"}
                entry["expected_rows"] = len(rows)

                contracts = fdir / "contracts"
                fx.pipeline.write_contracts(contracts)
                entry["pipeline_id"] = fx.pipeline.identity()
                checks = check_contracts(contracts, fx.pipeline)
                by_kind: dict[str, list[str]] = {"odcs": [], "dtcs": [], "dpcs": []}
                for rel, info in checks["files"].items():
                    by_kind[info["kind"]].append(f"{fx.name}/contracts/{rel}")
                entry["contracts"] = by_kind  # all toolkit-valid (else we abort)
                entry["contracts_not_roundtripping"] = sorted(
                    rel
                    for rel, rt in checks["roundtrip"].items()
                    if not all(rt.values())
                )
            manifest["fixtures"].append(entry)
            print(
                f"{fx.name}: {len(rows)} rows, supported={supported}, "
                f"fingerprint={fingerprint[:16]}"
            )

    write_json(out / "manifest.json", manifest)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
