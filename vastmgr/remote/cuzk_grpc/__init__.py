"""Curio's cuzk daemon over its gRPC API, `cuzk.v1.ProvingEngine` (see docs/upstream-cuzk.md).

`proving.proto` is upstream's wire contract; `proving_pb2*` are generated from it by grpcio-tools
(`generate.py`); `client.py` is the product's typed client over TCP, a unix socket, or either
through a machine's SSH link.
"""
