#!/usr/bin/env python3
"""Writes .npy files with numpy into a directory, as the oracle for tests/npy_test.cpp.

    /usr/bin/python3 make_npy_samples.py OUT_DIR
    /usr/bin/python3 make_npy_samples.py --check DIR

Readable samples are named <dtype>_v<major>_<shape>.npy, e.g. f4_v2_3x4.npy; element i (C order)
holds values(dtype, n)[i] below, which the C++ test recomputes. The unsupported_*.npy files are
valid numpy files that seqforge must reject. --check is the reverse direction: numpy loads every
<dtype>_<shape>.npy that seqforge wrote into DIR and compares dtype, shape and values.
"""
import os
import sys

import numpy as np
from numpy.lib import format as npy_format

SHAPES = {"scalar": (), "5": (5,), "3x4": (3, 4), "2x3x4": (2, 3, 4), "0x3": (0, 3)}


def values(code, n):
    i = np.arange(n, dtype=np.int64)
    if code == "f4":
        return (i * 0.25 - 1.5).astype("<f4")  # exact in float32
    if code == "f8":
        return (i / 3.0 - 2.0).astype("<f8")  # same IEEE operations as the C++ side
    if code == "i4":
        return (i * 7 - 20).astype("<i4")
    if code == "i8":
        return (i * 3_000_000_000 - 5).astype("<i8")  # beyond 32 bits
    raise ValueError(code)


def save(path, array, version):
    with open(path, "wb") as f:
        npy_format.write_array(f, array, version=version, allow_pickle=False)


def check(directory):
    names = sorted(n for n in os.listdir(directory) if n.endswith(".npy"))
    if not names:
        sys.exit(f"--check: no .npy files in {directory}")
    for name in names:
        code, shape_name = name[: -len(".npy")].split("_", 1)
        shape = SHAPES[shape_name]
        array = np.load(os.path.join(directory, name), allow_pickle=False)
        expected = values(code, int(np.prod(shape))).reshape(shape)
        if array.dtype != expected.dtype or array.shape != shape:
            got, want = f"{array.dtype}{array.shape}", f"{expected.dtype}{shape}"
            sys.exit(f"--check: {name}: got {got}, expected {want}")
        if not np.array_equal(array, expected):
            sys.exit(f"--check: {name}: values differ")
        if not array.flags.c_contiguous:
            sys.exit(f"--check: {name}: not C order")
    print(f"--check: {len(names)} files match")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        check(sys.argv[2])
        return
    if len(sys.argv) != 2:
        sys.exit("usage: make_npy_samples.py OUT_DIR | --check DIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)

    for code in ("f4", "f8", "i4", "i8"):
        for version in ((1, 0), (2, 0), (3, 0)):
            for name, shape in SHAPES.items():
                array = values(code, int(np.prod(shape))).reshape(shape)
                save(os.path.join(out, f"{code}_v{version[0]}_{name}.npy"), array, version)

    # np.save's own choice of version and padding.
    np.save(os.path.join(out, "np_save_f8_3x4.npy"), values("f8", 12).reshape(3, 4))
    # Fortran order (np.save of a transposed view, or of a pandas frame's .values): read as the
    # C-order arrays fortran_f4_3x4_c.npy and fortran_i8_2x3x4_c.npy hold.
    for name, array in (("fortran_f4_3x4", values("f4", 12).reshape(3, 4)),
                        ("fortran_i8_2x3x4", values("i8", 24).reshape(2, 3, 4))):
        save(os.path.join(out, name + ".npy"), np.asfortranarray(array), (1, 0))
        save(os.path.join(out, name + "_c.npy"), np.ascontiguousarray(array), (1, 0))
    save(os.path.join(out, "unsupported_big_endian.npy"), values("f4", 5).astype(">f4"), (1, 0))
    save(os.path.join(out, "unsupported_big_endian_i8.npy"), values("i8", 5).astype(">i8"), (1, 0))
    # Half floats (numpy's float16): read as they are, each exactly a double.
    half = np.array([0.0, 1.5, -2.25, 65504.0, 2.0**-24], dtype="<f2")
    save(os.path.join(out, "half_5.npy"), half, (1, 0))
    save(os.path.join(out, "unsupported_b1.npy"), np.arange(5) % 2 == 0, (1, 0))
    save(os.path.join(out, "unsupported_c8.npy"), np.arange(5, dtype="<c8"), (1, 0))
    save(os.path.join(out, "unsupported_u2.npy"), np.arange(5, dtype="<u2"), (1, 0))
    structured = np.zeros(3, dtype=[("a", "<f4"), ("b", "<i4")])
    save(os.path.join(out, "unsupported_structured.npy"), structured, (1, 0))


if __name__ == "__main__":
    main()
