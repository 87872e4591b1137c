# Finds Oniguruma (libonig), the regular expression engine of the tokenizers' pre-tokenizers.
find_path(Oniguruma_INCLUDE_DIR oniguruma.h)
find_library(Oniguruma_LIBRARY NAMES onig)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Oniguruma REQUIRED_VARS Oniguruma_LIBRARY Oniguruma_INCLUDE_DIR)
if(Oniguruma_FOUND AND NOT TARGET Oniguruma::onig)
  add_library(Oniguruma::onig UNKNOWN IMPORTED)
  set_target_properties(Oniguruma::onig PROPERTIES IMPORTED_LOCATION "${Oniguruma_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${Oniguruma_INCLUDE_DIR}")
endif()
