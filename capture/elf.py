"""Exported function symbols of an ELF shared object (``.dynsym``), standard library only.

The tracer may only name uprobes that exist (bpftrace refuses to start otherwise),
and libnccl can hide inside another library (``libtorch_cuda.so`` links NCCL
statically and may export its API), so capture asks the file itself which of
NCCL's and CUDA's entry points it defines.

Layouts (System V gABI): the ELF header locates the section header table; the
``SHT_DYNSYM`` section's ``sh_link`` names its string table. A symbol is
*defined* when ``st_shndx`` is not ``SHN_UNDEF``; only ``STT_FUNC``/``STT_GNU_IFUNC``
with ``STB_GLOBAL``/``STB_WEAK`` binding and default/protected visibility can be
probed by name.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass

SHT_DYNSYM = 11
STT_FUNC, STT_GNU_IFUNC = 2, 10
STB_GLOBAL, STB_WEAK = 1, 2
STV_HIDDEN, STV_INTERNAL = 2, 1

# (ELF class, byte order) -> header/section/symbol layouts
_LAYOUT = {
    # e_shoff, e_shentsize, e_shnum, e_shstrndx offsets come from the header struct
    1: dict(ehdr="HHIIIIIHHHHHH", shdr="IIIIIIIIII", sym="IIIBBH", sym_size=16),
    2: dict(ehdr="HHIQQQIHHHHHH", shdr="IIQQQQIIQQ", sym="IBBHQQ", sym_size=24),
}


class ElfError(ValueError):
    """Not an ELF file, or one whose dynamic symbol table cannot be read."""


@dataclass(frozen=True)
class Symbol:
    name: str
    value: int
    size: int


def _read_at(fh, offset: int, size: int) -> bytes:
    fh.seek(offset)
    data = fh.read(size)
    if len(data) != size:
        raise ElfError(f"truncated ELF file (wanted {size} bytes at {offset})")
    return data


@dataclass(frozen=True)
class Section:
    """One section header: its name, type, and where its bytes lie in the file."""
    name: str
    type: int
    offset: int
    size: int


def _open_sections(fh, path) -> tuple[str, int, int, list[tuple]]:
    """(byte order, ELF class, index of the section name table, raw section header tuples)
    of an open ELF file."""
    ident = fh.read(16)
    if len(ident) < 16 or ident[:4] != b"\x7fELF":
        raise ElfError(f"{path}: not an ELF file")
    cls, data = ident[4], ident[5]
    if cls not in _LAYOUT or data not in (1, 2):
        raise ElfError(f"{path}: unsupported ELF class {cls} / data encoding {data}")
    bo = "<" if data == 1 else ">"
    lay = _LAYOUT[cls]
    ehdr = struct.Struct(bo + lay["ehdr"])
    (_type, _machine, _version, _entry, _phoff, shoff, _flags, _ehsize, _phentsize, _phnum,
     shentsize, shnum, shstrndx) = ehdr.unpack(_read_at(fh, 16, ehdr.size))
    if shoff == 0 or shnum == 0:
        raise ElfError(f"{path}: no section headers")
    shdr = struct.Struct(bo + lay["shdr"])
    if shentsize < shdr.size:
        raise ElfError(f"{path}: bad section header size {shentsize}")
    table = _read_at(fh, shoff, shentsize * shnum)
    return bo, cls, shstrndx, [shdr.unpack_from(table, i * shentsize) for i in range(shnum)]


def sections(path: str | os.PathLike) -> list[Section]:
    """The sections of ``path`` (names from the section header string table), in header order.
    Raises ElfError for a file that is not ELF or has no section headers (stripped with
    ``sstrip``), OSError when it cannot be read."""
    with open(path, "rb") as fh:
        _bo, _cls, shstrndx, raw = _open_sections(fh, path)
        names = b""
        if 0 < shstrndx < len(raw):
            names = _read_at(fh, raw[shstrndx][4], raw[shstrndx][5])
        out = []
        for sec in raw:
            end = names.find(b"\0", sec[0])
            name = names[sec[0]:end if end >= 0 else None].decode("utf-8", "replace") if sec[0] < len(names) else ""
            out.append(Section(name, sec[1], sec[4], sec[5]))
        return out


def exported_functions(path: str | os.PathLike) -> dict[str, Symbol]:
    """Defined, visible function symbols of ``path``'s ``.dynsym``, by name."""
    with open(path, "rb") as fh:
        bo, cls, _shstrndx, sections = _open_sections(fh, path)
        lay = _LAYOUT[cls]
        out: dict[str, Symbol] = {}
        for sec in sections:
            _name, sh_type, _fl, _addr, sh_offset, sh_size, sh_link, _info, _align, sh_entsize = sec
            if sh_type != SHT_DYNSYM:
                continue
            if sh_link >= len(sections):
                raise ElfError(f"{path}: .dynsym links to a missing string table")
            strtab = sections[sh_link]
            strings = _read_at(fh, strtab[4], strtab[5])
            symdata = _read_at(fh, sh_offset, sh_size)
            sym = struct.Struct(bo + lay["sym"])
            step = sh_entsize or lay["sym_size"]
            for off in range(0, len(symdata) - sym.size + 1, step):
                f = sym.unpack_from(symdata, off)
                if cls == 2:
                    st_name, st_info, st_other, st_shndx, st_value, st_size = f
                else:
                    st_name, st_value, st_size, st_info, st_other, st_shndx = f
                if st_shndx == 0 or st_name == 0:
                    continue
                bind, typ, vis = st_info >> 4, st_info & 0xF, st_other & 0x3
                if typ not in (STT_FUNC, STT_GNU_IFUNC) or bind not in (STB_GLOBAL, STB_WEAK):
                    continue
                if vis in (STV_HIDDEN, STV_INTERNAL):
                    continue
                end = strings.find(b"\0", st_name)
                name = strings[st_name:end if end >= 0 else None].decode("utf-8", "replace")
                # versioned duplicates keep the first (default) definition
                out.setdefault(name, Symbol(name, st_value, st_size))
        return out


_CACHE: dict[tuple, dict[str, Symbol]] = {}


def exported_functions_cached(path: str) -> dict[str, Symbol]:
    """``exported_functions`` memoised on (path, device, inode, mtime, size)."""
    st = os.stat(path)
    key = (path, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
    if key not in _CACHE:
        _CACHE[key] = exported_functions(path)
    return _CACHE[key]
