# The trainer cases: the tools end to end, as a user runs them. One table
# (trainer/cases.sh), one runner (trainer/run.sh); each row is registered
# here as trainer_<case>, read from `run.sh --list`. A case that cannot run
# here exits 77, which ctest reports as skipped, not passed.
set(trainer_runner ${CMAKE_CURRENT_SOURCE_DIR}/trainer/run.sh)
file(GLOB trainer_case_files CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/trainer/cases/*.sh)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
             ${trainer_runner} ${CMAKE_CURRENT_SOURCE_DIR}/trainer/cases.sh ${CMAKE_CURRENT_SOURCE_DIR}/trainer/lib.sh)
execute_process(COMMAND bash ${trainer_runner} --list
                OUTPUT_VARIABLE trainer_table RESULT_VARIABLE trainer_list_status)
if(NOT trainer_list_status EQUAL 0)
  message(FATAL_ERROR "bash ${trainer_runner} --list failed (${trainer_list_status}): the trainer cases' table does not read")
endif()
string(REPLACE ";" "," trainer_table "${trainer_table}")  # a claim's ";" would split the list
string(REGEX MATCHALL "[^\n]+" trainer_rows "${trainer_table}")
foreach(trainer_row ${trainer_rows})
  string(REGEX REPLACE "\t.*" "" case "${trainer_row}")
  add_test(NAME trainer_${case} COMMAND bash ${trainer_runner} ${CMAKE_BINARY_DIR} ${case})
  set_tests_properties(trainer_${case} PROPERTIES TIMEOUT 600 PROCESSORS 2 LABELS mpi SKIP_RETURN_CODE 77)
endforeach()
# Labels for the cases that need more than a CPU: a GPU; root (network namespaces).
set_tests_properties(trainer_gpu PROPERTIES LABELS "mpi;gpu;libtorch")
set_tests_properties(trainer_multi-host PROPERTIES LABELS "mpi;hosts")
# The cases whose outcome can differ between LibTorch versions, beyond the
# gtests (which all carry the label): the build and the package against this
# LibTorch, its CUDA module and what a CPU run maps, checkpoints an older
# build wrote, the attention kernel it has, and the comparisons with PyTorch
# itself (docs/how-it-works.md,
# "Which tests run against which LibTorch", says why each).
foreach(case install libtorch-mismatch cpu-without-cuda checkpoint-compat adamw-bench-aten bench-peers attention)
  set_tests_properties(trainer_${case} PROPERTIES LABELS "mpi;libtorch")
endforeach()
# The cases that need the Python references (.venv/: torch, transformers),
# which scripts/test.sh runs once those are installed.
foreach(case gpu-check bench-peers libtorch-mismatch)
  set_property(TEST trainer_${case} APPEND PROPERTY LABELS python)
endforeach()
