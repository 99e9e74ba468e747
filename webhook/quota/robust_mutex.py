"""A process-shared, robust pthread mutex inside a shared memory mapping (glibc, through ctypes).

Why not flock or a multiprocessing lock: the workers take this lock on every pod they validate.
``fcntl.flock`` releases the GIL around its system call, so a worker would often get the lock and
then wait for its own GIL (up to the 5 ms switch interval) while every other process waits for it.
Here the uncontended path is ``pthread_mutex_trylock`` called with the GIL held (ctypes.PyDLL),
a few atomic instructions; only a contended lock waits, without the GIL. A multiprocessing lock
is not robust: a worker killed while holding it would stop every validation for good. A robust
mutex is handed to the next locker with EOWNERDEAD instead, which then knows the data it guards
may be half-written (``lock`` returns that).

Also a liveness signal: the quota service holds one such mutex for its whole life, and a worker
reads its lock word to see at once whether that owner died, even before the process is reaped.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import time

# glibc: pthread_mutex_t is 40 bytes on x86-64, 48 on arm64; the region leaves room for either.
MUTEX_BYTES = 64
_PTHREAD_PROCESS_SHARED = 1
_PTHREAD_MUTEX_ROBUST = 1
# The lock word of a robust mutex is a robust futex (the kernel's robust-futex ABI; glibc puts it
# first in pthread_mutex_t): the owner's thread id, plus a bit the kernel sets, clearing the id,
# when the owner dies holding it.
_FUTEX_OWNER_DIED = 0x40000000
_FUTEX_TID_MASK = 0x3FFFFFFF

_with_gil = ctypes.PyDLL("libc.so.6", use_errno=True)  # calls that never block: keep the GIL
_without_gil = ctypes.CDLL("libc.so.6", use_errno=True)  # a call that may wait: let other threads run


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class MutexError(OSError):
    pass


class RobustMutex:
    """The mutex at ``offset`` in ``region`` (a MAP_SHARED mmap, kept alive by this object)."""

    def __init__(self, region: mmap.mmap, offset: int) -> None:
        self._anchor = ctypes.c_char.from_buffer(region, offset)  # pins the mapping while in use
        self._address = ctypes.c_void_p(ctypes.addressof(self._anchor))
        self._word = ctypes.c_uint32.from_buffer(region, offset)

    def initialise(self) -> None:
        """Once, by the process that creates the region, before any other maps it."""
        attr = ctypes.create_string_buffer(64)
        for call, args in ((_with_gil.pthread_mutexattr_init, (attr,)),
                           (_with_gil.pthread_mutexattr_setpshared, (attr, _PTHREAD_PROCESS_SHARED)),
                           (_with_gil.pthread_mutexattr_setrobust, (attr, _PTHREAD_MUTEX_ROBUST)),
                           (_with_gil.pthread_mutex_init, (self._address, attr))):
            _check(call(*args), call.__name__)
        _with_gil.pthread_mutexattr_destroy(attr)

    def try_lock(self) -> tuple[bool, bool]:
        """(locked, previous owner died); never waits."""
        result = _with_gil.pthread_mutex_trylock(self._address)
        if result == errno.EBUSY:
            return False, False
        return self._taken(result, "pthread_mutex_trylock")

    def lock(self, timeout: float) -> tuple[bool, bool]:
        """(locked, previous owner died); False after ``timeout`` seconds."""
        locked, owner_died = self.try_lock()
        if locked:
            return locked, owner_died
        seconds, fraction = divmod(time.time() + timeout, 1.0)
        deadline = _Timespec(int(seconds), int(fraction * 1e9))
        result = _without_gil.pthread_mutex_timedlock(self._address, ctypes.byref(deadline))
        if result == errno.ETIMEDOUT:
            return False, False
        return self._taken(result, "pthread_mutex_timedlock")

    def _taken(self, result: int, call: str) -> tuple[bool, bool]:
        if result == errno.EOWNERDEAD:
            # The data is the caller's to repair; the mutex itself is usable again from here on.
            _check(_with_gil.pthread_mutex_consistent(self._address), "pthread_mutex_consistent")
            return True, True
        _check(result, call)
        return True, False

    def unlock(self) -> None:
        _check(_with_gil.pthread_mutex_unlock(self._address), "pthread_mutex_unlock")

    def owner_alive(self) -> bool:
        """For a mutex its owner holds for life: False once that owner has died, for every caller.

        Read from the lock word, never by locking: a ``trylock`` that finds the owner dead takes
        the mutex itself, and glibc then answers later callers in ways that look alive (once
        unlocked unrepaired it is not recoverable, and a ``trylock`` on it reports ENOTRECOVERABLE
        once, then EBUSY with the caller's own thread id left in the word). Nobody but the owner
        ever locks this mutex, so the word holds the live owner's thread id, or 0 with the
        owner-died bit after the kernel released it for a dead owner, and stays that way.
        """
        word = self._word.value
        return word & _FUTEX_TID_MASK != 0 and not word & _FUTEX_OWNER_DIED


def _check(result: int, call: str) -> None:
    if result != 0:
        raise MutexError(result, f"{call}: {errno.errorcode.get(result, result)}")
