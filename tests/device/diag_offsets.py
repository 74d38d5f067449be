"""Where do uprobes on libnccl land? Compare ELF symbol values with the probed IPs."""
import struct
import sys

sys.path.insert(0, sys.argv[2] if len(sys.argv) > 2 else ".")
from capture.elf import exported_functions

lib = sys.argv[1]
syms = exported_functions(lib)
with open(lib, "rb") as fh:
    eh = fh.read(64)
    phoff, = struct.unpack_from("<Q", eh, 32)
    phentsize, phnum = struct.unpack_from("<HH", eh, 54)
    fh.seek(phoff)
    for i in range(phnum):
        p_type, p_flags, p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, p_align = struct.unpack("<IIQQQQQQ", fh.read(phentsize)[:56])
        if p_type == 1:
            print(f"PT_LOAD flags={p_flags} offset=0x{p_offset:x} vaddr=0x{p_vaddr:x} filesz=0x{p_filesz:x} delta=0x{p_vaddr - p_offset:x}")
for name in ("ncclGetUniqueId", "ncclCommInitRank", "ncclCommInitRankConfig", "ncclAllReduce", "ncclGroupEnd",
             "ncclCommInitRankScalable", "pncclCommInitRank"):
    s = syms.get(name)
    print(name, f"value=0x{s.value:x} size={s.size}" if s else "absent")
same = {}
for n, s in syms.items():
    same.setdefault(s.value, []).append(n)
print("aliases:", [v for v in same.values() if len(v) > 1][:10])
