"""Hard limits of the wire, in one place.

Every decoder in ``protocol/`` checks these before it allocates anything sized by the peer. The numbers are
generous for a LAN training job and small enough that a hostile peer cannot make us allocate more than a
bounded amount per message. Per-message limits (``max_size`` of each message type, ``max_len`` field
metadata) can only tighten them.
"""

from __future__ import annotations

# --- control messages (msgpack) ---
MAX_MESSAGE_SIZE = 4 * 1024 * 1024
"""No message type may declare a ``max_size`` above this."""
MAX_SCHEMA_DEPTH = 8
"""Nesting depth of a message schema (message -> tuple -> message ...). Decoding follows the schema, so input
nesting deeper than the schema is rejected at the first level that does not match."""
MAX_STR_LEN = 64 * 1024
"""Default limit on one str field (UTF-8 bytes on the wire)."""
MAX_BIN_LEN = 4 * 1024 * 1024
"""Default limit on one bytes field."""
MAX_ARRAY_LEN = 65_536
"""Default limit on one tuple field's element count."""
MAX_MAP_LEN = 64
"""A message is a map of at most this many fields."""

# --- envelope ---
MAX_FRAME_SIZE = 256 * 1024 * 1024
"""Default cap on a whole signed frame (header + signature + payload)."""

# --- tensor frames ---
TENSOR_MAX_NDIM = 8
TENSOR_MAX_DIM = 2**31 - 1
TENSOR_MAX_BYTES = 1024 * 1024 * 1024
"""Default cap on the decoded size of one tensor (numel * itemsize)."""
TENSOR_MAX_PARAMS = 64
"""Codec parameters are a few fixed-size integers; anything longer is malformed."""
