// tests/fixtures/ of this checkout, as CMake gives it (FSDP_TEST_FIXTURES), in
// a file of its own and outside the batches of fsdp_unity_batches: the path
// names the checkout's folder, and so makes this compile one the compiler
// cache cannot reuse in another clone.

const char* fsdp_test_fixtures() { return FSDP_TEST_FIXTURES; }
