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
