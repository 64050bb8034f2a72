"""A small ELF reader: what the dynamic linker reads from a shared library, and nothing more.

Reads the dynamic section (``DT_NEEDED``, ``DT_SONAME``, ``DT_RUNPATH``, ``DT_RPATH``), the dynamic
symbol table and its GNU version information (which library each undefined symbol is bound to,
through ``.gnu.version_r``, and the versions a library defines, through ``.gnu.version_d``). Only
the Python standard library is used, and only the parts of the file that hold these tables are
read: a 500 MB library costs a few MB of reads.

ELF32 and ELF64, little- and big-endian. The symbol count comes from the section headers when the
file has them, else from ``DT_HASH`` or ``DT_GNU_HASH``, as the dynamic linker itself finds it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import BinaryIO

__all__ = ["ElfError", "ElfInfo", "Symbol", "read_elf"]

_MAGIC = b"\x7fELF"
# Dynamic tags (elf.h).
_DT_NULL, _DT_NEEDED, _DT_HASH, _DT_STRTAB, _DT_SYMTAB, _DT_STRSZ = 0, 1, 4, 5, 6, 10
_DT_SONAME, _DT_RPATH, _DT_RUNPATH = 14, 15, 29
_DT_GNU_HASH, _DT_VERSYM = 0x6FFFFEF5, 0x6FFFFFF0
_DT_VERDEF, _DT_VERDEFNUM, _DT_VERNEED, _DT_VERNEEDNUM = 0x6FFFFFFC, 0x6FFFFFFD, 0x6FFFFFFE, 0x6FFFFFFF
_PT_LOAD, _PT_DYNAMIC = 1, 2
_SHT_DYNSYM = 11
_STB_WEAK = 2
_MACHINES = {3: "x86", 62: "x86-64", 183: "aarch64", 21: "ppc64", 40: "arm", 243: "riscv"}
# A bound on every table read, so a damaged file cannot make the reader allocate without limit.
_MAX_TABLE_BYTES = 256 << 20


class ElfError(ValueError):
    """The file is not an ELF file, or a table it points to lies outside it."""


@dataclass(frozen=True)
class Symbol:
    """One dynamic symbol: its name, its version (``""`` when unversioned) and, for an undefined
    one, the library its version names (``""`` when unversioned)."""

    name: str
    version: str = ""
    library: str = ""
    weak: bool = False


@dataclass(frozen=True)
class ElfInfo:
    """What the dynamic linker reads from one ELF file.

    Attributes:
        machine: The architecture (``"x86-64"``, ``"aarch64"``, or ``"machine 123"``).
        bits: 32 or 64.
        soname: ``DT_SONAME`` (``""`` when absent: the file is then known by its file name).
        needed: ``DT_NEEDED`` entries, in order.
        runpath: ``DT_RUNPATH`` entries (``$ORIGIN`` not expanded).
        rpath: ``DT_RPATH`` entries (used only when there is no ``DT_RUNPATH``).
        defined: Names of the dynamic symbols the file defines (exports).
        defined_versions: (name, version) of each versioned symbol the file defines.
        undefined: The dynamic symbols it needs from others.
    """

    machine: str
    bits: int
    soname: str = ""
    needed: tuple[str, ...] = ()
    runpath: tuple[str, ...] = ()
    rpath: tuple[str, ...] = ()
    defined: frozenset[str] = field(default_factory=frozenset)
    defined_versions: frozenset[tuple[str, str]] = field(default_factory=frozenset)
    undefined: tuple[Symbol, ...] = ()

    def search_path(self) -> tuple[str, ...]:
        """The folders this file's own lookups search, before the system's: RUNPATH, else RPATH."""
        return self.runpath if self.runpath else self.rpath


class _Reader:
    def __init__(self, f: BinaryIO):
        self.f = f
        f.seek(0, 2)
        self.size = f.tell()
        head = self._read(0, 64 if self.size >= 64 else self.size)
        if len(head) < 52 or head[:4] != _MAGIC:
            raise ElfError("not an ELF file (no \\x7fELF magic)")
        if head[4] not in (1, 2) or head[5] not in (1, 2):
            raise ElfError(f"unknown ELF class {head[4]} or byte order {head[5]}")
        self.bits = 64 if head[4] == 2 else 32
        self.end = "<" if head[5] == 1 else ">"
        if self.bits == 64:
            fields = struct.unpack_from(self.end + "HHIQQQIHHHHHH", head, 16)
        else:
            fields = struct.unpack_from(self.end + "HHIIIIIHHHHHH", head, 16)
        (
            _,
            self.machine,
            _,
            _,
            self.phoff,
            self.shoff,
            _,
            _,
            self.phentsize,
            self.phnum,
            self.shentsize,
            self.shnum,
            _,
        ) = fields
        self.word = "Q" if self.bits == 64 else "I"

    def _read(self, offset: int, size: int) -> bytes:
        if offset < 0 or size < 0 or size > _MAX_TABLE_BYTES or offset + size > self.size:
            raise ElfError(f"a table at offset {offset} of {size} bytes lies outside the {self.size}-byte file")
        self.f.seek(offset)
        data = self.f.read(size)
        if len(data) != size:
            raise ElfError(f"short read at offset {offset}")
        return data

    def segments(self) -> list[tuple[int, int, int, int]]:
        """(type, offset, vaddr, filesz) of every program header."""
        if self.phnum == 0:
            return []
        table = self._read(self.phoff, self.phentsize * self.phnum)
        out = []
        for i in range(self.phnum):
            base = i * self.phentsize
            if self.bits == 64:
                p_type, _, off, vaddr, _, filesz, _, _ = struct.unpack_from(self.end + "IIQQQQQQ", table, base)
            else:
                p_type, off, vaddr, _, filesz, _, _, _ = struct.unpack_from(self.end + "IIIIIIII", table, base)
            out.append((p_type, off, vaddr, filesz))
        return out

    def sections(self) -> list[tuple[int, int, int, int, int]]:
        """(type, offset, size, link, entsize) of every section header (empty when there are none)."""
        if self.shoff == 0 or self.shnum == 0 or self.shoff + self.shentsize * self.shnum > self.size:
            return []
        table = self._read(self.shoff, self.shentsize * self.shnum)
        out = []
        for i in range(self.shnum):
            base = i * self.shentsize
            if self.bits == 64:
                _, sh_type, _, _, off, size, link, _, _, entsize = struct.unpack_from(
                    self.end + "IIQQQQIIQQ", table, base
                )
            else:
                _, sh_type, _, _, off, size, link, _, _, entsize = struct.unpack_from(
                    self.end + "IIIIIIIIII", table, base
                )
            out.append((sh_type, off, size, link, entsize))
        return out


def _offset_of(address: int, loads: list[tuple[int, int, int, int]]) -> int:
    """The file offset of a virtual address, through the PT_LOAD segment that maps it."""
    for _, offset, vaddr, filesz in loads:
        if vaddr <= address < vaddr + filesz:
            return address - vaddr + offset
    raise ElfError(f"address {address:#x} is in no loaded segment")


def _cstr(table: bytes, offset: int) -> str:
    if offset >= len(table):
        raise ElfError(f"string offset {offset} is past the {len(table)}-byte string table")
    end = table.find(b"\0", offset)
    return table[offset : end if end >= 0 else len(table)].decode("utf-8", "replace")


def _dynamic(r: _Reader, segments) -> dict[int, list[int]]:
    dyn = [s for s in segments if s[0] == _PT_DYNAMIC]
    if not dyn:
        return {}
    _, offset, _, filesz = dyn[0]
    data = r._read(offset, filesz)
    entry = struct.Struct(r.end + ("qQ" if r.bits == 64 else "iI"))
    tags: dict[int, list[int]] = {}
    for tag, value in entry.iter_unpack(data[: len(data) - len(data) % entry.size]):
        if tag == _DT_NULL:
            break
        tags.setdefault(tag, []).append(value)
    return tags


def _symbol_count(r: _Reader, tags, loads, sections) -> tuple[int, int]:
    """(file offset of the dynamic symbol table, number of symbols)."""
    entsize = 24 if r.bits == 64 else 16
    for sh_type, offset, size, _, sh_entsize in sections:
        if sh_type == _SHT_DYNSYM:
            return offset, size // (sh_entsize or entsize)
    symtab = _offset_of(tags[_DT_SYMTAB][0], loads)
    if _DT_HASH in tags:  # nchain, the second word of the SysV hash table, is the symbol count
        return symtab, struct.unpack_from(r.end + "II", r._read(_offset_of(tags[_DT_HASH][0], loads), 8))[1]
    if _DT_GNU_HASH not in tags:
        return symtab, 0
    # GNU hash: the highest symbol any bucket starts at, then along its chain to the end marker.
    table = _offset_of(tags[_DT_GNU_HASH][0], loads)
    nbuckets, symoffset, bloom_size, _ = struct.unpack_from(r.end + "IIII", r._read(table, 16))
    buckets_at = table + 16 + bloom_size * (8 if r.bits == 64 else 4)
    buckets = struct.unpack(r.end + f"{nbuckets}I", r._read(buckets_at, 4 * nbuckets))
    last = max(buckets, default=0)
    if last < symoffset:
        return symtab, symoffset
    chain_at = buckets_at + 4 * nbuckets
    while True:
        (value,) = struct.unpack(r.end + "I", r._read(chain_at + 4 * (last - symoffset), 4))
        if value & 1:
            return symtab, last + 1
        last += 1


def _version_needs(r: _Reader, tags, loads, strtab: bytes) -> dict[int, tuple[str, str]]:
    """Version index -> (version name, library file) from ``.gnu.version_r``."""
    out: dict[int, tuple[str, str]] = {}
    if _DT_VERNEED not in tags:
        return out
    at = _offset_of(tags[_DT_VERNEED][0], loads)
    for _ in range(tags.get(_DT_VERNEEDNUM, [0])[0]):
        _, count, file_name, aux, next_need = struct.unpack(r.end + "HHIII", r._read(at, 16))
        library = _cstr(strtab, file_name)
        aux_at = at + aux
        for _ in range(count):
            _, _, other, name, next_aux = struct.unpack(r.end + "IHHII", r._read(aux_at, 16))
            out[other & 0x7FFF] = (_cstr(strtab, name), library)
            if not next_aux:
                break
            aux_at += next_aux
        if not next_need:
            break
        at += next_need
    return out


def _version_defs(r: _Reader, tags, loads, strtab: bytes) -> dict[int, str]:
    """Version index -> version name from ``.gnu.version_d`` (the file's own base version included)."""
    out: dict[int, str] = {}
    if _DT_VERDEF not in tags:
        return out
    at = _offset_of(tags[_DT_VERDEF][0], loads)
    for _ in range(tags.get(_DT_VERDEFNUM, [0])[0]):
        _, _, index, count, _, aux, next_def = struct.unpack(r.end + "HHHHIII", r._read(at, 20))
        if count:
            name, _ = struct.unpack(r.end + "II", r._read(at + aux, 8))
            out[index & 0x7FFF] = _cstr(strtab, name)
        if not next_def:
            break
        at += next_def
    return out


def _symbols(r: _Reader, tags, loads, sections, strtab: bytes):
    if _DT_SYMTAB not in tags and not any(s[0] == _SHT_DYNSYM for s in sections):
        return frozenset(), frozenset(), ()
    at, count = _symbol_count(r, tags, loads, sections)
    entsize = 24 if r.bits == 64 else 16
    table = r._read(at, count * entsize)
    versym = ()
    if _DT_VERSYM in tags and count:
        versym = struct.unpack(r.end + f"{count}H", r._read(_offset_of(tags[_DT_VERSYM][0], loads), 2 * count))
    needs = _version_needs(r, tags, loads, strtab)
    defs = _version_defs(r, tags, loads, strtab)
    defined: set[str] = set()
    defined_versions: set[tuple[str, str]] = set()
    undefined: list[Symbol] = []
    layout = r.end + ("IBBHQQ" if r.bits == 64 else "IIIBBH")
    for i in range(1, count):  # symbol 0 is the reserved null symbol
        if r.bits == 64:
            name_at, info, _, shndx, _, _ = struct.unpack_from(layout, table, i * entsize)
        else:
            name_at, _, _, info, _, shndx = struct.unpack_from(layout, table, i * entsize)
        if not name_at:
            continue
        name = _cstr(strtab, name_at)
        index = versym[i] & 0x7FFF if versym else 0
        if shndx == 0:  # SHN_UNDEF: needed from another object
            version, library = needs.get(index, ("", ""))
            undefined.append(Symbol(name, version, library, weak=(info >> 4) == _STB_WEAK))
        else:
            defined.add(name)
            if index > 1 and index in defs:
                defined_versions.add((name, defs[index]))
    return frozenset(defined), frozenset(defined_versions), tuple(undefined)


def read_elf(f: BinaryIO, *, symbols: bool = True) -> ElfInfo:
    """Read what the dynamic linker needs from an open ELF file (binary mode, seekable).

    Args:
        f: The file; read, never written. Its position afterwards is unspecified.
        symbols: Also read the dynamic symbol table and its versions (the larger part of the reads).

    Raises:
        ElfError: ``f`` is not an ELF file, or a table it points to lies outside it.
    """
    r = _Reader(f)
    segments = r.segments()
    loads = [s for s in segments if s[0] == _PT_LOAD]
    tags = _dynamic(r, segments)
    machine = _MACHINES.get(r.machine, f"machine {r.machine}")
    if not tags:  # a static executable or an object file: no dynamic linking at all
        return ElfInfo(machine=machine, bits=r.bits)
    strtab = r._read(_offset_of(tags[_DT_STRTAB][0], loads), tags[_DT_STRSZ][0])

    def names(tag: int) -> list[str]:
        return [_cstr(strtab, v) for v in tags.get(tag, [])]

    def paths(tag: int) -> tuple[str, ...]:
        return tuple(p for value in names(tag) for p in value.split(":") if p)

    defined, defined_versions, undefined = (
        _symbols(r, tags, loads, r.sections(), strtab) if symbols else (frozenset(), frozenset(), ())
    )
    return ElfInfo(
        machine=machine,
        bits=r.bits,
        soname=(names(_DT_SONAME) or [""])[0],
        needed=tuple(names(_DT_NEEDED)),
        runpath=paths(_DT_RUNPATH),
        rpath=paths(_DT_RPATH),
        defined=defined,
        defined_versions=defined_versions,
        undefined=undefined,
    )
