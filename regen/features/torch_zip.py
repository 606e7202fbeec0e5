"""`torch.save`'s file format for a flat dict of tensors, written without torch.

SpecForge's offline reader opens each sample with `torch.load(path, weights_only=False,
mmap=True)` (specforge/runtime/data_plane/feature_store.py `load_feature_file`), so its files
must be torch's own: regen's venv has no torch (a 2 GB dependency for one file format), and
the format of `torch/serialization.py` `_save` is small and stable:

- a zip archive, stored (no compression), every entry under `<archive>/`: `data.pkl`,
  `.format_version` ("1"), `.storage_alignment` ("64"), `byteorder` ("little"), one
  `data/<key>` per tensor, `version` ("3"), `.data/serialization_id`;
- `data.pkl`, pickle protocol 2: the dict, each tensor as
  `torch._utils._rebuild_tensor_v2((“storage”, torch.<Type>Storage, key, "cpu", numel),
  0, size, stride, False, collections.OrderedDict())`, the storage a persistent id;
- each `data/<key>` starts at a multiple of 64 bytes of the file (torch pads the local
  header's extra field), which `mmap=True` relies on.

The pickle is written opcode by opcode: Python's pickler refuses to name a global (torch's)
it cannot import. tests/trainers load these files with the real torch and SpecForge's reader.
"""

from __future__ import annotations

import hashlib
import io
import struct
import zipfile

import numpy as np

from regen.features.encode import BF16

ALIGNMENT = 64
_STORAGE = {
    np.dtype(np.int64): "LongStorage",
    np.dtype(np.int32): "IntStorage",
    np.dtype(np.uint8): "ByteStorage",
    np.dtype(np.float32): "FloatStorage",
    np.dtype(np.float16): "HalfStorage",
    BF16: "BFloat16Storage",
}


def _unicode(text: str) -> bytes:
    data = text.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def _int(value: int) -> bytes:
    if 0 <= value < 256:
        return b"K" + struct.pack("<B", value)
    if 0 <= value < 65536:
        return b"M" + struct.pack("<H", value)
    return b"J" + struct.pack("<i", value)


def _tuple(items: list[bytes]) -> bytes:
    short = {0: b")", 1: b"\x85", 2: b"\x86", 3: b"\x87"}
    if len(items) in short:
        return b"".join(items) + short[len(items)]
    return b"(" + b"".join(items) + b"t"


def _pickle(tensors: dict[str, np.ndarray]) -> bytes:
    out = [b"\x80\x02", b"}", b"("]
    for key, (name, array) in enumerate(tensors.items()):
        storage = _STORAGE[array.dtype]
        strides = [s // array.itemsize for s in array.strides]
        out += [
            _unicode(name),
            b"ctorch._utils\n_rebuild_tensor_v2\n",
            b"(",
            _tuple(
                [
                    _unicode("storage"),
                    f"ctorch\n{storage}\n".encode(),
                    _unicode(str(key)),
                    _unicode("cpu"),
                    _int(array.size),
                ]
            ),
            b"Q",  # BINPERSID: the storage above
            _int(0),
            _tuple([_int(d) for d in array.shape]),
            _tuple([_int(s) for s in strides]),
            b"\x89",  # False: requires_grad
            b"ccollections\nOrderedDict\n)R",
            b"t",
            b"R",
        ]
    out += [b"u", b"."]
    return b"".join(out)


def dumps(tensors: dict[str, np.ndarray], archive: str = "archive") -> bytes:
    """A `torch.save` file of `tensors` (C-contiguous, little-endian, dtypes of _STORAGE)."""
    arrays = {name: np.ascontiguousarray(a) for name, a in tensors.items()}
    records: list[tuple[str, bytes]] = [
        ("data.pkl", _pickle(arrays)),
        (".format_version", b"1"),
        (".storage_alignment", str(ALIGNMENT).encode()),
        ("byteorder", b"little"),
    ]
    records += [(f"data/{key}", a.tobytes()) for key, a in enumerate(arrays.values())]
    records.append(("version", b"3\n"))
    digest = hashlib.sha256(b"".join(data for _, data in records)).hexdigest()[:40]
    records.append((".data/serialization_id", digest.encode()))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive_file:
        for name, data in records:
            info = zipfile.ZipInfo(f"{archive}/{name}", date_time=(1980, 1, 1, 0, 0, 0))
            if name.startswith("data/"):
                # Pad the local header's extra field so the data starts on ALIGNMENT.
                start = buffer.tell() + 30 + len(info.filename.encode())
                pad = -(start + 4) % ALIGNMENT
                info.extra = struct.pack("<HH", 0x4246, pad) + b"Z" * pad  # "FB", as torch
            archive_file.writestr(info, data)
    return buffer.getvalue()
