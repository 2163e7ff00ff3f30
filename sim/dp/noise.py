"""Integer noise expanded from a 32-byte seed through the AES-256-CTR keystream, so a seed reproduces it.

A client's noise component must be regenerated exactly by whoever holds its seed (XNoise removal: the
server rebuilds and subtracts a component from the seed a survivor reveals or from its Shamir shares), so
every sampler here takes ``seed: bytes`` and reads its randomness from nothing else: the AES-256-CTR
keystream of the seed, as the mask PRG (:mod:`sim.crypto.prg`) does, read as little-endian 64-bit words
``w_0, w_1, ...`` and turned into uniforms on (0, 1] as ``((w >> 11) + 1/2) / 2^53`` in float64 (53 random
bits below 1/2, where the half is exact; above, float64 rounds it to even, a 2^-52 grid that reaches 1 for
the largest word). Never 0, so logarithms are finite; every sampler accepts 1.

Domain separation: the masks use the zero initial counter block; noise uses the initial counter block
``b"dp-noise" || 0^8`` (an 8-byte nonce, then a 64-bit block counter from zero), and the rotation signs of
:mod:`sim.dp.dskellam` use ``b"dp-signs" || 0^8``. Seeds are never reused across purposes anyway; the
separation makes a mistaken reuse harmless (mask and noise keystreams of one seed are unrelated).

Order of consumption (part of the output's definition, pinned by regression tests):
- ``skellam``: ``2 size`` Poisson(variance/2) draws ``N_0 .. N_(2 size - 1)``; output ``i`` is
  ``N_i - N_(size+i)``. Poisson mean < 10: inversion, uniform ``i`` gives draw ``i``. Mean >= 10: Hormann's
  PTRS; each pass gives every still-pending draw, in increasing index order, the next two uniforms ``(U, V)``;
  the rejected ones are pending in the next pass.
- ``gaussian``: uniform pair ``(u_2j, u_2j+1)`` gives outputs ``2j`` and ``2j + 1`` (Box-Muller).
- ``dgaussian``: each pass gives every pending output, in index order, the next three uniforms.

Every sampler returns int64 in integer units (the scaled domain of the encoding); ``variance`` is the
variance of the (continuous) distribution in integer units squared. float64 arithmetic is exact on the
integers involved, so variances are limited to ``MAX_VARIANCE`` = 2^50.

:func:`total` sums several components on threads, one component per thread: the sum of integers is the
same in any order. numpy's vector operations and OpenSSL's AES release the GIL, the sampler's Python between
them does not, so k threads gain less than k times (docs/performance.md, "Hot paths made fast" and "Not
done yet").
"""

from __future__ import annotations

import collections
import math
import operator
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

NOISE_DOMAIN = b"dp-noise"
"""The nonce half of the initial counter block of the noise keystream."""
SIGNS_DOMAIN = b"dp-signs"
"""The nonce half of the initial counter block of the DSkellam rotation signs."""

MECHANISMS = ("skellam", "gaussian", "dgaussian")
MAX_VARIANCE = 2.0**50
"""Largest accepted variance, integer units squared (far beyond any 32-bit modulus)."""
MAX_PASSES = 1000
"""Rejection passes after which a sampler gives up (each pass accepts most pending draws)."""
PTRS_MIN_MEAN = 10.0
"""Poisson means from which PTRS is used (Hormann's stated range); below it, inversion."""

_INVERSION_TERMS = 128
"""Poisson(mean < 10) support kept for inversion: P(X >= 128) < 1e-91."""
_STIRLING_FROM = 16
"""log k! from a table below this, from the Stirling series at and above it."""
_LOG_FACTORIAL = np.array([math.lgamma(k + 1.0) for k in range(max(_INVERSION_TERMS, _STIRLING_FROM))])
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_AES_BLOCK = 16
_CHUNK = 1 << 20
_ZEROS = memoryview(bytes(_CHUNK))
_BLOCK_DRAWS = 1 << 16
"""Draws processed together: big enough to amortise numpy's per-call cost, small enough to stay in cache."""
_GUIDE_BITS = 16
_GUIDE_BUCKETS = 1 << _GUIDE_BITS

