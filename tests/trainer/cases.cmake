# The tools end to end, as a user runs them: one script per case in
# trainer/ (trainer/lib.sh holds what they share), each run as trainer_<case>.
file(GLOB trainer_cases CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/trainer/*.sh)
list(FILTER trainer_cases EXCLUDE REGEX "/lib\\.sh$")
foreach(script ${trainer_cases})
  get_filename_component(case ${script} NAME_WE)
  add_test(NAME trainer_${case} COMMAND bash ${script} ${CMAKE_BINARY_DIR})
  set_tests_properties(trainer_${case} PROPERTIES TIMEOUT 600 PROCESSORS 2 LABELS mpi)
endforeach()
# The GPU case skips (77) where there is no GPU.
set_tests_properties(trainer_gpu PROPERTIES LABELS "mpi;gpu" SKIP_RETURN_CODE 77)
# The multi-host case makes network namespaces: root only, skipped (77) otherwise.
set_tests_properties(trainer_multi-host PROPERTIES LABELS "mpi;hosts" SKIP_RETURN_CODE 77)
