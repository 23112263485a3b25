# The fuzz targets, built by run.sh (which passes the variables): each
# target's own code and the library code under test compiled with clang's
# libFuzzer instrumentation and the sanitizers; the rest of the library
# (libfsdp.a) and LibTorch linked as built.
#   ROOT        the source tree
#   OUT         where objects and binaries go
#   TORCH_FLAGS LibTorch's defines, include folders and C++ standard (the build's flags.make)
#   LIBS        libfsdp.a and its libraries (the build's link line of fsdp-ckpt)
CXX := clang++
SANITIZE := -fsanitize=address,undefined -fno-sanitize-recover=undefined
CXXFLAGS := -g -O1 -w $(SANITIZE) -fsanitize=fuzzer-no-link -MMD -MP \
  -I$(ROOT)/include -I$(ROOT)/src $(TORCH_FLAGS) \
  -DFSDP_FUZZ_CHECKPOINT_FILES='"$(ROOT)/tests/fuzz/checkpoint"'

obj = $(OUT)/obj/$(1).o
HEADER := $(call obj,src/state_dict/safetensors_header)
SAFETENSORS := $(call obj,src/state_dict/safetensors) $(call obj,src/base/checksum) \
  $(call obj,src/base/file_io) $(HEADER)
# The checkpoint code (metadata.json's checks, saving, reading back).
CHECKPOINT := $(call obj,src/state_dict/checkpoint_schema) $(call obj,src/state_dict/checkpoint_save) \
  $(call obj,src/state_dict/checkpoint_load)

# The tokenizer reader is libfsdp_text's, without LibTorch: its own sources
# and their libraries (Oniguruma's regexes, ICU's normalization).
TEXT := $(call obj,src/text/tokenizer) $(call obj,src/text/tokenizer_json) $(call obj,src/text/pretokenizer) \
  $(call obj,src/text/utf8)
TEXT_LIBS := -lonig -licuuc -lpthread

header: $(OUT)/header_fuzz
reader: $(OUT)/reader_fuzz
metadata: $(OUT)/metadata_fuzz
tokenizer: $(OUT)/tokenizer_fuzz
config: $(OUT)/config_fuzz
all: header reader metadata tokenizer config
.PHONY: header reader metadata tokenizer config all

$(OUT)/header_fuzz: $(call obj,tests/fuzz/header_fuzz) $(HEADER)
$(OUT)/reader_fuzz: $(call obj,tests/fuzz/reader_fuzz) $(SAFETENSORS)
$(OUT)/metadata_fuzz: $(call obj,tests/fuzz/metadata_fuzz) $(CHECKPOINT) $(SAFETENSORS)
HF_ADAPTERS := $(call obj,src/models/hugging_face_adapter) $(call obj,src/models/gpt_hugging_face) \
  $(call obj,src/models/llama_hugging_face)
$(OUT)/config_fuzz: $(call obj,tests/fuzz/config_fuzz) $(call obj,src/state_dict/hugging_face) $(HF_ADAPTERS) \
  $(SAFETENSORS)
$(OUT)/tokenizer_fuzz: $(call obj,tests/fuzz/tokenizer_fuzz) $(TEXT)
	$(CXX) $(SANITIZE) -fsanitize=fuzzer $^ $(TEXT_LIBS) -o $@
$(OUT)/%_fuzz:
	$(CXX) $(SANITIZE) -fsanitize=fuzzer $^ $(LIBS) -o $@

# Writes the safetensors seeds (run.sh BUILD seeds).
$(OUT)/make_seeds: $(call obj,tests/fuzz/make_seeds) $(SAFETENSORS)
	$(CXX) $(SANITIZE) $^ $(LIBS) -o $@

$(OUT)/obj/%.o: $(ROOT)/%.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

-include $(shell find $(OUT)/obj -name '*.d' 2>/dev/null)
