"""What a pickle would use as dict keys, known before it is loaded: hash flooding is refused.

CPython hashes an int to itself modulo 2**61 - 1, so ``k * (2**61 - 1)`` hashes to 0 for
every ``k``, and so do tuples of ``-1`` and ``-2`` (both hash to -2) of one length. A dict
built from many such keys costs n**2 comparisons: a 1.1 MB pickle of one such dict took 27 s
to load, a few MB would take hours. str and bytes keys are safe (their hashes are salted per
process), so are ints below 2**61 - 1 in size. Real dumps key their dicts by strings, and
``pg_status`` by small ints (local pg ids); they hold no sets.

The C unpickler offers no hook into dict building, so :func:`key_problem` walks the pickle's
opcodes first, keeping for each stack slot and memo entry only what kind of value it would
be, and says why the pickle is refused when a dict would get any other key (a float, a big
int, a tuple, None) or when it builds a set. The walk is linear in the file's size and builds
no object. It stops, accepting, where the loader itself must stop: at STOP, at an opcode
that needs a global or a persistent id (refused by the loader), at a stack underflow, an
unknown opcode or the end of the data: nothing after such a point is ever built.

This module is the reference; ``_pickle_keys.c`` (optional, built where a compiler is) is the
same walk in C, used when present (``FR_OTEL_PURE_PYTHON=1`` turns it off); tests hold the two
to the same answers.
"""

from __future__ import annotations

import os

__all__ = ["COMPILED", "MEMO_PROBLEM", "key_problem", "key_problem_in_python"]

# What a stack slot or memo entry holds, as far as hashing goes.
_SAFE = 0  # str, bytes, bool or an int of |v| < 2**61 - 1: its hash cannot be made to collide at will
_OTHER = 1  # anything else: never a dump's dict key
_SAFE_INT = (1 << 61) - 1
#: The answer for a memo index no pickler writes (the loader would allocate memory for it).
MEMO_PROBLEM = _MEMO = "a memo index beyond the file's size, or written unreadably"


class _Stop(Exception):
    """The loader cannot get past this point: nothing after it is ever built."""


def _safe_int(value: int) -> int:
    return _SAFE if -_SAFE_INT < value < _SAFE_INT else _OTHER


def _plain_digits(text: bytes) -> bool:
    """1 to 18 ASCII digits: a number below 2**61 - 1 in any base the loader may read it in."""
    return 0 < len(text) <= 18 and text.isdigit()


def _text_int(text: bytes) -> int:
    """What INT (``I5``, ``I01`` = True) or LONG (``L5L``) text pushes, conservatively: the loader
    reads it with C's strtol in base 0, so only plain decimal digits are known to be small."""
    if text[:1] == b"-":
        text = text[1:]
    return _SAFE if _plain_digits(text) else _OTHER


def _text_index(text: bytes) -> int:
    """A GET/PUT index written as text; anything but plain digits is refused (the loader reads
    ``" 1_2"`` as 12, so guessing differently could let a value slip past the walk)."""
    if not _plain_digits(text):
        raise _Refused(_MEMO)
    return int(text)


