"""docs/api.md cannot drift: it lists exactly the HTTP routes of the gateway's OpenAPI and the rpcs of the proto."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from stitchcuda.api.v1 import gateway_pb2
from stitchcuda.gateway import errors
from stitchcuda.gateway.http_app import create_app
from stitchcuda.gateway.settings import GatewaySettings

API_DOC = Path(__file__).resolve().parents[3] / "docs" / "api.md"
ROUTE = re.compile(r"`(GET|POST|PUT|PATCH|DELETE) (/[^`\s]*)`")
RPC_ROW = re.compile(r"^\| `(\w+)` \| `(\w+)` \| `((?:stream )?\w+)` \|$", re.MULTILINE)


@pytest.fixture(scope="module")
def openapi() -> dict[str, Any]:
    spec: dict[str, Any] = create_app(GatewaySettings()).openapi()
    return spec


@pytest.fixture(scope="module")
def doc() -> str:
    return API_DOC.read_text()


def test_every_openapi_route_is_documented_and_every_documented_route_exists(
    openapi: dict[str, Any], doc: str
) -> None:
    served = {(method.upper(), path) for path, ops in openapi["paths"].items() for method in ops}
    documented = set(ROUTE.findall(doc))
    assert served - documented == set(), "routes missing from docs/api.md"
    assert documented - served == set(), "docs/api.md names routes the gateway does not serve"


def test_the_auth_headers_of_the_openapi_are_documented(openapi: dict[str, Any], doc: str) -> None:
    schemes = openapi["components"]["securitySchemes"].values()
    headers = {s["name"] for s in schemes if s["type"] == "apiKey"}
    assert headers and all(f"`{h}: <key>`" in doc for h in headers)
    if any(s["type"] == "http" and s.get("scheme") == "bearer" for s in schemes):
        assert "`Authorization: Bearer <key>`" in doc


def test_every_rpc_of_the_job_service_is_documented_with_its_types(doc: str) -> None:
    service = gateway_pb2.DESCRIPTOR.services_by_name["JobService"]
    proto = {
        (m.name, m.input_type.name, ("stream " if m.server_streaming else "") + m.output_type.name)
        for m in service.methods
    }
    documented = set(RPC_ROW.findall(doc))
    assert proto - documented == set(), "rpcs missing from docs/api.md (or with other types)"
    assert documented - proto == set(), "docs/api.md names rpcs the proto does not define"
    assert f"`{service.full_name}`" in doc


def test_every_error_status_of_the_mapping_table_is_documented(doc: str) -> None:
    rows = [line for line in doc.splitlines() if line.startswith("| `") and "` | " in line]
    for status in {*errors.TABLE.values(), errors.INTERNAL}:
        assert any(f"| {status.http} | `{status.grpc.name}` |" in row for row in rows), status
