"""A replica's host-memory KV tier: capacity, transfer links each way, what it holds.

Specification
-------------
Per-block bytes come from the model profile:
``block_bytes = layers x kv_heads x head_dim x 2 (K and V) x dtype_bytes x block_size``
(Llama-3-8B bf16, 16-token blocks: 32 x 8 x 128 x 2 x 2 x 16 = 2 MiB).

``HostTierConfig``: ``capacity_bytes`` (default 100 GB, the paper's CPU pool),
``d2h_bytes_s`` / ``h2d_bytes_s`` (default 25 GB/s each way: PCIe Gen5 x16 peaks near
55 GB/s, paged KV copies of 2 MiB blocks reach about half), ``latency_s`` per transfer
(default 50 us: launch and synchronisation). ``capacity_blocks(block_bytes)`` =
``capacity_bytes // block_bytes``; ``d2h_s(n)`` / ``h2d_s(n)``: one transfer of ``n``
bytes each way, the link idle (``latency + n / bandwidth``).

``Link``: one direction of the PCIe link, FIFO. A transfer of ``n`` bytes asked at ``t``
starts at ``max(t, busy_until)`` and ends ``latency + n / bandwidth`` later. Transfers
overlap compute (engine steps do not wait for them); only a request whose blocks are in
flight waits.

``HostTier``: the block keys held in host memory (``links``: the ``(d2h, h2d)`` pair
of ``Link`` objects, shared by every replica behind one host link; default its own),
LRU-ordered (a store or a use refreshes
a key), at most ``capacity_blocks``; storing into a full tier drops the least recently
used keys. ``run(keys, start, limit)`` = how many consecutive keys from ``start`` are held
(a prefix continued from host memory). Counters: ``stored_blocks``, ``dropped_blocks``.
A host copy stays after a reload (the next offload of the session then moves only its new
blocks), as vLLM's CPU offload keeps its copies.
KV events: with ``events`` set to a list (the simulator sets it to its replica's event list
when the router consumes KV events), each ``store`` appends one ``BlockStored`` of the keys it
added and one ``BlockRemoved`` of the keys its LRU dropped, in the order they happen (runs of
one kind merged into one event), both with ``medium="CPU"``: what
vLLM 0.32's offloading connector publishes for its CPU tier
(``kv_connector/v1/offloading/events.py``: ``BlockStored``/``BlockRemoved`` with ``medium``
``MEDIUM_CPU``, taken once the store completes). A block the node order (``lru_hosts``)
drops is reported by the tier that held it.

``share_hosts(hosts)``: the host tiers of one node's GPUs read one another (the engine's node
pool with ``growth`` 1, about: ``anchorage.node_agent.offload.node_pool``): each keeps its own capacity, LRU order
and links; ``run`` continues a prefix with keys a peer holds (the loader's own link; a
peer's key is not refreshed: its owner's order decides when it goes), and ``store`` skips
keys a peer holds (one copy per node: a session another GPU stored is not copied again).
``pool_hosts(hosts)``: the host tiers as one DRAM pool (a reference: one key table, LRU
over the pool, capacity the sum of theirs, each GPU its own links): what one allocator for
the whole node would add over ``share_hosts``. ``lru_hosts(hosts)``: the engine's node pool
(``anchorage.node_agent.offload.pool_manager``; docs/research/fleet.md, "What the node pool
leaves to one allocator"): each GPU keeps the blocks it stored in its own tier and reads its peers' as
``share_hosts``, but capacity and recency are the node's: a use of a block (a read, or a
store skipped because a peer holds it) refreshes it in its owner's order, any tier may grow while the node holds less than the sum of their
capacities, and a store into a full node drops the node's least recently used block,
whichever tier holds it. Counters stay per tier.

``recompute_s(profile, context_tokens, n_tokens)``: what the alternative to a transfer
costs, the prefill compute of ``n`` tokens after ``c`` tokens of context, with the FLOPs
of ``anchorage.sim.costmodel`` (``2 P n + 4 l d n (c + (n + 1) / 2)``) over the devices'
effective FLOP/s (``g x peak x mfu``; attention at ``attn_mfu`` where the profile has one:
``costmodel.compute_time_s``): the marginal time they add to a compute-bound
prefill step (the weights are read once per step whatever it holds).

``HostTierConfig.for_profile(profile, ...)``: the link a profile measured
(``host_d2h_bytes_s``, ``host_h2d_bytes_s``, ``host_link_latency_s``, set by a calibration
file), the defaults above where it measured none; explicit arguments win.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

GB = 1e9


def recompute_s(profile, context_tokens: int, n_tokens: int) -> float:
    """Prefill compute time of ``n_tokens`` after ``context_tokens`` (seconds)."""
    from anchorage.sim.costmodel import compute_time_s, prefill_flops

    if n_tokens <= 0:
        return 0.0
    return compute_time_s(profile, *prefill_flops(profile.model, n_tokens, context_tokens))


def block_bytes(model, block_size: int) -> int:
    """KV bytes of one block: layers x KV heads x head dim x 2 x dtype bytes x block size."""
    return (model.layers * model.kv_heads * model.head_dim * 2 * model.dtype_bytes
            * block_size)


@dataclass(frozen=True)
class HostTierConfig:
    capacity_bytes: float = 100 * GB
    d2h_bytes_s: float = 25 * GB
    h2d_bytes_s: float = 25 * GB
    latency_s: float = 50e-6

    def __post_init__(self) -> None:
        if not self.capacity_bytes >= 0:
            raise ValueError("host tier capacity must be >= 0")
        if not (self.d2h_bytes_s > 0 and self.h2d_bytes_s > 0):
            raise ValueError("host tier bandwidths must be > 0")
        if not self.latency_s >= 0:
            raise ValueError("host tier latency must be >= 0")

    def capacity_blocks(self, bytes_per_block: int) -> int:
        return int(self.capacity_bytes // max(1, bytes_per_block))

    @classmethod
    def for_profile(cls, profile, **explicit) -> "HostTierConfig":
        """This config with the profile's measured link where it has one; ``explicit``
        fields (e.g. ``d2h_bytes_s``) win over both."""
        measured = {"d2h_bytes_s": profile.host_d2h_bytes_s,
                    "h2d_bytes_s": profile.host_h2d_bytes_s,
                    "latency_s": profile.host_link_latency_s}
        fields = {k: v for k, v in measured.items() if v is not None}
        fields.update({k: v for k, v in explicit.items() if v is not None})
        return cls(**fields)

    def d2h_s(self, nbytes: float) -> float:
        """Duration of one device-to-host transfer of ``nbytes``, the link idle."""
        return self.latency_s + nbytes / self.d2h_bytes_s

    def h2d_s(self, nbytes: float) -> float:
        """Duration of one host-to-device transfer of ``nbytes``, the link idle."""
        return self.latency_s + nbytes / self.h2d_bytes_s


class Link:
    """One transfer direction: FIFO, ``latency + bytes / bandwidth`` per transfer."""

    __slots__ = ("busy_until", "bw", "bytes", "latency", "transfers")

    def __init__(self, bytes_s: float, latency_s: float = 0.0):
        self.bw = bytes_s
        self.latency = latency_s
        self.busy_until = 0.0
        self.bytes = 0
        self.transfers = 0

    def duration(self, nbytes: float) -> float:
        return self.latency + nbytes / self.bw

    def schedule(self, now: float, nbytes: float) -> float:
        """Queue a transfer asked at ``now``; returns when it completes."""
        start = max(self.busy_until, now)
        end = start + self.duration(nbytes)
        self.busy_until = end
        self.bytes += int(nbytes)
        self.transfers += 1
        return end


class HostTier:
    """Keys held in host memory (LRU, bounded) and the two links of one replica."""

    def __init__(self, cfg: HostTierConfig, bytes_per_block: int,
                 links: tuple[Link, Link] | None = None):
        self.cfg = cfg
        self.block_bytes = bytes_per_block
        self.capacity_blocks = cfg.capacity_blocks(bytes_per_block)
        self.keys: OrderedDict[Hashable, None] = OrderedDict()
        if links is None:  # this replica's own link, one direction each
            links = (Link(cfg.d2h_bytes_s, cfg.latency_s), Link(cfg.h2d_bytes_s, cfg.latency_s))
        self.d2h, self.h2d = links  # shared by the replicas behind one host link
        self.stored_blocks = 0
        self.dropped_blocks = 0
        self.peers: tuple[HostTier, ...] = ()  # the node's other tiers (share_hosts)
        self.node: _NodeLRU | None = None        # the node's capacity and order (lru_hosts)
        self.events: list | None = None          # CPU-medium KV events, when a router reads them

    @property
    def free_blocks(self) -> int:
        if self.node is not None:
            return self.node.budget - self.node.used
        return self.capacity_blocks - len(self.keys)

    def __contains__(self, key: Hashable) -> bool:
        return key in self.keys

    def held(self, key: Hashable) -> bool:
        """In this tier or a peer's (``share_hosts``)."""
        return key in self.keys or self._in_peers(key)

    def _in_peers(self, key: Hashable) -> bool:
        return any(key in p.keys for p in self.peers)

    def _read_peer(self, key: Hashable) -> bool:
        """In a peer's tier; with a node order (``lru_hosts``) the read refreshes it there."""
        node = self.node
        for p in self.peers:
            if key in p.keys:
                if node is not None:
                    p.keys.move_to_end(key)
                    p.keys[key] = node.tick()
                return True
        return False

    def round_trip_s(self, blocks_out: int, blocks_in: int) -> float:
        """Time to move ``blocks_out`` to host and ``blocks_in`` back, links idle."""
        bb = self.block_bytes
        return self.d2h.duration(blocks_out * bb) + self.h2d.duration(blocks_in * bb)

    def store(self, keys: Iterable[Hashable]) -> None:
        """Hold ``keys`` (a completed offload); the least recently used keys make room."""
        self._store(keys, self.events is not None)

    def emit(self, stored: bool, key: Hashable) -> None:
        """One key's CPU-medium KV event, in the order they happen (module specification):
        merged into the stream's last event when that is the same kind from this tier."""
        from anchorage.routing.events import CPU, BlockRemoved, BlockStored

        ev = self.events
        if ev is None:
            return
        kind = BlockStored if stored else BlockRemoved
        last = ev[-1] if ev else None
        if type(last) is kind and last.medium == CPU:
            last.keys.append(key)
        else:
            ev.append(kind(keys=[key], medium=CPU))

    def _store(self, keys: Iterable[Hashable], events: bool) -> None:
        held = self.keys
        cap = self.capacity_blocks
        node = self.node
        for k in keys:
            if k in held:
                held.move_to_end(k)
                if node is not None:
                    held[k] = node.tick()
                continue
            if self.peers and self._read_peer(k):
                continue  # one copy per node
            if node is not None:
                if not node.make_room():
                    return
                held[k] = node.tick()
                node.used += 1
                self.stored_blocks += 1
                if events:
                    self.emit(True, k)
                continue
            if cap <= 0:
                return
            while len(held) >= cap:
                k0, _ = held.popitem(last=False)
                self.dropped_blocks += 1
                if events:
                    self.emit(False, k0)
            held[k] = None
            self.stored_blocks += 1
            if events:
                self.emit(True, k)

    def run(self, keys: Sequence[Hashable], start: int, limit: int) -> int:
        """Consecutive keys from ``start`` (up to ``limit``) held here; refreshes them."""
        held = self.keys
        n = start
        while n < limit:
            k = keys[n]
            if k in held:
                held.move_to_end(k)
                if self.node is not None:
                    held[k] = self.node.tick()
            elif not (self.peers and self._read_peer(k)):
                break
            n += 1
        return n - start


