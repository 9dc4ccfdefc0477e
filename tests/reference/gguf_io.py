"""Minimal GGUF v3 reading and writing with the standard library (struct).

Only what make_reference.py needs: metadata of every value type, tensor
infos, F32/F16 tensor data, and writing F32 / MXFP4 tensors. Format facts:
little-endian; header "GGUF", u32 version, u64 tensor count, u64 kv count;
strings are u64 length + bytes; tensor data starts at the next multiple of
general.alignment (default 32) after the tensor infos, each tensor aligned.
"""
import struct

ALIGN = 32
# value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
           BOOL: "<B", U64: "<Q", I64: "<q", F64: "<d"}
# tensor types used here: (block elems, block bytes)
TYPE_F32, TYPE_F16, TYPE_MXFP4 = 0, 1, 39
_TYPE_BLOCK = {TYPE_F32: (1, 4), TYPE_F16: (1, 2), TYPE_MXFP4: (32, 17)}


class Reader:
    def __init__(self, path):
        with open(path, "rb") as f:
            self.buf = f.read()
        self.pos = 0
        if self.buf[:4] != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        self.pos = 4
        self.version = self._u("<I")
        n_tensors = self._u("<Q")
        n_kv = self._u("<Q")
        self.meta = {}
        for _ in range(n_kv):
            key = self._str()
            vtype = self._u("<I")
            self.meta[key] = self._value(vtype)
        self.tensors = {}
        infos = []
        for _ in range(n_tensors):
            name = self._str()
            n_dims = self._u("<I")
            dims = [self._u("<Q") for _ in range(n_dims)]
            ttype = self._u("<I")
            offset = self._u("<Q")
            infos.append((name, dims, ttype, offset))
        align = self.meta.get("general.alignment", ALIGN)
        data_start = (self.pos + align - 1) // align * align
        for name, dims, ttype, offset in infos:
            self.tensors[name] = (dims, ttype, data_start + offset)

    def _u(self, fmt):
        v = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return v

    def _str(self):
        n = self._u("<Q")
        s = self.buf[self.pos:self.pos + n].decode("utf-8", errors="replace")
        self.pos += n
        return s

    def _value(self, vtype):
        if vtype == STR:
            return self._str()
        if vtype == ARR:
            et = self._u("<I")
            n = self._u("<Q")
            return [self._value(et) for _ in range(n)]
        v = self._u(_SCALAR[vtype])
        return bool(v) if vtype == BOOL else v

    def floats(self, name):
        """Tensor as a flat list of floats (F32 or F16) and its ggml dims."""
        dims, ttype, off = self.tensors[name]
        n = 1
        for d in dims:
            n *= d
        if ttype == TYPE_F32:
            return list(struct.unpack_from(f"<{n}f", self.buf, off)), dims
        if ttype == TYPE_F16:
            return list(struct.unpack_from(f"<{n}e", self.buf, off)), dims
        raise ValueError(f"tensor {name}: type {ttype} not handled by this reader")


class Writer:
    """Collects metadata and tensors, then writes a GGUF v3 file."""

    def __init__(self, arch):
        self.kv = []
        self.tensors = []  # (name, dims, type, bytes)
        self.add("general.architecture", STR, arch)
        self.add("general.alignment", U32, ALIGN)

    def add(self, key, vtype, value):
        self.kv.append((key, vtype, value))

    def u32(self, key, v): self.add(key, U32, int(v))
    def f32(self, key, v): self.add(key, F32, float(v))
    def str(self, key, v): self.add(key, STR, v)

    def tensor_f32(self, name, dims, flat):
        self.tensors.append((name, list(dims), TYPE_F32, struct.pack(f"<{len(flat)}f", *flat)))

    def tensor_raw(self, name, dims, ttype, data):
        self.tensors.append((name, list(dims), ttype, bytes(data)))

    @staticmethod
    def _s(s):
        b = s.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    def _v(self, vtype, value):
        if vtype == STR:
            return self._s(value)
        return struct.pack(_SCALAR[vtype], value)

    def write(self, path):
        out = bytearray(b"GGUF")
        out += struct.pack("<IQQ", 3, len(self.tensors), len(self.kv))
        for key, vtype, value in self.kv:
            out += self._s(key) + struct.pack("<I", vtype) + self._v(vtype, value)
        offset = 0
        offsets = []
        for name, dims, ttype, data in self.tensors:
            offsets.append(offset)
            out += self._s(name) + struct.pack("<I", len(dims))
            out += b"".join(struct.pack("<Q", d) for d in dims)
            out += struct.pack("<IQ", ttype, offset)
            offset += (len(data) + ALIGN - 1) // ALIGN * ALIGN
        out += b"\0" * ((-len(out)) % ALIGN)
        for (name, dims, ttype, data), off in zip(self.tensors, offsets):
            out += data + b"\0" * ((-len(data)) % ALIGN)
        with open(path, "wb") as f:
            f.write(out)
