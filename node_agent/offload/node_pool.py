"""The node pool: every engine's host tier on a node readable by the node's other engines,
so a session the router moves to another GPU of the node reloads its history from host
memory instead of recomputing it (the simulator's ``TieringConfig.host_scope = "node"``,
``anchorage.tiering.host_tier.share_hosts``).

Specification
-------------
Configured by ``kv_connector_extra_config["anchorage"]["node_pool_dir"]``: a directory the
node's engines share (a tmpfs: ``/dev/shm/...`` or a hostPath on one). Each engine keeps its
own host tier (its policy, its stores and evictions; its share of the node's capacity,
``cpu_bytes_to_use``, and up to ``node_pool_growth`` times that while the node has room:
the node-wide LRU of ``pool_manager``) and publishes it there, in files named by its engine
id:

- ``<id>.idx`` (the scheduler side): a header page (``MAGIC``, then a JSON object: format,
  fingerprint, chunk count; at its end the engine's share and chunks held (uint64 each), its
  LRU tail's last use (float64, ``clock`` seconds: ``time.monotonic``, one clock per node)
  and the change counter) and per chunk a version (uint64), the key's digest (16 bytes,
  BLAKE2b of vLLM's ``OffloadKey``) and a read stamp (float64: when a peer last used the
  chunk, written by that peer). A chunk whose store completed: digest set, version
  incremented to an even number (readable). A chunk evicted or freed (before its slot is
  written again) or the tier reset: version incremented to an odd number (not readable),
  then its pages punched out of the engine's data files (``madvise(MADV_REMOVE)``, whole
  pages of the chunk), before the slot can be written again: the node's memory holds the
  chunks its engines hold.
- ``<id>.r<rank>.kv`` (the transfer worker of each rank): a header page (``MAGIC``, then the
  layout: each KV tensor's page bytes, blocks per chunk, chunk count) and the worker's host
  buffers, one per KV tensor (page-aligned), ``chunks x blocks_per_chunk x page`` bytes: the
  host tier's memory is this mapping (no other copy).

A file is created under a temporary name, locked (``flock``, held for the engine's life),
then renamed: a file whose lock another process can take belongs to an engine that is gone,
and is removed by the next engine that scans the directory. An engine removes its files at
shutdown.

Peers: the other ``.idx`` files with the same fingerprint (model, KV layout, block size,
blocks per chunk, parallel layout, the block-hash function and its seed: vLLM's hashes are
then the same for the same tokens) and a live owner; scanned every ``scan_s`` (1 s). A peer
with another fingerprint is ignored (logged once): it could never share a block.

Reading (the scheduler side, ``PoolIndex``): at most every ``refresh_s`` (50 ms), each peer
whose change counter (the index header's last 8 bytes, incremented by every publish and
retraction) moved has its version array compared with the last one seen, and the changed
chunks, at most ``REFRESH_MAX`` (4,096) per refresh over all peers (a joining peer's
chunks over several), update a table digest -> (peer, chunk); ``find(key)`` is a hit only
while the chunk's current version is even (checked at the lookup), and any failure of the
pool is a miss (logged once), never an error in the engine. Cost
(``bench/bench_node_pool.py``, BENCHMARKS.md): ~3 us a lookup. vLLM's lookup then counts the chunk as a host hit (``get_load_source``:
``HOST``); its load spec (``NodeLoadStoreSpec``) carries, per chunk, the owner (-1: this
engine) and the version seen. The worker (``PoolData``) copies a peer's chunk from the
peer's ``.kv`` mapping over this engine's own link, then reads the version again: changed
(the owner evicted the chunk meanwhile) or the peer gone, the load fails and vLLM recomputes
the blocks (``kv_load_failure_policy = recompute``), as for any failed load. A load from a
peer, and a store skipped because a peer holds the block, write the peer's read stamp; the
owner refreshes those chunks in its policy at its next refresh.

Stores skip keys a peer holds readable (one copy per node). Tenants: vLLM's block hashes
include the request's ``cache_salt``, so requests with different salts never share a block
across engines either. Files are created mode 0600: the node's engines run as one user.

x86 (TSO) stores are seen in program order, which the version check relies on (the owner
increments the version before its worker overwrites a chunk; the reader copies, then reads
the version).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import mmap
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

log = logging.getLogger("anchorage.node_agent.offload")

MAGIC = b"ANCHPOOL"
FORMAT = 2
PAGE = mmap.PAGESIZE
HEADER = 4096
SHARE_AT = HEADER - 32  # an index's share of the node's capacity (chunks, uint64)
USED_AT = HEADER - 24   # the chunks it holds (uint64)
TAIL_AT = HEADER - 16   # when its least recently used chunk was last used (float64)
EPOCH_AT = HEADER - 8   # an index's change counter: the header page's last 8 bytes
DIGEST = 16
REFRESH_MAX = 4096      # changed chunks one refresh takes in (the rest: the next ones)


class NodePoolError(RuntimeError):
    """The node pool's directory cannot be used (the message names it)."""