def share_hosts(hosts: Sequence[HostTier]) -> None:
    """Make ``hosts`` (one node's GPUs) read one another (module specification)."""
    for h in hosts:
        h.peers = tuple(p for p in hosts if p is not h)


class _NodeLRU:
    """The node's capacity and recency order over its GPUs' own tiers (``lru_hosts``):
    each tier's keys map to the tick of their last use, so a tier's first key is its least
    recently used and the node's is the oldest of those."""

    __slots__ = ("budget", "clock", "hosts", "used")

    def __init__(self, hosts: Sequence[HostTier]):
        self.hosts = tuple(hosts)
        self.budget = sum(h.capacity_blocks for h in hosts)
        self.used = sum(len(h.keys) for h in hosts)
        self.clock = 0

    def tick(self) -> int:
        self.clock += 1
        return self.clock

    def make_room(self) -> bool:
        """Room for one more block: the node's least recently used goes while it is full
        (False when the node has no capacity at all)."""
        if self.budget <= 0:
            return False
        while self.used >= self.budget:
            oldest = min((h for h in self.hosts if h.keys),
                         key=lambda h: next(iter(h.keys.values())))
            k0, _ = oldest.keys.popitem(last=False)
            oldest.dropped_blocks += 1
            self.used -= 1
            if oldest.events is not None:
                oldest.emit(False, k0)
        return True


def lru_hosts(hosts: Sequence[HostTier]) -> None:
    """Make ``hosts`` (one node's GPUs) read one another with the node's capacity and LRU
    order over their own tiers (module specification)."""
    share_hosts(hosts)
    node = _NodeLRU(hosts)
    for h in hosts:
        for k in h.keys:
            h.keys[k] = node.tick()
        h.node = node


def pool_hosts(hosts: Sequence[HostTier]) -> None:
    """Make ``hosts`` (one node's GPUs) one DRAM pool (module specification): they share one
    key table from now on; what they held before is merged, most recent last."""
    if not hosts:
        return
    pool: OrderedDict[Hashable, None] = OrderedDict()
    for h in hosts:
        pool.update(h.keys)
    cap = sum(h.capacity_blocks for h in hosts)
    for h in hosts:
        h.keys = pool
        h.capacity_blocks = cap
