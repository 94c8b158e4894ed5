"""The Arceus wire, with no I/O.

Owns message types, the msgpack codec with hard limits, the signed envelope, tensor frames, compression codecs,
replay windows and the error families. Nothing here imports trio, grpc, zeroconf or reads a clock: callers pass
``now`` in. See ``ARCHITECTURE.md`` ("The wire").
"""

PROTOCOL_VERSION = 1
