# The docs checked by the suite: the API reference built from the public
# headers' comments (api.cmake) and the examples the pages show
# (examples.cmake).
include(${CMAKE_CURRENT_SOURCE_DIR}/docs/api.cmake OPTIONAL)
include(${CMAKE_CURRENT_SOURCE_DIR}/docs/examples.cmake OPTIONAL)
