# Writes OUT, a header defining SEQFORGE_SOURCE_ID: a digest of the library's sources (src/ and
# include/ under ROOT), so that the autotuning cache can tell choices made by other code apart.
# The header is rewritten only when the digest changes, so an unchanged tree rebuilds nothing.
file(GLOB_RECURSE files LIST_DIRECTORIES false RELATIVE "${ROOT}"
  "${ROOT}/src/*.cpp" "${ROOT}/src/*.hpp" "${ROOT}/src/*.h" "${ROOT}/src/*.cu" "${ROOT}/src/*.cuh"
  "${ROOT}/include/*.hpp" "${ROOT}/include/*.h")
list(SORT files)
set(digests "")
foreach(file IN LISTS files)
  file(SHA256 "${ROOT}/${file}" digest)
  string(APPEND digests "${file} ${digest}\n")
endforeach()
string(SHA256 id "${digests}")
string(SUBSTRING "${id}" 0 12 id)
file(CONFIGURE OUTPUT "${OUT}" CONTENT "#pragma once\n#define SEQFORGE_SOURCE_ID \"${id}\"\n")