_Proposal = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
"""Uniforms of a block of candidates -> (accept flags, candidate values as float64)."""


class Keystream:
    """The AES-256-CTR keystream of a 32-byte seed from the initial counter block ``domain || 0^8``, in order."""

    def __init__(self, seed: bytes, domain: bytes) -> None:
        if not isinstance(seed, bytes) or len(seed) != 32:
            raise ValueError(f"seed must be 32 bytes, not {seed!r:.80}")
        if len(domain) != 8:
            raise ValueError(f"domain must be 8 bytes, not {domain!r}")
        self._encryptor = Cipher(algorithms.AES256(seed), modes.CTR(domain + bytes(8))).encryptor()

    def read(self, n: int) -> np.ndarray:
        """The next ``n`` keystream bytes (uint8), in a fresh array."""
        return self.read_into(np.empty(n + _AES_BLOCK - 1, dtype=np.uint8), n)

    def read_into(self, buf: np.ndarray, n: int) -> np.ndarray:
        """The next ``n`` keystream bytes written into ``buf`` (uint8, at least ``n + 15`` long: AES-CTR's
        ``update_into`` wants a block of slack), returned as ``buf[:n]``.

        Encrypts a shared zero chunk: allocating ``n`` zero bytes to encrypt costs several times the AES
        itself. Reusing ``buf`` across blocks matters as much: a fresh model-sized array costs a page fault
        per 4 KiB whenever the allocator has returned the last one to the system."""
        if buf.size < n + _AES_BLOCK - 1:
            raise ValueError(f"keystream buffer of {buf.size} bytes is too small for {n} (+15)")
        view = buf.data
        for start in range(0, n, _CHUNK):
            self._encryptor.update_into(_ZEROS[: min(_CHUNK, n - start)], view[start:])
        return buf[:n]

    def words(self, n: int) -> np.ndarray:
        """The next ``n`` little-endian 64-bit words (uint64)."""
        return self.read(8 * n).view("<u8")

    def uniforms(self, n: int) -> np.ndarray:
        """The next ``n`` uniforms on (0, 1], from the next ``n`` words (float64)."""
        return _uniforms(self.words(n))


class _Workspace(threading.local):
    """Block-sized scratch arrays kept between calls, one set per thread.

    A sampler call of a typical model size (tens of thousands of draws) would otherwise allocate a few MB
    of fresh temporaries, and whenever the allocator has handed the last ones back to the system, each
    4 KiB page costs a fault on first touch (what that cost a run: docs/performance.md, section 4). About
    5 MB per thread that samples noise."""

    def __init__(self) -> None:
        self._arrays: dict[tuple[str, str], np.ndarray] = {}

    def array(self, name: str, size: int, dtype: type = np.float64) -> np.ndarray:
        """The scratch array ``name`` of at least ``size`` elements (contents undefined)."""
        key = (name, np.dtype(dtype).str)
        array = self._arrays.get(key)
        if array is None or array.size < size:
            array = self._arrays[key] = np.empty(size, dtype=dtype)
        return array


_WORKSPACE = _Workspace()


class _Blocks:
    """Draws from one keystream a block of at most ``_BLOCK_DRAWS`` candidates at a time, each taking
    ``per_draw`` words, into the thread's scratch arrays (:class:`_Workspace`); the results are views that
    stay valid until the next block."""

    def __init__(self, stream: Keystream, per_draw: int) -> None:
        self.stream = stream
        self.per_draw = per_draw
        self._bytes = _WORKSPACE.array("keystream", 8 * per_draw * _BLOCK_DRAWS + _AES_BLOCK - 1, np.uint8)
        self._uniforms = _WORKSPACE.array("uniforms", per_draw * _BLOCK_DRAWS)

    def words(self, n: int) -> np.ndarray:
        """The next ``n`` keystream words (uint64; a view of the buffer, valid until the next call)."""
        return self.stream.read_into(self._bytes, 8 * n).view("<u8")

    def uniforms(self, n: int) -> np.ndarray:
        """The next ``n`` uniforms, as :func:`_uniforms` (a view of the buffer, valid until the next call)."""
        words = self.words(n)
        np.right_shift(words, np.uint64(11), out=words)
        out = self._uniforms[:n]
        np.add(words.view(np.int64), 0.5, out=out)  # int64 -> float64 is exact below 2^53, and fast
        out *= 2.0**-53
        return out


