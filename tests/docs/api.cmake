# The API reference as a test: docs_api_reference builds it (doxygen on the
# Doxyfile that CMake configured from docs/Doxyfile.in) and fails, printing
# what doxygen said, when a public name of include/fsdp/*.h has no comment or
# a comment has a doc error (a \param naming no parameter, an unknown command
# or HTML tag, a \ref to nothing). Doxygen 1.9 does not warn about an enum
# value without a comment, nor about a class without members (a TORCH_MODULE
# holder), so the run then reads the XML doxygen wrote for those.
#
# This file is read twice: by tests/CMakeLists.txt (through docs/docs.cmake),
# to register the test, and by `cmake -P` as the check itself, which the
# top-level `docs` target runs too (so the two cannot disagree):
#   cmake -DDOXYGEN_EXECUTABLE=... -DDOXYFILE=... -DOUTPUT_DIR=... -P tests/docs/api.cmake

if(CMAKE_SCRIPT_MODE_FILE)
  foreach(required DOXYGEN_EXECUTABLE DOXYFILE OUTPUT_DIR)
    if(NOT ${required})
      message(FATAL_ERROR "api.cmake: pass -D${required}=... (see the top of ${CMAKE_CURRENT_LIST_FILE})")
    endif()
  endforeach()
  # A fresh output: an XML file left by a class that no longer exists would
  # be read as if it did.
  file(REMOVE_RECURSE "${OUTPUT_DIR}/html" "${OUTPUT_DIR}/xml")
  file(MAKE_DIRECTORY "${OUTPUT_DIR}")
  execute_process(COMMAND "${DOXYGEN_EXECUTABLE}" "${DOXYFILE}" RESULT_VARIABLE doxygen_status
                  OUTPUT_VARIABLE doxygen_output ERROR_VARIABLE doxygen_warnings)
  # Doxygen goes on after a warning (FAIL_ON_WARNINGS), so its XML is
  # complete either way: both kinds of problem are reported at once.
  set(problems "")
  if(NOT doxygen_status EQUAL 0 OR NOT doxygen_warnings STREQUAL "")
    string(APPEND problems "${doxygen_output}${doxygen_warnings}\n")
  endif()

  # What doxygen 1.9 lets pass: enum values and classes with an empty
  # description in its XML (a fixed format: a compound's own description is
  # indented by 4 spaces, a member's by 8).
  set(empty_description "<briefdescription>[ \n]*</briefdescription>[ \n]*<detaileddescription>[ \n]*</detaileddescription>")
  set(class_count 0)
  set(name_count 0)
  file(GLOB xml_files "${OUTPUT_DIR}/xml/*.xml")
  foreach(xml_file IN LISTS xml_files)
    file(READ "${xml_file}" xml)
    if(xml MATCHES "<compounddef id=\"[^\"]*\" kind=\"(class|struct|namespace)\"")
      string(REGEX MATCHALL "<memberdef kind=\"[a-z]*\" id=\"[^\"]*\" prot=\"(public|protected)\"" names "${xml}")
      string(REGEX MATCHALL "<enumvalue " values "${xml}")
      list(LENGTH names count)
      list(LENGTH values value_count)
      math(EXPR name_count "${name_count} + ${count} + ${value_count}")
    endif()
    if(xml MATCHES "<compounddef id=\"[^\"]*\" kind=\"(class|struct)\"[^>]*>[ \n]*<compoundname>([^<]*)</compoundname>")
      math(EXPR class_count "${class_count} + 1")
      set(compound "${CMAKE_MATCH_2}")
      if(xml MATCHES "\n    ${empty_description}" AND xml MATCHES "\n    <location file=\"([^\"]*)\" line=\"([0-9]+)\"")
        string(APPEND problems "include/${CMAKE_MATCH_1}:${CMAKE_MATCH_2}: class ${compound} is not documented.\n")
      endif()
    endif()
    # Each enum's block: its name, where it is, and its values without a comment.
    set(rest "${xml}")
    string(FIND "${rest}" "<memberdef kind=\"enum\"" start)
    while(start GREATER -1)
      string(SUBSTRING "${rest}" ${start} -1 rest)
      string(FIND "${rest}" "</memberdef>" end)
      string(SUBSTRING "${rest}" 0 ${end} enum)
      string(SUBSTRING "${rest}" ${end} -1 rest)
      string(REGEX MATCH "<qualifiedname>([^<]*)</qualifiedname>" _ "${enum}")
      set(enum_name "${CMAKE_MATCH_1}")
      string(REGEX MATCH "<location file=\"([^\"]*)\" line=\"([0-9]+)\"" _ "${enum}")
      set(where "include/${CMAKE_MATCH_1}:${CMAKE_MATCH_2}")
      string(REGEX MATCHALL "<enumvalue [^>]*>[ \n]*<name>[^<]*</name>[ \n]*(<initializer>[^<]*</initializer>[ \n]*)?${empty_description}"
             undocumented "${enum}")
      foreach(value IN LISTS undocumented)
        string(REGEX MATCH "<name>([^<]*)</name>" _ "${value}")
        string(APPEND problems "${where}: enum value ${enum_name}::${CMAKE_MATCH_1} is not documented.\n")
      endforeach()
      string(FIND "${rest}" "<memberdef kind=\"enum\"" start)
    endwhile()
  endforeach()
  if(NOT problems STREQUAL "")
    # Indented, so that CMake prints each line as it is instead of reflowing it.
    string(STRIP "${problems}" problems)
    string(REPLACE "\n" "\n  " problems "  ${problems}")
    message(FATAL_ERROR "The API reference has problems (doxygen exited with ${doxygen_status}; every warning "
                        "fails it): document each public name with a /// comment before it, or ///< after a "
                        "member or enum value on its line, and fix each doc error:\n${problems}\n")
  endif()

  message(STATUS "API reference: ${OUTPUT_DIR}/html/index.html (${class_count} classes, ${name_count} public "
                 "names in them and in the namespaces with the enum values; no name without a comment)")
  return()
endif()

if(NOT DOXYGEN_EXECUTABLE)
  # The top-level CMakeLists.txt looked for it; reported as a skip, not a pass.
  add_test(NAME docs_api_reference
           COMMAND ${CMAKE_COMMAND} -E echo "docs_api_reference skipped: doxygen is not installed (Debian: apt-get install doxygen)")
  set_tests_properties(docs_api_reference PROPERTIES SKIP_REGULAR_EXPRESSION "skipped: doxygen")
  return()
endif()
add_test(NAME docs_api_reference
         COMMAND ${CMAKE_COMMAND} -DDOXYGEN_EXECUTABLE=${DOXYGEN_EXECUTABLE} -DDOXYFILE=${CMAKE_BINARY_DIR}/docs/Doxyfile
                 -DOUTPUT_DIR=${CMAKE_BINARY_DIR}/docs/api -P ${CMAKE_CURRENT_LIST_FILE})
set_tests_properties(docs_api_reference PROPERTIES TIMEOUT 120 LABELS docs)
