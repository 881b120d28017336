"""Per-sample draws keyed by (seed, epoch, sample id): an image gets the same parameters whichever batch serves it.

A ``torch.Generator`` hands out one stream per batch, so a sample's crop depends on the batch it lands in, its
position there and the batch size. :class:`KeyedDraws` takes its place in every op (``op(x, generator=draws)``)
and makes each draw a pure function of

    (base key from seed and epoch, sample id, stream, counter within the stream, element index)

through a counter-based hash computed on the batch's device with integer tensor ops: 32-bit values held in
int64 (every product below 2**63, so nothing relies on signed overflow), mixed by Wellons' ``lowbias32``; a
sample's own key is 64 bits, two such lanes (NOTE [ 64 bits per sample ]). A
stream is the path of labels from :meth:`KeyedDraws.child` (``Compose`` gives each op its position); the counter
advances with each draw call, as a generator's state does. :meth:`KeyedDraws.select` gives the same keys for a
subset of the samples (an op run on the samples a coin picked).

What comes out, and how exact it is across devices (CPU and CUDA give the same values):

- uniforms in ``[0, 1)``: float32 from 24 bits (float64 from 32), integers ``low + (v * range) >> 32``, coins,
  permutations (a stable argsort of integer keys) and categorical choices (a cumulative table made on the host):
  integer arithmetic and exact conversions, bit-identical on every device;
- normals (Box-Muller, both of a pair used) and choices without replacement (Efraimidis-Spirakis keys
  ``log(u) / w``) go through ``log``, ``cos`` and ``sin``, whose last bit may differ between devices (from the same
  exact uniforms: a normal then differs by an ulp, a choice only if the last bit decides it).

Example:
    >>> ids = torch.tensor([7, 3, 11])
    >>> a = KeyedDraws(seed=0, epoch=1, ids=ids).uniform((3,))
    >>> b = KeyedDraws(seed=0, epoch=1, ids=torch.tensor([11, 7])).uniform((2,))
    >>> bool(a[2] == b[0]) and bool(a[0] == b[1])   # sample 11 and sample 7 draw the same in either batch
    True
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence

import torch

from ..errors import ConfigError
from ..sampling import derive_seed
from ..validate import as_epoch, as_seed
from .paths import host_path

__all__ = ["KeyedDraws", "mix32"]

_M32 = 0xFFFFFFFF
# Domain tags, so a child's key, a spawned stream's key and a draw's constants never coincide.
_CHILD, _SPAWN, _DRAW, _ROOT, _LANE = 0x43484C44, 0x5350574E, 0x44524157, 0x524F4F54, 0x4C414E45
_Label = int | str | tuple
_PIECE = 1 << 16  # values mixed at a time on the CPU: 512 KiB of int64, within a core's L2 cache
_NORMAL_PIECE = 1 << 20  # normal pairs made at a time (per sample x columns): ~40 MB of temporaries at most


def _mul32(h: torch.Tensor, c: int) -> torch.Tensor:
    """``h = (h * c) mod 2**32`` in place, for 32-bit ``h`` (in int64) and a 32-bit constant: ``c`` split in 16-bit
    halves, so every product stays below 2**49."""
    high = (h * (c >> 16)).bitwise_and_(0xFFFF).bitwise_left_shift_(16)
    return h.mul_(c & 0xFFFF).add_(high).bitwise_and_(_M32)


def _mix_(h: torch.Tensor) -> torch.Tensor:
    """:func:`mix32` in place. On the CPU a large tensor goes a cache-sized piece at a time: its ~15 passes then
    read the cache, not memory (3 million values: 17 ms against 35 ms out of place, measured on 2 cores)."""
    if host_path(h) and h.numel() > _PIECE:
        flat = h.view(-1)
        for start in range(0, flat.numel(), _PIECE):
            _mix_(flat[start : start + _PIECE])
        return h
    h.bitwise_xor_(h >> 16)
    _mul32(h, 0x7FEB352D)
    h.bitwise_xor_(h >> 15)
    _mul32(h, 0x846CA68B)
    return h.bitwise_xor_(h >> 16)


def mix32(h: torch.Tensor) -> torch.Tensor:
    """Wellons' ``lowbias32`` on 32-bit values held in int64: a bijection of ``[0, 2**32)`` with low bias."""
    return _mix_(h.clone())