def key_problem_in_python(data: bytes) -> str | None:
    """Why loading ``data`` could take quadratic time (a dict key that is not a string or a
    small int, or a set), or None: see the module doc. The reference implementation."""
    stack: list[int] = []
    marks: list[int] = []
    memo: dict[int, int] = {}
    pos, end = 0, len(data)

    def need(n: int) -> int:
        nonlocal pos
        start = pos
        pos += n
        if pos > end:
            raise _Stop
        return start

    def line() -> bytes:
        nonlocal pos
        nl = data.find(b"\n", pos)
        if nl < 0:
            raise _Stop
        text, pos = data[pos:nl], nl + 1
        return text

    def length(n: int, signed: bool = False) -> int:
        start = need(n)
        value = int.from_bytes(data[start:pos], "little", signed=signed)
        if value < 0:
            raise _Stop
        need(value)
        return value

    def fence() -> int:
        return marks[-1] if marks else 0

    def pop(n: int) -> list[int]:
        if len(stack) - n < fence():
            raise _Stop
        items = stack[len(stack) - n:]
        del stack[len(stack) - n:]
        return items

    def pop_mark() -> list[int]:
        if not marks:
            raise _Stop
        at = marks.pop()
        items = stack[at:]
        del stack[at:]
        return items

    def keys_ok(items: list[int], what: str) -> None:
        if len(items) % 2:
            raise _Stop
        if any(items[i] != _SAFE for i in range(0, len(items), 2)):
            raise _Refused(f"a dict key that is not a string or a small integer ({what}; dumps key their "
                           "dicts by strings and small integers, and others can make loading take quadratic time)")

    def put(index: int) -> None:
        if len(stack) <= fence():
            raise _Stop
        if index >= end:  # a pickler never writes one: each memoised value took at least a byte
            raise _Refused(_MEMO)
        memo[index] = stack[-1]

    try:
        while pos < end:
            op = data[pos]
            pos += 1
            if op in _PUSH_FIXED:
                size, tag = _PUSH_FIXED[op]
                need(size)
                stack.append(tag)
            elif op in _PUSH_LEN:
                size, signed, tag = _PUSH_LEN[op]
                length(size, signed)
                stack.append(tag)
            elif op == 0x68:  # h BINGET
                start = need(1)
                if data[start] not in memo:
                    raise _Stop
                stack.append(memo[data[start]])
            elif op == 0x6A:  # j LONG_BINGET
                start = need(4)
                index = int.from_bytes(data[start:pos], "little")
                if index not in memo:
                    raise _Stop
                stack.append(memo[index])
            elif op == 0x67:  # g GET
                index = _text_index(line())
                if index not in memo:
                    raise _Stop
                stack.append(memo[index])
            elif op == 0x71:  # q BINPUT
                put(data[need(1)])
            elif op == 0x72:  # r LONG_BINPUT
                start = need(4)
                put(int.from_bytes(data[start:pos], "little"))
            elif op == 0x70:  # p PUT
                put(_text_index(line()))
            elif op == 0x94:  # MEMOIZE
                put(len(memo))
            elif op == 0x8A or op == 0x8B:  # LONG1, LONG4
                n = length(1) if op == 0x8A else length(4, signed=True)
                stack.append(_safe_int(int.from_bytes(data[pos - n:pos], "little", signed=True)))
            elif op == 0x49:  # I INT
                stack.append(_text_int(line()))
            elif op == 0x4C:  # L LONG
                text = line()
                stack.append(_text_int(text[:-1] if text.endswith(b"L") else text))
            elif op == 0x56 or op == 0x53:  # V UNICODE, S STRING
                line()
                stack.append(_SAFE)
            elif op == 0x46:  # F FLOAT
                line()
                stack.append(_OTHER)
            elif op == 0x28:  # ( MARK
                marks.append(len(stack))
            elif op == 0x75:  # u SETITEMS
                items = pop_mark()
                if len(stack) <= fence():
                    raise _Stop
                keys_ok(items, "SETITEMS")
            elif op == 0x73:  # s SETITEM
                items = pop(2)
                if len(stack) <= fence():
                    raise _Stop
                keys_ok(items, "SETITEM")
            elif op == 0x64:  # d DICT
                keys_ok(pop_mark(), "DICT")
                stack.append(_OTHER)
            elif op == 0x65:  # e APPENDS
                pop_mark()
                if len(stack) <= fence():
                    raise _Stop
            elif op == 0x61:  # a APPEND
                pop(1)
                if len(stack) <= fence():
                    raise _Stop
            elif op == 0x74 or op == 0x6C:  # t TUPLE, l LIST
                pop_mark()
                stack.append(_OTHER)
            elif op in (0x85, 0x86, 0x87):  # TUPLE1..3
                pop(op - 0x84)
                stack.append(_OTHER)
            elif op == 0x30:  # 0 POP
                if marks and marks[-1] == len(stack):
                    marks.pop()
                else:
                    pop(1)
            elif op == 0x31:  # 1 POP_MARK
                pop_mark()
            elif op == 0x32:  # 2 DUP
                if len(stack) <= fence():
                    raise _Stop
                stack.append(stack[-1])
            elif op == 0x80:  # PROTO
                need(1)
            elif op == 0x95:  # FRAME
                need(8)
            elif op == 0x98:  # READONLY_BUFFER
                if len(stack) <= fence():
                    raise _Stop
            elif op in (0x8F, 0x90, 0x91):  # EMPTY_SET, ADDITEMS, FROZENSET
                raise _Refused("a set (dumps hold none, and a set of colliding values takes quadratic time)")
            else:  # STOP, a global, a persistent id, REDUCE/BUILD/NEWOBJ..., a buffer, an unknown opcode
                raise _Stop
    except _Stop:
        return None
    except _Refused as refused:
        return str(refused)
    return None


class _Refused(Exception):
    """The pickle would build a dict or set whose time to build an attacker controls."""


# Pushes with a fixed-size argument: opcode -> (argument bytes, what it pushes).
_PUSH_FIXED = {
    0x4B: (1, _SAFE), 0x4D: (2, _SAFE), 0x4A: (4, _SAFE), 0x88: (0, _SAFE), 0x89: (0, _SAFE),  # BININT1/2, BININT,
    # NEWTRUE, NEWFALSE; then NONE, BINFLOAT, EMPTY_TUPLE, EMPTY_LIST, EMPTY_DICT
    0x4E: (0, _OTHER), 0x47: (8, _OTHER), 0x29: (0, _OTHER), 0x5D: (0, _OTHER), 0x7D: (0, _OTHER),
}
# Pushes of a length-prefixed argument: opcode -> (length bytes, signed length, what it pushes). str and bytes
# are safe (salted hashes): BINUNICODE, SHORT_BINUNICODE, BINUNICODE8, BINSTRING, SHORT_BINSTRING, BINBYTES,
# SHORT_BINBYTES, BINBYTES8; a bytearray is not hashable at all (BYTEARRAY8).
_PUSH_LEN = {
    0x58: (4, False, _SAFE), 0x8C: (1, False, _SAFE), 0x8D: (8, False, _SAFE), 0x54: (4, True, _SAFE),
    0x55: (1, False, _SAFE), 0x42: (4, False, _SAFE), 0x43: (1, False, _SAFE), 0x8E: (8, False, _SAFE),
    0x96: (8, False, _OTHER),
}


try:  # pragma: no cover - depends on the build
    from ._pickle_keys import key_problem as _compiled
except ImportError:  # no compiler when installed: the Python walk
    _compiled = None
if os.environ.get("FR_OTEL_PURE_PYTHON", "").strip().lower() in ("1", "true", "yes", "on"):
    _compiled = None

#: The C walk is in use (built, and not turned off with ``FR_OTEL_PURE_PYTHON=1``).
COMPILED = _compiled is not None


def key_problem(data: bytes) -> str | None:
    """:func:`key_problem_in_python`, in C where built."""
    return _compiled(data) if _compiled is not None else key_problem_in_python(data)
