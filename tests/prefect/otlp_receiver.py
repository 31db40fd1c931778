"""An OTLP/HTTP trace receiver on localhost, run by a test: what a collector would receive, read back as spans.

The flow-run processes of the live deployment export with the SDK's standard OTLP/HTTP exporter
(``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``); this server accepts ``POST /v1/traces`` (protobuf),
decodes each ``ExportTraceServiceRequest`` with ``opentelemetry-proto`` and keeps the spans as
plain dicts (ids in hex, attributes as Python values), so the test asserts on what was sent.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


class OtlpReceiver:
    """``with OtlpReceiver() as r:`` ... ``r.endpoint`` for the exporter, ``r.spans()`` for the test."""

    def __init__(self) -> None:
        self._spans: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
                    ExportTraceServiceRequest,
                    ExportTraceServiceResponse,
                )

                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver._add(request)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self._thread = threading.Thread(target=self.server.serve_forever, name="otlp-receiver", daemon=True)

    def _add(self, request: Any) -> None:
        found = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for sp in scope_spans.spans:
                    found.append({
                        "name": sp.name, "scope": scope_spans.scope.name, "trace_id": sp.trace_id.hex(),
                        "span_id": sp.span_id.hex(), "parent_span_id": sp.parent_span_id.hex() or None,
                        "attributes": {a.key: _value(a.value) for a in sp.attributes},
                        "resource": resource, "start": sp.start_time_unix_nano, "end": sp.end_time_unix_nano})
        with self._lock:
            self._spans.extend(found)

    def spans(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._spans)

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
