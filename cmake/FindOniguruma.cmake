# Finds Oniguruma (Debian: libonig-dev), the regular expressions of Hugging
# Face tokenizers' pre-tokenizers (the `tokenizers` package uses the same
# library, so patterns match alike): its header oniguruma.h and its library,
# as the imported target Oniguruma::Oniguruma.
find_path(Oniguruma_INCLUDE_DIR oniguruma.h)
find_library(Oniguruma_LIBRARY NAMES onig)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Oniguruma REQUIRED_VARS Oniguruma_LIBRARY Oniguruma_INCLUDE_DIR
                                  REASON_FAILURE_MESSAGE "install Debian's libonig-dev (scripts/setup.sh does)")
mark_as_advanced(Oniguruma_INCLUDE_DIR Oniguruma_LIBRARY)
if(Oniguruma_FOUND AND NOT TARGET Oniguruma::Oniguruma)
  add_library(Oniguruma::Oniguruma UNKNOWN IMPORTED)
  set_target_properties(Oniguruma::Oniguruma PROPERTIES IMPORTED_LOCATION "${Oniguruma_LIBRARY}"
                                                        INTERFACE_INCLUDE_DIRECTORIES "${Oniguruma_INCLUDE_DIR}")
endif()
