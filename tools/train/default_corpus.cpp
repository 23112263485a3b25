// The built-in corpus's path, as CMake gives it (FSDP_DEFAULT_CORPUS), in a
// file of its own: the path names the checkout's folder, and so makes this
// compile one the compiler cache cannot reuse in another clone. Declared in
// train/setup.h, which is not included: this file compiles without LibTorch.

namespace fsdp_train {

const char* default_corpus_path() { return FSDP_DEFAULT_CORPUS; }

}  // namespace fsdp_train