def digest(key: bytes) -> bytes:
    return hashlib.blake2b(bytes(key), digest_size=DIGEST).digest()


def _align(n: int) -> int:
    return -(-n // PAGE) * PAGE


def fingerprint(parts: dict[str, Any]) -> str:
    """A stable digest of what must match for two engines to share chunks."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _header(meta: dict[str, Any]) -> bytes:
    body = json.dumps(meta, sort_keys=True).encode()
    out = MAGIC + len(body).to_bytes(4, "little") + body
    if len(out) > SHARE_AT:
        raise NodePoolError("node pool header too large")
    return out


def _read_header(buf) -> dict[str, Any] | None:
    if bytes(buf[:8]) != MAGIC:
        return None
    n = int.from_bytes(bytes(buf[8:12]), "little")
    try:
        return json.loads(bytes(buf[12:12 + n]))
    except ValueError:
        return None


class _Owned:
    """A file this process created, mapped read-write, locked for its life."""

    def __init__(self, directory: str, name: str, size: int, meta: dict[str, Any]):
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as exc:
            raise NodePoolError(f"node_pool_dir {directory!r}: {exc}") from exc
        self.path = os.path.join(directory, name)
        tmp = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        except OSError as exc:
            raise NodePoolError(f"node_pool_dir {directory!r}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.ftruncate(fd, size)
            self.mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            h = _header(meta)
            self.mm[:len(h)] = h
            os.rename(tmp, self.path)
        except BaseException:
            os.close(fd)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        self.fd = fd

    def close(self) -> None:
        if self.fd < 0:
            return
        try:
            os.unlink(self.path)
        except OSError:
            pass
        os.close(self.fd)  # releases the lock; the mapping stays valid until unmapped
        self.fd = -1


def _alive(path: str) -> bool | None:
    """Whether ``path``'s creator still holds its lock (None: the file is gone). A file
    whose creator is gone is removed."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        try:
            os.unlink(path)  # its engine is gone: nobody else will read it
        except OSError:
            pass
        return False
    finally:
        os.close(fd)


class _Peer:
    """Another engine's file, mapped read-only (``write``: an index whose read stamps this
    engine writes)."""

    def __init__(self, path: str, write: bool = False):
        fd = os.open(path, os.O_RDWR if write else os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if write else 0)
            self.mm = mmap.mmap(fd, size, mmap.MAP_SHARED, prot)
        finally:
            os.close(fd)
        self.path = path
        self.meta = _read_header(self.mm) or {}


def _epoch(mm) -> np.ndarray:
    return np.frombuffer(mm, dtype=np.uint64, count=1, offset=EPOCH_AT)


def _idx_arrays(mm, n: int) -> tuple[np.ndarray, np.ndarray]:
    versions = np.frombuffer(mm, dtype=np.uint64, count=n, offset=HEADER)
    digests = np.frombuffer(mm, dtype=np.uint8, count=n * DIGEST,
                            offset=HEADER + _align(8 * n)).reshape(n, DIGEST)
    return versions, digests


def _idx_reads(mm, n: int) -> np.ndarray:
    """Per chunk, when a peer last read it or skipped storing it (``clock`` seconds)."""
    return np.frombuffer(mm, dtype=np.float64, count=n,
                         offset=HEADER + _align(8 * n) + _align(DIGEST * n))


def _idx_usage(mm) -> tuple[np.ndarray, np.ndarray]:
    """An index's share and chunks held (uint64 x 2), and its LRU tail's stamp."""
    return (np.frombuffer(mm, dtype=np.uint64, count=2, offset=SHARE_AT),
            np.frombuffer(mm, dtype=np.float64, count=1, offset=TAIL_AT))


def _idx_size(n: int) -> int:
    return HEADER + _align(8 * n) + _align(DIGEST * n) + _align(8 * n)


@dataclass
class _PeerView:
    """What this engine knows of one peer's index: its mapping and arrays, its change
    counter and the value last taken in (-1: a backlog left), the versions last taken in,
    and per chunk the digest this engine's table holds for it."""

    file: _Peer
    versions: np.ndarray
    digests: np.ndarray
    epoch: np.ndarray
    seen_epoch: int
    last: np.ndarray
    held: list
    reads: np.ndarray
    usage: np.ndarray
    tail: np.ndarray

    def forget(self, table: dict, eid: str, c: int) -> None:
        """Chunk ``c``'s entry leaves ``table`` (if it is still this peer's)."""
        d = self.held[c]
        if d is not None and table.get(d, ("",))[0] == eid:
            del table[d]
        self.held[c] = None


class PoolIndex:
    """The scheduler side: this engine's published index and its view of the peers'."""

    def __init__(self, directory: str, engine_id: str, fp: str, num_chunks: int, *,
                 share: int | None = None, refresh_s: float = 0.05, scan_s: float = 1.0,
                 clock=time.monotonic) -> None:
        self.dir = directory
        self.engine_id = engine_id
        self.fp = fp
        self.n = int(num_chunks)
        self.share = self.n if share is None else int(share)
        self.refresh_s = refresh_s
        self.scan_s = scan_s
        self.clock = clock
        meta = {"format": FORMAT, "fingerprint": fp, "chunks": self.n, "engine": engine_id}
        self.own = _Owned(directory, f"{engine_id}.idx", _idx_size(self.n), meta)
        self.versions, self.digests = _idx_arrays(self.own.mm, self.n)
        self.reads = _idx_reads(self.own.mm, self.n)
        self._reads_seen = np.zeros(self.n, dtype=np.float64)
        self.usage, self.tail = _idx_usage(self.own.mm)
        self.usage[0] = self.share
        self.tail[0] = np.inf
        self.epoch = _epoch(self.own.mm)
        self._kv: list = []   # this engine's workers' data files (punch)
        self._kv_next = 0.0
        self.peers: dict[str, _PeerView] = {}
        self.table: dict[bytes, tuple[str, int]] = {}
        self._ignored: set[str] = set()
        self._next_scan = 0.0
        self._next_refresh = 0.0
        self.counts = {"peer_hits": 0, "peer_stale": 0, "deduplicated": 0, "errors": 0,
                       "punch_errors": 0}
        self._scan()  # the peers now; the files of engines that are gone are removed

    # -- this engine's chunks -----------------------------------------------------------

    def publish(self, chunk: int, key: bytes) -> None:
        v = int(self.versions[chunk])
        self.digests[chunk] = np.frombuffer(digest(key), dtype=np.uint8)
        self.versions[chunk] = v + 2 if v % 2 == 0 else v + 1  # even: readable
        self.epoch[0] += 1

    def retract(self, chunk: int) -> None:
        v = int(self.versions[chunk])
        if v % 2 == 0 and v > 0:
            self.versions[chunk] = v + 1
            self.epoch[0] += 1

    def retract_all(self) -> None:
        live = (self.versions % 2 == 0) & (self.versions > 0)
        self.versions[live] += 1
        self.epoch[0] += 1

    # -- the node's capacity and order (node-wide LRU) ---------------------------------------

    def set_usage(self, used: int, tail: float) -> None:
        """Publish the chunks this engine holds and its LRU tail's stamp."""
        self.usage[1] = max(0, int(used))
        self.tail[0] = tail

    def node(self) -> tuple[int, int, float]:
        """(the node's capacity, the chunks the node holds, the oldest LRU tail among the
        peers) over this engine and its live peers; this engine's usage as last set."""
        budget, used, oldest = int(self.usage[0]), int(self.usage[1]), float("inf")
        for view in self.peers.values():
            budget += int(view.usage[0])
            used += int(view.usage[1])
            oldest = min(oldest, float(view.tail[0]))
        return budget, used, oldest

    def stamp_read(self, eid: str, chunk: int) -> None:
        """A use of peer ``eid``'s chunk (a load from it, a store skipped because of it):
        its owner refreshes it at its next refresh."""
        view = self.peers.get(eid)
        if view is not None and 0 <= chunk < len(view.reads):
            view.reads[chunk] = self.clock()

    def reads_since(self) -> list[int]:
        """This engine's chunks a peer used since the last call."""
        fresh = np.nonzero(self.reads > self._reads_seen)[0]
        if len(fresh):
            self._reads_seen[fresh] = self.reads[fresh]
        return fresh.tolist()

    def punch(self, chunk: int) -> None:
        """Give the pages of this engine's chunk back to the node (its workers' files), so
        what the node's engines hold in memory is what they hold in chunks. A chunk's
        whole pages only; any failure leaves the pages (logged once)."""
        try:
            if not self._kv:
                now = self.clock()
                if now < self._kv_next:
                    return
                self._kv_next = now + self.scan_s
                self._map_kv()
            for mm, offsets, pages, bpc in self._kv:
                for off, page in zip(offsets, pages):
                    start = off + chunk * bpc * page
                    end = start + bpc * page
                    a, b = _align(start), end // PAGE * PAGE
                    if b > a:
                        mm.madvise(mmap.MADV_REMOVE, a, b - a)
        except (OSError, ValueError, KeyError):
            if not self.counts["punch_errors"]:
                log.warning("anchorage: node pool could not release a chunk's pages",
                            exc_info=True)
            self.counts["punch_errors"] += 1

    def _map_kv(self) -> None:
        prefix = self.engine_id + ".r"
        for name in sorted(os.listdir(self.dir)):
            if name.startswith(prefix) and name.endswith(".kv"):
                f = _Peer(os.path.join(self.dir, name), write=True)
                offsets, _ = PoolData._offsets(f.meta)
                self._kv.append((f.mm, offsets, f.meta["pages"], int(f.meta["bpc"])))

    # -- the peers --------------------------------------------------------------------------

    def _scan(self) -> None:
        try:
            names = os.listdir(self.dir)
        except OSError:
            names = []
        found = set()
        now = time.time()
        for name in names:
            path = os.path.join(self.dir, name)
            if name.startswith("."):  # a file being created; one left by a crash is removed
                try:
                    old = now - os.stat(path).st_mtime > 60
                except OSError:
                    continue
                if old and name.endswith(".tmp"):
                    _alive(path)
                continue
            if name.endswith(".kv"):
                if not name.startswith(self.engine_id + ".r"):
                    _alive(path)  # removed when its engine is gone
                continue
            if not name.endswith(".idx"):
                continue
            eid = name[:-4]
            if eid == self.engine_id:
                continue
            if eid in self.peers:
                if _alive(path):
                    found.add(eid)
                continue
            if eid in self._ignored or not _alive(path):
                continue
            try:
                p = _Peer(path, write=True)
                if p.meta.get("fingerprint") != self.fp or p.meta.get("format") != FORMAT:
                    raise ValueError("another model or KV layout")
                n = int(p.meta["chunks"])
                arrays = _idx_arrays(p.mm, n)
                reads = _idx_reads(p.mm, n)
                usage, tail = _idx_usage(p.mm)
            except OSError:
                continue
            except (KeyError, TypeError, ValueError) as exc:
                self._ignored.add(eid)
                log.warning("anchorage: node pool peer %s is not shared (%s)", eid, exc)
                continue
            self.peers[eid] = _PeerView(p, *arrays, epoch=_epoch(p.mm), seen_epoch=-1,
                                        last=np.zeros(n, dtype=np.uint64), held=[None] * n,
                                        reads=reads, usage=usage, tail=tail)
            found.add(eid)
        for eid in [e for e in self.peers if e not in found]:
            self._drop(eid)

    def _drop(self, eid: str) -> None:
        view = self.peers.pop(eid)
        for c in range(len(view.held)):
            view.forget(self.table, eid, c)

    def refresh(self, force: bool = False) -> None:
        now = self.clock()
        if now >= self._next_scan or force:
            self._next_scan = now + self.scan_s
            self._scan()
        if now < self._next_refresh and not force:
            return
        self._next_refresh = now + self.refresh_s
        budget = REFRESH_MAX
        for eid, view in self.peers.items():
            e = int(view.epoch[0])
            if e == view.seen_epoch:
                continue  # nothing published or retracted since
            versions = view.versions
            changed = np.nonzero(versions != view.last)[0]
            if len(changed) > budget:
                changed = changed[:budget]  # the rest at the next refreshes
                e = -1
            budget -= len(changed)
            for c in changed.tolist():
                view.forget(self.table, eid, c)
                v = int(versions[c])
                view.last[c] = v
                if v % 2 == 0 and v > 0:
                    d = view.digests[c].tobytes()
                    if int(versions[c]) == v:  # not changed while read
                        view.held[c] = d
                        self.table[d] = (eid, c)
            view.seen_epoch = e

    def find(self, key: bytes) -> tuple[str, int, int] | None:
        """(peer, chunk, version) of a readable copy of ``key`` in a peer's tier; None on
        any failure of the pool (logged once): the lookup is then a miss."""
        try:
            return self._find(key)
        except Exception:  # noqa: BLE001 - the serving path never breaks on the pool
            if not self.counts["errors"]:
                log.warning("anchorage: node pool lookup failed; treated as a miss",
                            exc_info=True)
            self.counts["errors"] += 1
            return None

    def _find(self, key: bytes) -> tuple[str, int, int] | None:
        self.refresh()
        if not self.table:
            return None
        d = digest(key)
        hit = self.table.get(d)
        if hit is None:
            return None
        eid, c = hit
        view = self.peers.get(eid)
        v = int(view.versions[c]) if view is not None else 1
        if v % 2 or view.digests[c].tobytes() != d:
            self.counts["peer_stale"] += 1
            return None
        return eid, c, v

    def close(self) -> None:
        self.own.close()
        self.peers.clear()
        self.table.clear()


class PoolData:
    """The worker side: this engine's host buffers in the pool directory, and the peers'
    buffers and versions, mapped on first use."""

    def __init__(self, directory: str, engine_id: str, rank: int, pages: Sequence[int],
                 blocks_per_chunk: int, num_chunks: int) -> None:
        self.dir = directory
        self.rank = int(rank)
        self.layout = {"format": FORMAT, "pages": [int(p) for p in pages],
                       "bpc": int(blocks_per_chunk), "chunks": int(num_chunks)}
        self.offsets, size = self._offsets(self.layout)
        self.own = _Owned(directory, f"{engine_id}.r{self.rank}.kv", size, self.layout)
        self.buffers = self._views(self.own.mm, self.layout, self.offsets)
        self.peers: dict[str, tuple[_Peer, list, np.ndarray] | None] = {}

    @staticmethod
    def _offsets(layout: dict[str, Any]) -> tuple[list[int], int]:
        off, out = HEADER, []
        for page in layout["pages"]:
            out.append(off)
            off += _align(layout["chunks"] * layout["bpc"] * page)
        return out, off

    @staticmethod
    def _views(mm, layout: dict[str, Any], offsets: Sequence[int]) -> list:
        """Torch views of the buffers, ``(chunks x bpc, page)`` int8 each (a peer's
        mapping is read-only: its views are only ever read)."""
        import warnings

        import torch

        rows = layout["chunks"] * layout["bpc"]
        out = []
        for page, off in zip(layout["pages"], offsets):
            a = np.frombuffer(mm, dtype=np.int8, count=rows * page, offset=off)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch warns on a read-only buffer
                out.append(torch.from_numpy(a).view(rows, page))
        return out

    @property
    def host_bytes(self) -> int:
        return sum(int(b.numel()) for b in self.buffers)

    def peer(self, eid: str) -> tuple[list, np.ndarray] | None:
        """A peer's buffers (same layout as this engine's) and its version array; None when
        it is gone or laid out otherwise."""
        kv = os.path.join(self.dir, f"{eid}.r{self.rank}.kv")
        got = self.peers.get(eid)
        if got is not None and not os.path.exists(kv):
            del self.peers[eid]  # its engine is gone: unmapped once its views are dropped
            return None
        if got is None:
            idx = os.path.join(self.dir, f"{eid}.idx")
            try:
                data, index = _Peer(kv), _Peer(idx)
            except OSError:
                return None
            meta = data.meta
            if {k: meta.get(k) for k in ("format", "pages", "bpc")} != {
                    k: self.layout[k] for k in ("format", "pages", "bpc")}:
                log.warning("anchorage: node pool peer %s has another KV layout", eid)
                return None
            n = int(meta["chunks"])
            offsets, _ = self._offsets(meta)
            bufs = self._views(data.mm, meta, offsets)
            versions, _ = _idx_arrays(index.mm, int(index.meta.get("chunks", 0)))
            if len(versions) < n:
                return None
            got = self.peers[eid] = (data, bufs, versions)
        return got[1], got[2]

    def close(self) -> None:
        self.buffers = []
        self.peers.clear()
        self.own.close()
