# The CUDA module (the build's only; not installed as CMake code): what of
# the CUDA configuration needs CUDA's libraries, apart from libfsdp, which
# loads it when a run asks for a GPU (src/comm/cuda_module.h says why).

# fsdp_add_cuda_module(): call with the target fsdp made, after
# fsdp_find_nccl(). Makes the target fsdp_cuda (libfsdp_cuda.so in the build
# folder's top) and adds the loader to fsdp.
function(fsdp_add_cuda_module)
  # A MODULE: only ever dlopen()ed, never linked.
  add_library(fsdp_cuda MODULE src/comm/nccl_process_group.cpp src/core/device_memory_cuda.cpp
                               src/comm/cuda_module_entry.cpp)
  set_target_properties(fsdp_cuda PROPERTIES LIBRARY_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}")
  target_include_directories(fsdp_cuda PRIVATE "${CMAKE_SOURCE_DIR}/include" "${CMAKE_SOURCE_DIR}/src"
                                               "${FSDP_NCCL_INCLUDE_DIR}")
  # torch_cuda_library links libtorch_cuda --no-as-needed: the module calls
  # nothing in it by name, but loading it registers LibTorch's CUDA kernels,
  # allocator and hooks. NCCL is the one LibTorch loads (fsdp_find_nccl).
  if(TARGET torch_cuda_library)
    set(cuda_libraries torch_cuda_library)
  else()
    set(cuda_libraries "-Wl,--no-as-needed" torch_cuda "-Wl,--as-needed")
  endif()
  target_link_libraries(fsdp_cuda PRIVATE fsdp_libtorch_cpu ${cuda_libraries} c10_cuda "${FSDP_NCCL_LIBRARY}")
  target_link_options(fsdp_cuda PRIVATE ${FSDP_LIBTORCH_LINK_OPTIONS})
  target_compile_definitions(fsdp_cuda PRIVATE FSDP_CUDA=1)
  target_compile_options(fsdp_cuda PRIVATE -Wall -Wextra -Wno-unused-parameter)
  target_compile_features(fsdp_cuda PRIVATE cxx_std_17)

  # This build's identity, in the loader and the module alike: the loader
  # refuses a module of another build (another build folder's, an older
  # install's), whose classes may differ from the program's.
  if(NOT FSDP_BUILD_ID)
    string(RANDOM LENGTH 16 id)
    set(FSDP_BUILD_ID "${PROJECT_VERSION}-${id}" CACHE INTERNAL "this build folder's identity (the CUDA module's check)")
  endif()
  file(RELATIVE_PATH relative "${CMAKE_INSTALL_FULL_BINDIR}" "${CMAKE_INSTALL_FULL_LIBDIR}")
  target_sources(fsdp PRIVATE src/comm/cuda_module.cpp)
  # Without the precompiled header: its own definitions, and it includes
  # ATen's CUDA hooks interface.
  set_source_files_properties(src/comm/cuda_module.cpp PROPERTIES SKIP_PRECOMPILE_HEADERS ON COMPILE_DEFINITIONS
    "FSDP_CUDA_MODULE_BUILD_PATH=\"${CMAKE_BINARY_DIR}/libfsdp_cuda.so\";FSDP_CUDA_MODULE_INSTALL_PATH=\"${CMAKE_INSTALL_FULL_LIBDIR}/libfsdp_cuda.so\";FSDP_CUDA_MODULE_RELATIVE_DIR=\"${relative}\";FSDP_CUDA_MODULE_BUILD_ID=\"${FSDP_BUILD_ID}\"")
  set_source_files_properties(src/comm/cuda_module_entry.cpp PROPERTIES COMPILE_DEFINITIONS
    "FSDP_CUDA_MODULE_BUILD_ID=\"${FSDP_BUILD_ID}\"")
  # Built with libfsdp, so that every program that can load it finds it
  # built (gpu_check.sh builds only the targets it runs).
  add_dependencies(fsdp fsdp_cuda)
  # The module refers to libfsdp's classes (ProcessGroup, the watchdog) and
  # finds them in the program, which exports them: one copy of each class
  # (its vtable and typeinfo), the program's. A module holding its own copy
  # of libfsdp instead would give a ProcessGroup two typeinfos and two sets
  # of statics. INTERFACE, exported too: programs built against the installed
  # package export theirs as well.
  target_link_options(fsdp INTERFACE "LINKER:--export-dynamic")
endfunction()