def _uniforms(words: np.ndarray) -> np.ndarray:
    """``((w >> 11) + 1/2) / 2^53`` for 64-bit words ``w``, on (0, 1]: never 0, so logarithms are finite.

    From ``w >> 11 = 2^52`` up, float64 cannot hold the half and ``+ 1/2`` rounds to even, so the upper
    half of (0, 1] is on a 2^-52 grid and the largest word gives exactly 1 (probability 2^-53); every
    sampler here accepts 1."""
    top = (words >> np.uint64(11)).view(np.int64).astype(np.float64)
    top += 0.5
    top *= 2.0**-53
    return top


def _checked(seed: bytes, variance: float, size: int) -> tuple[Keystream, float, int]:
    stream = Keystream(seed, NOISE_DOMAIN)
    variance = float(variance)
    if not 0.0 <= variance <= MAX_VARIANCE:  # also rejects NaN
        raise ValueError(f"variance must be a number in [0, {MAX_VARIANCE:g}], not {variance}")
    size = operator.index(size)
    if size < 0:
        raise ValueError(f"size must be a non-negative integer, not {size}")
    return stream, variance, size


# --- Poisson ------------------------------------------------------------------------------------------------


def _stirling_error(k: np.ndarray) -> np.ndarray:
    """``log k! - (k log k - k + log(2 pi k)/2)`` by its asymptotic series (error < 1e-16 for k >= 16)."""
    r = 1.0 / k
    r2 = r * r
    return r * (1 / 12 - r2 * (1 / 360 - r2 * (1 / 1260 - r2 * (1 / 1680 - r2 / 1188))))


def log_poisson_pmf(k: np.ndarray, mean: float) -> np.ndarray:
    """``log P(X = k)`` for X ~ Poisson(mean) at integer-valued float64 ``k >= 0``, without cancellation.

    For ``k >= 16`` it is ``-(k log1p((k - mean)/mean) - (k - mean)) - log(2 pi k)/2 - stirling_error(k)``
    (Loader's saddle-point form), whose terms are O(1) near the mode, instead of the naive
    ``-mean + k log(mean) - log k!`` that loses ``eps * mean log(mean)`` to cancellation for large means."""
    k = np.asarray(k, dtype=np.float64)
    small = k < _STIRLING_FROM
    if not small.any():
        return _log_poisson_pmf_large(k, mean)
    out = np.empty_like(k)
    ks = k[small]
    out[small] = ks * math.log(mean) - mean - _LOG_FACTORIAL[ks.astype(np.int64)]
    out[~small] = _log_poisson_pmf_large(k[~small], mean)
    return out


def _log_poisson_pmf_large(k: np.ndarray, mean: float) -> np.ndarray:
    d = k - mean
    return d - k * np.log1p(d / mean) - _HALF_LOG_2PI - 0.5 * np.log(k) - _stirling_error(k)


def _rejection(blocks: _Blocks, size: int, propose: _Proposal, name: str) -> np.ndarray:
    """``size`` draws by rejection: each pass gives every pending draw, in increasing index order, the next
    ``per_draw`` uniforms (as ``blocks`` was made); ``propose`` turns them (interleaved, draw by draw) into
    candidates and accept flags; the rejected draws are pending in the next pass.

    Works through ``_BLOCK_DRAWS`` draws at a time in ``blocks``' buffers, so that temporaries stay in cache
    and no model-sized array is allocated per step; the keystream order does not depend on it. ``propose``
    may return views of its own buffers (valid until its next call) and may have set rejected values to
    anything, even infinities: they are never converted."""
    per_draw = blocks.per_draw
    out = np.empty(size, dtype=np.int64)
    rejected = []
    for start in range(0, size, _BLOCK_DRAWS):  # the first pass: contiguous, so slices, not fancy indexing
        accept, value = propose(blocks.uniforms(per_draw * min(_BLOCK_DRAWS, size - start)))
        reject = ~accept
        np.copyto(value, 0.0, where=reject)
        out[start : start + value.size] = value
        rejected.append(start + np.flatnonzero(reject))
    pending = np.concatenate(rejected)
    for _ in range(MAX_PASSES - 1):
        if pending.size == 0:
            return out
        rejected = []
        for start in range(0, pending.size, _BLOCK_DRAWS):
            index = pending[start : start + _BLOCK_DRAWS]
            accept, value = propose(blocks.uniforms(per_draw * index.size))
            out[index[accept]] = value[accept]
            rejected.append(index[~accept])
        pending = np.concatenate(rejected)
    if pending.size == 0:
        return out
    raise RuntimeError(f"{name} left {pending.size} draws rejected after {MAX_PASSES} passes")


