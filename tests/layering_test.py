"""The folders' includes point down the layers only (docs/internals.md, "Layout and conventions"): a file
may include headers of its own layer and of the layers below it, never of one above; kernels
include only the op descriptions of the backend layer; CUDA's headers (the runtime, cuBLAS,
cuDNN, NCCL) only in backend/cuda and kernels/cuda."""
import os
import re
import sys

# Lowest first; folders on one line share a layer.
LAYERS = [
    ["core", "io"],
    ["kernels", "backend"],
    ["nn", "optim", "data", "text"],
    ["dist"],
    ["train", "tune", "bench", "report"],
    ["cli", "python"],
]
RANK = {folder: i for i, layer in enumerate(LAYERS) for folder in layer}
# Public headers (seqforge/<folder>/...) and the private ones under src/ (<folder>/...).
INCLUDE = re.compile(r'#include "(?:seqforge/)?(\w+)/([\w./]+)"')
# Kernels see only the op descriptions of the backend layer, never the backend itself.
KERNELS_MAY_INCLUDE = {"backend/ops.hpp"}
# CUDA's headers, and the folders that alone may include them.
CUDA_HEADER = re.compile(r"#include <(cuda|cublas|cudnn|nccl|nvml|curand|cufft|nvrtc)\w*[./]")
CUDA_FOLDERS = (os.path.join("src", "backend", "cuda"), os.path.join("src", "kernels", "cuda"))


def folder_of(root, path):
    parts = os.path.relpath(path, root).split(os.sep)
    # src/<folder>/..., include/seqforge/<folder>/...
    return parts[2] if parts[0] == "include" else parts[1]


def main(root):
    upward = []
    for base in ("src", os.path.join("include", "seqforge")):
        for directory, _, files in os.walk(os.path.join(root, base)):
            for name in files:
                path = os.path.join(directory, name)
                folder = folder_of(root, path)
                if folder not in RANK:
                    continue
                with open(path, encoding="utf-8", errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        if (CUDA_HEADER.match(line) and not
                                os.path.relpath(path, root).startswith(CUDA_FOLDERS)):
                            upward.append(f"{os.path.relpath(path, root)}:{number}: includes "
                                          f"{line.strip()[9:]} outside backend/cuda and "
                                          "kernels/cuda")
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        where = f"{os.path.relpath(path, root)}:{number}: {folder}/"
                        if RANK.get(m.group(1), -1) > RANK[folder]:
                            upward.append(f"{where} includes {m.group(1)}/, a layer above it")
                        elif (folder == "kernels" and m.group(1) == "backend" and
                              f"backend/{m.group(2)}" not in KERNELS_MAY_INCLUDE):
                            upward.append(f"{where} includes backend/{m.group(2)}; kernels see "
                                          "only backend/ops.hpp")
    checked = sum(1 for _ in os.walk(os.path.join(root, "src")))
    if checked < 10:
        sys.exit(f"{root}: expected the source tree (src/ with its folders)")
    for line in upward:
        print(line)
    sys.exit(1 if upward else 0)


if __name__ == "__main__":
    main(sys.argv[1])
