# The docs' examples, checked by the suite (included from tests/CMakeLists.txt
# through docs/docs.cmake, so CMAKE_CURRENT_SOURCE_DIR is tests/).
#
# The example programs the pages show that the top-level CMakeLists.txt does
# not already build (example-mlp, example-llama): built with the tree, so a
# page's C++ is always code that compiles.
add_executable(example-train-step ${PROJECT_SOURCE_DIR}/examples/train_step.cpp)
target_link_libraries(example-train-step PRIVATE fsdp)
target_precompile_headers(example-train-step REUSE_FROM fsdp)
# Beside the other examples (build/example-mlp), where the pages run it from.
set_target_properties(example-train-step PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})

# docs_cpp_examples: every ```cpp and ```cmake block of README.md and docs/*.md
# is a file under examples/ (or a range of its lines), included verbatim; and
# every link between the pages leads to a page and a heading that exist.
add_test(NAME docs_cpp_examples
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/docs/run_examples.sh --includes-only ${CMAKE_BINARY_DIR})
set_tests_properties(docs_cpp_examples PROPERTIES TIMEOUT 60 LABELS docs)

# docs_shell_examples: every ```sh block of the pages runs (in a scratch
# folder where build/ is this build), except those marked
# <!-- not run in the suite: REASON -->, which it lists.
add_test(NAME docs_shell_examples
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/docs/run_examples.sh ${CMAKE_BINARY_DIR})
set_tests_properties(docs_shell_examples PROPERTIES TIMEOUT 300 PROCESSORS 2 LABELS "docs;mpi")