def _poisson_inversion(stream: Keystream, mean: float, size: int) -> np.ndarray:
    """Poisson(mean < 10) by inversion: ``X = #{j >= 1 : P(X >= j) > u}`` for one uniform ``u`` each.

    The pmf comes from log space (:func:`log_poisson_pmf`) and the tail ``P(X >= j)`` is summed from the
    far end, smallest terms first, so upper-tail probabilities are accurate rather than ``1 - cdf``
    rounding. The search is a guide table (Chen and Asau, 1974) on the top 16 bits of each keystream word,
    which fix X unless a tail value falls within the word's 2^-16 bucket; those few words are searched in
    the table. Either way X is the exact inverse of ``u``; the table only saves time."""
    pmf = np.exp(log_poisson_pmf(np.arange(_INVERSION_TERMS, dtype=np.float64), mean))
    tail = np.cumsum(pmf[:0:-1])  # tail[i] = P(X >= 127 - i), ascending, for j = 127 .. 1
    edges = np.arange(_GUIDE_BUCKETS + 1) * (1.0 / _GUIDE_BUCKETS)
    at_edge = tail.size - np.searchsorted(tail, edges, side="right")
    guide = np.where(at_edge[:-1] == at_edge[1:], at_edge[:-1], -1)  # -1: X changes within the bucket
    blocks = _Blocks(stream, 1)
    bucket = _WORKSPACE.array("inversion.bucket", _BLOCK_DRAWS, np.intp)
    out = np.empty(size, dtype=np.int64)
    for start in range(0, size, _BLOCK_DRAWS):
        words = blocks.words(min(_BLOCK_DRAWS, size - start))
        top = bucket[: words.size]
        np.right_shift(words, np.uint64(64 - _GUIDE_BITS), out=top, casting="unsafe")
        x = out[start : start + words.size]
        np.take(guide, top, out=x)
        unsure = np.flatnonzero(x < 0)
        if unsure.size:
            x[unsure] = tail.size - np.searchsorted(tail, _uniforms(words[unsure]), side="right")
    return out


