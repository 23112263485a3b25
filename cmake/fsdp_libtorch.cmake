# Which LibTorch fsdp-cpp builds against, and checks that it is one LibTorch.
# Used by the build (CMakeLists.txt) and by the installed package
# (fsdp_cppConfig.cmake), so a consumer's link gets the same treatment.

# fsdp_check_libtorch(): call after find_package(Torch). Refuses headers of
# one LibTorch with libraries of another. LibTorch's config finds its
# libraries with find_library, which searches the system's folders before
# LibTorch's own: with CMAKE_PREFIX_PATH at a wheel's share/cmake on a machine
# with Debian's libtorch-dev, it silently pairs the wheel's headers with
# Debian's libtorch.so.
function(fsdp_check_libtorch)
  get_filename_component(prefix "${TORCH_INSTALL_PREFIX}" REALPATH)
  foreach(library TORCH_LIBRARY c10_LIBRARY)
    if(NOT ${library})
      continue()
    endif()
    get_filename_component(found "${${library}}" REALPATH)
    string(FIND "${found}" "${prefix}/" at)
    if(NOT at EQUAL 0)
      message(FATAL_ERROR
        "fsdp-cpp: LibTorch's headers and CMake files come from ${prefix} (Torch_DIR ${Torch_DIR}), "
        "but its library ${library} was found at ${found}, which belongs to another LibTorch. "
        "Name the LibTorch folder itself (the one holding include/, lib/ and share/cmake/Torch): "
        "-DFSDP_LIBTORCH=<folder> or -DCMAKE_PREFIX_PATH=<folder>; for a PyPI wheel that is "
        "python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))'.")
    endif()
  endforeach()
endfunction()

# fsdp_libtorch_link_options(<var>): the linker options a LibTorch needs
# beyond its own config. A PyPI wheel's libtorch_cuda.so finds its CUDA
# libraries (NCCL among them) in the sibling nvidia/*/lib folders through
# its RPATH; the linker must resolve them there too, not in an older CUDA
# toolkit's copy earlier on its search path (undefined nccl* symbols).
function(fsdp_libtorch_link_options out)
  get_filename_component(site "${TORCH_INSTALL_PREFIX}/.." ABSOLUTE)
  file(GLOB dirs LIST_DIRECTORIES true "${site}/nvidia/*/lib")
  set(options "")
  if(dirs)
    string(JOIN ":" joined ${dirs})
    set(options "LINKER:-rpath-link,${joined}")
  endif()
  set(${out} "${options}" PARENT_SCOPE)
endfunction()

# fsdp_find_nccl(): for the CUDA configuration, call after find_package(Torch).
# Sets FSDP_NCCL_INCLUDE_DIR, FSDP_NCCL_LIBRARY and FSDP_NCCL_VERSION. The
# NCCL to link is the one LibTorch itself loads: a PyPI wheel's
# nvidia/nccl/ package beside torch/ (libnccl.so.2, no unversioned link), so
# that one process never holds two NCCLs. Elsewhere: the CUDA toolkit's, then
# the system's. NCCL_ROOT overrides.
function(fsdp_find_nccl)
  get_filename_component(site "${TORCH_INSTALL_PREFIX}/.." ABSOLUTE)
  set(hints "${site}/nvidia/nccl")
  if(DEFINED ENV{NCCL_ROOT})
    list(PREPEND hints "$ENV{NCCL_ROOT}")
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    list(APPEND hints "${CUDAToolkit_LIBRARY_ROOT}" "${CUDAToolkit_TARGET_DIR}")
  endif()
  find_path(FSDP_NCCL_INCLUDE_DIR nccl.h HINTS ${hints} PATH_SUFFIXES include NO_CACHE)
  find_library(FSDP_NCCL_LIBRARY NAMES libnccl.so.2 nccl NAMES_PER_DIR HINTS ${hints} PATH_SUFFIXES lib lib64 NO_CACHE)
  if(NOT FSDP_NCCL_INCLUDE_DIR OR NOT FSDP_NCCL_LIBRARY)
    message(FATAL_ERROR "fsdp-cpp: the CUDA configuration needs NCCL (nccl.h and libnccl.so.2); looked in ${hints} "
                        "and the system's folders, found header '${FSDP_NCCL_INCLUDE_DIR}', library "
                        "'${FSDP_NCCL_LIBRARY}'. Install the nvidia-nccl-cu* wheel beside torch, or set NCCL_ROOT.")
  endif()
  file(STRINGS "${FSDP_NCCL_INCLUDE_DIR}/nccl.h" version_lines REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
  set(version "")
  foreach(line ${version_lines})
    string(REGEX REPLACE "^#define NCCL_[A-Z]+ +([0-9]+).*" "\\1" number "${line}")
    list(APPEND version "${number}")
  endforeach()
  string(JOIN "." version ${version})
  set(FSDP_NCCL_INCLUDE_DIR "${FSDP_NCCL_INCLUDE_DIR}" PARENT_SCOPE)
  set(FSDP_NCCL_LIBRARY "${FSDP_NCCL_LIBRARY}" PARENT_SCOPE)
  set(FSDP_NCCL_VERSION "${version}" PARENT_SCOPE)
endfunction()

# fsdp_libtorch_cpu(<target>): call after find_package(Torch). Makes
# <target>, an imported INTERFACE library: the LibTorch libfsdp and its
# programs link. Where LibTorch has CUDA (a PyPI wheel), only its CPU
# libraries (torch_cpu, c10), with the torch target's include folders and
# compile settings: linking libtorch would load libtorch_cuda, libc10_cuda and
# the CUDA runtime into every CPU run (about 200 MiB resident), and the CUDA
# configuration loads those with its module when a run asks for a GPU
# (src/comm/cuda_module.h). A program that makes CUDA tensors itself, before
# fsdp-cpp has loaded the module, links torch_cuda itself. Elsewhere
# (Debian's CPU-only LibTorch): TORCH_LIBRARIES, as LibTorch's config lists it.
function(fsdp_libtorch_cpu target)
  add_library(${target} INTERFACE IMPORTED)  # imported: never exported, made again by the package's config
  if(NOT (TARGET torch_cuda AND TARGET torch_cpu AND TARGET c10 AND TARGET torch))
    set_target_properties(${target} PROPERTIES INTERFACE_LINK_LIBRARIES "${TORCH_LIBRARIES}")
    return()
  endif()
  # torch_cpu_library links libtorch_cpu --no-as-needed: its static
  # registrations (operators, the CPU allocator) are what a program uses of it.
  set(cpu torch_cpu)
  if(TARGET torch_cpu_library)
    set(cpu torch_cpu_library)
  endif()
  set_target_properties(${target} PROPERTIES INTERFACE_LINK_LIBRARIES "${cpu};c10")
  foreach(property INTERFACE_INCLUDE_DIRECTORIES INTERFACE_COMPILE_OPTIONS INTERFACE_COMPILE_FEATURES
                   INTERFACE_COMPILE_DEFINITIONS)
    get_target_property(value torch ${property})
    if(value)
      set_property(TARGET ${target} APPEND PROPERTY ${property} "${value}")
    endif()
  endforeach()
endfunction()
