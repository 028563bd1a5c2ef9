"""The Python twin of the SQL routing functions (sql/routing.sql).

Both must agree byte for byte with Awa: see docs/sql-api.md, "Routing".
"""

from __future__ import annotations

MASK64 = (1 << 64) - 1
HASH64_OFFSET = 14695981039346656037
HASH64_PRIME = 1099511628211
PARTITION_SALT = 0x9D4D1B2F53A70C91
STRIPE_SALT = 0x6A09E667F3BCC909
MAX_SHARDS = 64  # S, a queue's enqueue shards: 1..64 (awa.queue_meta's check)
MAX_PARTITIONS = 32767  # physical queues of one partitioned queue

Key = bytes | bytearray | memoryview | str


def key_bytes(key: Key, what: str = "a key") -> bytes:
    """An ordering or unique key as the bytes sent and hashed: a str as UTF-8,
    bytes as they are. Anything else is refused: ``bytes(5)`` is five zero
    bytes, not "5"."""
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, bytes | bytearray | memoryview):
        return bytes(key)
    raise TypeError(f"{what} must be str or bytes (or bytearray, memoryview),"
                    f" got {type(key).__name__}: {key!r:.80}")


def ordering_key_hash64(key: Key) -> int:
    """h = 14695981039346656037; per byte h = h * 1099511628211 + b (mod 2^64).

    Multiply, then add: this is not FNV-1a, which XORs.
    """
    h = HASH64_OFFSET
    for b in key_bytes(key):
        h = (h * HASH64_PRIME + b) & MASK64
    return h


def shard_for_ordering_key(key: Key, shards: int) -> int:
    """0 when shards <= 1, else hash64 mod shards, for the S a queue can have."""
    if shards > MAX_SHARDS:
        raise ValueError(f"shards must be at most {MAX_SHARDS} (a queue's enqueue shards are"
                         f" 1 to {MAX_SHARDS}), got {shards}")
    return 0 if shards <= 1 else ordering_key_hash64(key) % shards


def _mix64(key: Key, salt: int) -> int:
    v = ordering_key_hash64(key) ^ salt
    v ^= v >> 30
    v = (v * 0xBF58476D1CE4E5B9) & MASK64
    v ^= v >> 27
    v = (v * 0x94D049BB133111EB) & MASK64
    v ^= v >> 31
    return v


def partition_hash64(key: Key) -> int:
    """hash64 xor 0x9d4d1b2f53a70c91, then the splitmix64 finaliser."""
    return _mix64(key, PARTITION_SALT)


def stripe_for_ordering_key(key: Key, stripes: int) -> int:
    """awa-sql's stripe hash: like the partition hash with its own salt."""
    return 0 if stripes <= 1 else _mix64(key, STRIPE_SALT) % stripes


def partition_for_ordering_key(key: Key, partitions: int) -> int:
    return 0 if partitions <= 1 else partition_hash64(key) % partitions


def partition_queue_names(logical_queue: str, partitions: int) -> list[str]:
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise ValueError(f"partitions must be between 1 and {MAX_PARTITIONS}, got {partitions}")
    return [logical_queue] + [f"{logical_queue}__p{i}" for i in range(1, partitions)]