def _mix32_host(h: int) -> int:
    """:func:`mix32` of one Python int (for a draw's constants, computed on the host)."""
    h ^= h >> 16
    h = (h * 0x7FEB352D) & _M32
    h ^= h >> 15
    h = (h * 0x846CA68B) & _M32
    return h ^ (h >> 16)


def _label_key(label: _Label) -> int:
    """A stable 64-bit number for a label (Python's ``hash`` of a str changes between processes)."""
    if isinstance(label, bool) or not isinstance(label, (int, str, tuple)):
        raise ConfigError(f"label={label!r} must be an int, a str or a tuple of them (a stream's name)")
    if isinstance(label, int):
        return label
    return int.from_bytes(hashlib.blake2b(repr(label).encode(), digest_size=8).digest(), "little")


def _halves(key: int) -> tuple[int, int]:
    return key & _M32, (key >> 32) & _M32


# NOTE [ 64 bits per sample ]: a sample's key is its 64-bit id mixed with the root (seed, epoch) into two 32-bit
# lanes, each lane a different mix of both halves of the id. With one 32-bit lane, two of a million samples shared
# every draw of an epoch with probability ~1 (about 116 such pairs: N**2 / 2**33); with two, ~N**2 / 2**65. Each draw
# mixes both lanes, so samples whose first lanes collide still draw apart.
def _base(root: int, ids: torch.Tensor) -> torch.Tensor:
    """``(2, N)``: each sample's key lanes (int64 holding 32 bits), from its id and the root key."""
    lo, hi = ids & _M32, (ids >> 32) & _M32
    lanes = []
    for lane in (0, 1):
        r0, r1 = _halves(derive_seed(root, _LANE, lane))
        lanes.append(_mix_(_mix_(lo ^ r0) ^ hi ^ r1))
    return torch.stack(lanes)


