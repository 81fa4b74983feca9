"""RagKV servicer: converts messages and calls the engine, nothing else.

Errors are raised as ragkv.errors.* and mapped to status codes by
interceptors.ErrorInterceptor; every engine call goes through Admission so model
work is serialized and the wait is bounded; `should_stop` lets the engine stop
computing as soon as the RPC is cancelled or its deadline passes.
"""

from __future__ import annotations

import time
from typing import Callable, Iterator

import grpc

from ragkv import __version__
from ragkv.server import convert
from ragkv.server.admission import Admission
from ragkv.v1 import ragkv_pb2 as pb
from ragkv.v1 import ragkv_pb2_grpc
from workers.protocol import EngineProtocol


def _stopper(context: grpc.ServicerContext) -> Callable[[], bool]:
    return lambda: not context.is_active()


class RagKVServicer(ragkv_pb2_grpc.RagKVServicer):
    def __init__(self, engine: EngineProtocol, admission: Admission):
        self.engine = engine
        self.admission = admission
        self.started = time.monotonic()

    def Ingest(self, request: pb.IngestRequest, context) -> pb.IngestResponse:
        texts = convert.ingest_texts(request)
        compression = convert.ingest_compression(request)
        extra = {} if compression is None else {"compression": compression}  # engines without it stay callable
        with self.admission.slot(_stopper(context)):
            refs = self.engine.ingest(texts, pin=request.pin, namespace=request.namespace, **extra)
        return convert.chunk_refs(refs)

    def Generate(self, request: pb.GenerateRequest, context) -> pb.GenerateResponse:
        req = convert.generate_request(request)
        stop = _stopper(context)
        with self.admission.slot(stop):
            result = self.engine.generate(req, should_stop=stop)
        return convert.generate_response(result)

    def GenerateStream(self, request: pb.GenerateRequest, context) -> Iterator[pb.GenerateStreamResponse]:
        req = convert.generate_request(request)
        stop = _stopper(context)
        with self.admission.slot(stop):
            for item in self.engine.generate_stream(req, should_stop=stop):
                if isinstance(item, str):
                    yield pb.GenerateStreamResponse(text=item)
                else:
                    yield pb.GenerateStreamResponse(result=convert.generate_response(item))

    def Lookup(self, request: pb.LookupRequest, context) -> pb.LookupResponse:
        ids = convert.chunk_ids(request.ids)
        namespace = convert.namespace(request.namespace)
        with self.admission.slot(_stopper(context)):
            present = self.engine.lookup(ids, namespace=namespace)
        return pb.LookupResponse(present=[bool(p) for p in present])

    def Pin(self, request: pb.PinRequest, context) -> pb.PinResponse:
        return pb.PinResponse(count=self._apply(self.engine.pin, request, context))

    def Unpin(self, request: pb.UnpinRequest, context) -> pb.UnpinResponse:
        return pb.UnpinResponse(count=self._apply(self.engine.unpin, request, context))

    def Evict(self, request: pb.EvictRequest, context) -> pb.EvictResponse:
        return pb.EvictResponse(count=self._apply(self.engine.evict, request, context))

    def _apply(self, method, request, context) -> int:
        ids = convert.chunk_ids(request.ids)
        namespace = convert.namespace(request.namespace)
        with self.admission.slot(_stopper(context)):
            return int(method(ids, namespace=namespace))

    def Stats(self, request: pb.StatsRequest, context) -> pb.StatsResponse:
        # Counters only: no admission slot, so stats stay answerable while a generation runs.
        server = pb.ServerStats(version=__version__, uptime_s=time.monotonic() - self.started,
                                in_flight=self.admission.in_flight, queued=self.admission.waiting,
                                max_queue=self.admission.max_queue)
        return pb.StatsResponse(server=server, engine_json=convert.stats_json(self.engine.stats()))