def _poisson_ptrs(stream: Keystream, mean: float, size: int) -> np.ndarray:
    """Poisson(mean >= 10) by PTRS, Hormann (1993), "The transformed rejection method for generating Poisson
    random variables", Insurance: Mathematics and Economics 12(1), algorithm PTRS, with its constants.

    Each candidate takes a pair (U + 1/2, V) of uniforms; the squeeze ``us >= 0.07 and V <= v_r`` accepts
    about 80 % of them, the exact test ``log(V alpha^-1 / (a/us^2 + b)) <= log P(X = k)`` decides the rest
    (only those are gathered: the squeeze's work runs in place in block buffers)."""
    slam = math.sqrt(mean)
    b = 0.931 + 2.53 * slam
    a = -0.059 + 0.02483 * b
    log_inv_alpha = math.log(1.1239 + 1.1328 / (b - 3.4))
    v_r = 0.9277 - 3.6224 / (b - 2.0)
    u_buf, us_buf, k_buf = (_WORKSPACE.array(name, _BLOCK_DRAWS) for name in ("ptrs.u", "ptrs.us", "ptrs.k"))
    accept_buf, flag_buf = (_WORKSPACE.array(name, _BLOCK_DRAWS, bool) for name in ("ptrs.accept", "ptrs.flag"))

    def propose(uv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = uv.size // 2
        u, us, k, accept, flag = u_buf[:n], us_buf[:n], k_buf[:n], accept_buf[:n], flag_buf[:n]
        v = uv[1::2]
        np.subtract(uv[0::2], 0.5, out=u)
        np.abs(u, out=us)
        np.subtract(0.5, us, out=us)  # 0 only for a uniform of exactly 1: k is then infinite and rejected
        # k stays float64 (exact on integers) until accepted: far-tail candidates may exceed int64
        with np.errstate(divide="ignore", invalid="ignore"):
            np.divide(2.0 * a, us, out=k)
            k += b
            k *= u
        k += mean + 0.43
        np.floor(k, out=k)
        np.greater_equal(us, 0.07, out=accept)
        np.less_equal(v, v_r, out=flag)
        accept &= flag
        slow = np.flatnonzero(~accept)
        us_s, v_s, k_s = us[slow], v[slow], k[slow]
        keep = (k_s >= 0) & ((us_s >= 0.013) | (v_s <= us_s))
        slow, us_s, v_s, k_s = slow[keep], us_s[keep], v_s[keep], k_s[keep]
        if slow.size:
            lhs = np.log(v_s) + log_inv_alpha - np.log(a / (us_s * us_s) + b)
            accept[slow] = lhs <= log_poisson_pmf(k_s, mean)
        return accept, k

    return _rejection(_Blocks(stream, 2), size, propose, f"PTRS for Poisson({mean})")


def _poisson(stream: Keystream, mean: float, size: int) -> np.ndarray:
    if mean == 0.0 or size == 0:
        return np.zeros(size, dtype=np.int64)
    if mean < PTRS_MIN_MEAN:
        return _poisson_inversion(stream, mean, size)
    return _poisson_ptrs(stream, mean, size)


# --- the mechanisms -----------------------------------------------------------------------------------------


def skellam(seed: bytes, variance: float, size: int) -> np.ndarray:
    """``size`` draws of Skellam noise of variance ``variance`` (integer units): Poisson(variance/2) minus an
    independent Poisson(variance/2), as in the DSkellam mechanism (Agarwal, Kairouz, Liu, NeurIPS 2021, Sec. 3).

    Closed under summation: the sum of n clients' Skellam(v_i) is Skellam(sum v_i), exactly. int64: a view
    of the first half of the ``2 size`` Poisson draws (no copy; copy it to keep it long)."""
    stream, variance, size = _checked(seed, variance, size)
    if variance == 0.0 or size == 0:
        return np.zeros(size, dtype=np.int64)
    draws = _poisson(stream, variance / 2.0, 2 * size)
    return np.subtract(draws[:size], draws[size:], out=draws[:size])


def gaussian(seed: bytes, variance: float, size: int) -> np.ndarray:
    """``size`` draws of N(0, variance) by Box-Muller (Box and Muller, 1958) rounded to the nearest integer
    (ties to even), int64: the integer domain of secure aggregation needs integers.

    This is a *rounded* Gaussian (its variance is about ``variance + 1/12``); the accounting treats it as
    the continuous N(0, variance), an approximation: rounding each client's share is not post-processing
    of the continuous sum, and a sum of rounded Gaussians is not exactly a rounded Gaussian."""
    stream, variance, size = _checked(seed, variance, size)
    out = np.zeros(size, dtype=np.int64)
    if variance == 0.0:
        return out
    blocks = _Blocks(stream, 2)
    for start in range(0, size, 2 * _BLOCK_DRAWS):
        pairs = (min(2 * _BLOCK_DRAWS, size - start) + 1) // 2
        u = blocks.uniforms(2 * pairs)
        radius = np.sqrt(-2.0 * variance * np.log(u[0::2]))
        angle = (2.0 * math.pi) * u[1::2]
        z = np.empty(2 * pairs)
        z[0::2] = radius * np.cos(angle)
        z[1::2] = radius * np.sin(angle)
        block = out[start : start + 2 * pairs]
        block[:] = np.rint(z[: block.size])
    return out


def discrete_gaussian(seed: bytes, variance: float, size: int) -> np.ndarray:
    """``size`` draws of the discrete Gaussian N_Z(0, sigma^2), ``sigma^2 = variance``: P(x) proportional to
    ``exp(-x^2 / (2 sigma^2))`` on the integers (Canonne, Kamath, Steinke, NeurIPS 2020, Algorithm 3).

    With ``t = floor(sigma) + 1``: draw Y from the discrete Laplace of scale t (P(y) proportional to
    ``exp(-|y|/t)``, here the difference of two geometric variables ``floor(-t ln u)``) and accept with
    probability ``exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2))``; three uniforms per candidate. The paper's
    Bernoulli samplers are exact; here the geometric draws and the acceptance test use float64 (relative
    error about 1e-16 in each probability), which is acceptable for simulation. The variance of
    N_Z(0, sigma^2) is slightly below sigma^2 (CKS, Sec. 2); from sigma = 1 on, by less than 1e-6
    relatively. int64."""
    stream, variance, size = _checked(seed, variance, size)
    if variance == 0.0 or size == 0:
        return np.zeros(size, dtype=np.int64)
    t = math.floor(math.sqrt(variance)) + 1.0
    shift = variance / t

    def propose(u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        y = np.floor(-t * np.log(u[0::3])) - np.floor(-t * np.log(u[1::3]))
        return u[2::3] < np.exp(-((np.abs(y) - shift) ** 2) / (2.0 * variance)), y

    return _rejection(_Blocks(stream, 3), size, propose, "the discrete Gaussian")


_SAMPLERS: dict[str, Callable[[bytes, float, int], np.ndarray]] = {
    "skellam": skellam,
    "gaussian": gaussian,
    "dgaussian": discrete_gaussian,
}


def sample(mechanism: str, seed: bytes, variance: float, size: int) -> np.ndarray:
    """``size`` int64 noise draws of ``mechanism`` ("skellam", "gaussian" or "dgaussian") from ``seed``."""
    sampler = _SAMPLERS.get(mechanism)
    if sampler is None:
        raise ValueError(f"unknown noise mechanism {mechanism!r}; use one of {', '.join(MECHANISMS)}")
    return sampler(seed, variance, size)


class _Pool:
    """The threads of :func:`total`, made on first use; a forked child makes its own (the parent's threads
    do not exist in it)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.executor: ThreadPoolExecutor | None = None
        self.limit: int | None = None
        """At most this many threads (:func:`limit_threads`), or None for every core."""
        if hasattr(os, "register_at_fork"):  # POSIX
            os.register_at_fork(after_in_child=self.forget)

    def forget(self) -> None:
        self.lock = threading.Lock()
        self.executor = None

    def get(self) -> ThreadPoolExecutor:
        with self.lock:
            if self.executor is None:
                self.executor = ThreadPoolExecutor(threads(), thread_name_prefix=_THREAD_NAME)
            return self.executor


_THREAD_NAME = "dropsim-noise"
_POOL = _Pool()


def limit_threads(count: int | None) -> int | None:
    """Make :func:`total` use at most ``count`` threads in this process (None: every core); returns the former
    limit. A deployment's parties compute on one thread each, as the testbed model charges them and as their
    CPU time is measured (:func:`sim.deploy.compute.one_thread_math`)."""
    former, _POOL.limit = _POOL.limit, count
    return former


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity; every core where that cannot be read)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def threads() -> int:
    """Threads :func:`total` uses: :func:`usable_cores`, or fewer (:func:`limit_threads`)."""
    cores = usable_cores()
    return cores if _POOL.limit is None else max(1, min(cores, _POOL.limit))


def total(mechanism: str, draws: Sequence[tuple[bytes, float]], size: int) -> np.ndarray:
    """The sum (int64) of ``size`` draws of ``mechanism`` from each ``(seed, variance)`` of ``draws``:
    components on :func:`threads` threads, at most two per thread in memory at once. Exactly the sum of
    :func:`sample`'s components, whatever the order they finish in."""
    out = np.zeros(size, dtype=np.int64)
    width = threads()
    if len(draws) <= 1 or width == 1 or threading.current_thread().name.startswith(_THREAD_NAME):
        for seed, variance in draws:
            out += sample(mechanism, seed, variance, size)
        return out
    pool, pending = _POOL.get(), collections.deque[Future[np.ndarray]]()
    for seed, variance in draws:
        if len(pending) >= 2 * width:
            out += pending.popleft().result()
        pending.append(pool.submit(sample, mechanism, seed, variance, size))
    while pending:
        out += pending.popleft().result()
    return out