class KeyedDraws:
    """Per-sample random draws keyed by ``(seed, epoch, ids[i])``, in place of a ``torch.Generator``.

    Every gpufeed op takes it as ``generator=``: ``transform(x, generator=KeyedDraws(seed, epoch, ids))``, with
    ``ids`` the batch's sample ids (int64, one per sample, on the batch's device). Sample ``i`` then draws the same
    parameters in any batch, at any position and batch size, on any rank: its draws depend on its id, not on its
    companions. Like a generator it has a position (each draw call advances the stream's counter); unlike one, it
    can be split without changing what the others draw (:meth:`child`, :meth:`select`, :meth:`spawn`).

    Example:
        >>> from gpufeed.augment import Compose, RandomCrop, RandomHorizontalFlip
        >>> aug = Compose([RandomCrop(8, padding=2), RandomHorizontalFlip()])
        >>> x = torch.arange(4 * 8 * 8, dtype=torch.uint8).view(4, 1, 8, 8)
        >>> whole = aug(x, generator=KeyedDraws(0, 0, torch.tensor([10, 11, 12, 13])))
        >>> alone = aug(x[2:3], generator=KeyedDraws(0, 0, torch.tensor([12])))
        >>> torch.equal(whole[2:3], alone)
        True
    """

    def __init__(self, seed: int, epoch: int, ids: torch.Tensor) -> None:
        if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.dtype != torch.int64:
            got = f"{tuple(ids.shape)} {ids.dtype}" if isinstance(ids, torch.Tensor) else type(ids).__name__
            raise ConfigError(f"ids must be a 1-D int64 tensor of sample ids, one per sample; got {got}")
        root = derive_seed(_ROOT, as_seed(seed), as_epoch(epoch))  # NOTE [ Seeds, epochs and batch sizes: ... ]
        self._set(root, ids, _base(root, ids), 0)

    def _set(self, key: int, ids: torch.Tensor, base: torch.Tensor, counter: int) -> None:
        # base: (2, N), each sample's 64-bit key as two 32-bit lanes (NOTE [ 64 bits per sample ])
        self.key, self.ids, self._base, self._counter = key, ids, base, counter

    @classmethod
    def _of(cls, key: int, ids: torch.Tensor, base: torch.Tensor, counter: int = 0) -> KeyedDraws:
        out = cls.__new__(cls)
        out._set(key, ids, base, counter)
        return out

    def __len__(self) -> int:
        return self.ids.shape[0]

    @property
    def device(self) -> torch.device:
        """Where the draws are made: the ids' device, which must be the batch's."""
        return self.ids.device

    def __repr__(self) -> str:
        return f"KeyedDraws(key={self.key:#x}, {len(self)} ids on {self.device}, counter={self._counter})"

    # -- streams ---------------------------------------------------------------------------------------------

    def child(self, label: _Label) -> KeyedDraws:
        """A separate stream named ``label`` (an int, a str or a tuple), counter at 0: what it draws neither
        depends on nor moves this stream's draws. The same label gives the same stream."""
        return KeyedDraws._of(derive_seed(self.key, _CHILD, _label_key(label)), self.ids, self._base)

    def spawn(self) -> KeyedDraws:
        """A separate stream taking the place of one draw of this one (the counter advances by one): for draws
        whose number depends on the data (a rejection loop), so that the draws after them do not."""
        counter = self._advance()
        return KeyedDraws._of(derive_seed(self.key, _SPAWN, counter), self.ids, self._base)

    def select(self, idx: torch.Tensor) -> KeyedDraws:
        """The draws of the samples at ``idx`` (positions in this batch): the same keys, at the same counter."""
        idx = idx.to(self.device)
        return KeyedDraws._of(self.key, self.ids.index_select(0, idx), self._base.index_select(1, idx), self._counter)

    def _advance(self) -> int:
        counter = self._counter
        self._counter += 1
        return counter

    # -- raw values ------------------------------------------------------------------------------------------

    def bits(self, m: int) -> torch.Tensor:
        """``(N, m)`` 32-bit values (int64) for the next draw: a function of (key, id, counter, element) only."""
        t, c1 = self._draw()
        if m == 1:  # most draws: one value per sample, the element's constant made on the host (15 kernels fewer)
            return _mix_(t ^ _mix32_host(c1)).view(-1, 1)
        return self._columns(t, c1, 0, m)

    def _draw(self) -> tuple[torch.Tensor, int]:
        """The next draw's per-sample values ``(N,)`` and its element constant (the counter advances by one)."""
        c0, c1 = _halves(derive_seed(self.key, _DRAW, self._advance()))
        lo, hi = self._base
        return _mix_(_mix_(lo ^ c0) ^ hi), c1

    def _columns(self, t: torch.Tensor, c1: int, start: int, stop: int) -> torch.Tensor:
        """``(N, stop - start)``: elements ``start..stop`` of the draw ``(t, c1)``; any range of them gives the same
        values as the whole."""
        j = _mix_(torch.arange(start, stop, device=self.device, dtype=torch.int64) ^ c1)  # each element's
        return _mix_(t.view(-1, 1) ^ j.view(1, -1))

    def _shaped(self, shape: Sequence[int], axis: int, make: Callable[[int], torch.Tensor]) -> torch.Tensor:
        """``make(m)`` gives ``(N, m)``; reshaped to ``shape`` with the samples on ``axis``."""
        shape = tuple(int(s) for s in shape)
        axis = axis % len(shape)
        if shape[axis] != len(self):
            raise ConfigError(
                f"a per-sample draw of shape {shape} has {shape[axis]} samples on axis {axis}, but these KeyedDraws "
                f"hold {len(self)} ids: give one id per sample of the batch"
            )
        rest = shape[:axis] + shape[axis + 1 :]
        return make(math.prod(rest)).view(len(self), *rest).movedim(0, axis)

    # -- draws -----------------------------------------------------------------------------------------------

    def uniform(self, shape: Sequence[int], dtype: torch.dtype = torch.float32, axis: int = 0) -> torch.Tensor:
        """Uniform in ``[0, 1)``: float32 from 24 bits, float64 from 32 (exact on every device)."""
        if dtype not in (torch.float32, torch.float64):
            raise ConfigError(f"dtype={dtype}: keyed uniforms are float32 or float64")

        def make(m: int) -> torch.Tensor:
            v = self.bits(m)
            if dtype == torch.float64:
                return v.to(torch.float64).mul_(2.0**-32)
            return v.bitwise_right_shift_(8).to(torch.float32).mul_(2.0**-24)

        return self._shaped(shape, axis, make)

    def integers(self, low: int, high: int, shape: Sequence[int], axis: int = 0) -> torch.Tensor:
        """Integers uniform in ``[low, high)`` (int64): ``low + (v * (high - low)) >> 32`` for a 32-bit ``v``."""
        span = int(high) - int(low)
        if not 0 < span < 2**31:
            raise ConfigError(f"low={low}, high={high}: keyed integers need 0 < high - low < 2**31")
        return self._shaped(shape, axis, lambda m: self.bits(m).mul_(span).bitwise_right_shift_(32).add_(int(low)))

    def normal(self, shape: Sequence[int], dtype: torch.dtype = torch.float32, axis: int = 0) -> torch.Tensor:
        """Standard normals by Box-Muller from pairs of uniforms, both of each pair used: in float64 from 32-bit
        uniforms for float64 (tails to 6.7 sigma), else in float32 from 24-bit ones (to 5.8 sigma), then cast."""
        work, bits = (torch.float64, 32) if dtype == torch.float64 else (torch.float32, 24)

        def uniforms(t: torch.Tensor, c1: int, start: int, stop: int) -> torch.Tensor:
            v = self._columns(t, c1, start, stop)
            return (v.bitwise_right_shift_(8) if bits == 24 else v).to(work)

        def make(m: int) -> torch.Tensor:
            half = (m + 1) // 2
            t, c1 = self._draw()  # one draw of 2 * half elements: u1 = its first half, u2 = its second
            out = torch.empty((len(self), 2 * half), dtype=dtype, device=self.device)
            # A piece of columns at a time (per-pixel noise of a 256 x 3 x 224 x 224 batch is 38 M pairs): the int64
            # and float temporaries stay a few MB whatever the batch; the values do not depend on the pieces.
            step = max(1, _NORMAL_PIECE // max(len(self), 1))
            for a in range(0, half, step):
                b = min(a + step, half)
                radius = uniforms(t, c1, a, b).add_(1.0).mul_(2.0**-bits).log_().mul_(-2.0).sqrt_()  # no log(0)
                angle = uniforms(t, c1, half + a, half + b).mul_(2.0**-bits * 2.0 * math.pi)
                out[:, a:b] = torch.cos(angle).mul_(radius)
                out[:, half + a : half + b] = angle.sin_().mul_(radius)
            return out[:, :m]

        return self._shaped(shape, axis, make)

    def permutation(self, k: int) -> torch.Tensor:
        """``(N, k)``: a uniform permutation of ``range(k)`` per sample (a stable argsort of 32-bit keys)."""
        if len(self) == 0 or k == 0:
            return torch.zeros((len(self), k), dtype=torch.int64, device=self.device)
        return torch.argsort(self.bits(k), dim=1, stable=True)

    def categorical(self, weights: Sequence[float]) -> torch.Tensor:
        """``(N,)``: index ``j`` with probability ``weights[j] / sum(weights)``: how many of the cumulative
        shares (made on the host: no copy to the device, no sync) the sample's uniform reaches."""
        total, acc, cdf = float(sum(weights)), 0.0, []
        for w in weights:
            acc += float(w)
            cdf.append(acc / total)
        u = self.uniform((len(self),), torch.float64)
        index = torch.zeros(len(self), dtype=torch.int64, device=self.device)
        for share in cdf[:-1]:  # a zero weight repeats a share: its index is stepped over
            index += u >= share
        return index

    def without_replacement(self, weights: Sequence[float], count: int) -> torch.Tensor:
        """``(N, count)``: ``count`` distinct indices per sample, drawn in turn with probability proportional to
        ``weights`` among those left (Efraimidis-Spirakis: the largest keys ``log(u) / w``, in order); a zero
        weight's key is -inf, never taken while a positive one is left."""
        keys = self.bits(len(weights)).to(torch.float64).add_(1.0).mul_(2.0**-32).log_()  # log(u), u in (0, 1]
        for j, w in enumerate(weights):  # per column, a scalar: no weight tensor copied to the device
            keys[:, j] = keys[:, j] / float(w) if w > 0 else -math.inf
        return torch.topk(keys, count, dim=1).indices
