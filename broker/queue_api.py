"""ReportQueue and Diagnose: snapshots pushed by any scheduler, and their diagnosis."""
from __future__ import annotations

import grpc

from broker.v1 import broker_pb2 as pb


def _unimplemented(context, what: str):
    context.abort(grpc.StatusCode.UNIMPLEMENTED, what)


def report_queue(svc, request: pb.ReportQueueRequest, context) -> pb.ReportQueueResponse:
    _unimplemented(context, "ReportQueue needs the queue diagnosis (policies.diagnose), which is not built yet.")


def diagnose(svc, request: pb.DiagnoseRequest, context) -> pb.DiagnoseResponse:
    _unimplemented(context, "Diagnose needs the queue diagnosis (policies.diagnose), which is not built yet.")
