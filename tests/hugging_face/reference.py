"""The transformers side of the Hugging Face checks (tests/hugging_face/run.sh).

  reference.py make KIND DIR            a small randomly initialised model, seeded, saved with save_pretrained:
                                        gpt2, llama, or a family of FAMILIES (llama3, mistral, qwen2, qwen3, phi3)
  reference.py compare DIR LOGITS.json  from_pretrained(DIR) (no missing or unexpected keys), its logits for the
                                        JSON's tokens against the JSON's, in float32; prints the max abs difference
  reference.py same A B                 two safetensors files, or the weights of two folders (every shard), hold
                                        the same tensors, bit for bit
  reference.py hub DIR OUT              GPT-2 DIR as the hub serves it (no transformer. prefix, old files' attn.bias
                                        buffers; OUT/bf16.safetensors in BF16), and OUT-relu, -eps, -untied,
                                        -sharded: configs fsdp-cpp refuses
  reference.py peft-make BASE TARGETS DIR
                                        PEFT's own LoRA adapters (r 4, alpha 8, TARGETS comma-separated) on
                                        from_pretrained(BASE), A and B random (seeded, B not zero), save_pretrained'd
  reference.py peft-compare BASE ADAPTER LOGITS.json
                                        PeftModel.from_pretrained(from_pretrained(BASE), ADAPTER): its logits for
                                        the JSON's tokens against the JSON's (1e-5), and ADAPTER/adapter_config.json
                                        with the keys PEFT writes
Several commands in one run, between "+" (one interpreter start instead of one per command:
importing torch and transformers is most of each):
  reference.py compare A A.json + same X Y + ...
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

try:
    import torch
    import transformers
except ImportError as e:  # run.sh turns this into a skip (77) unless CI is set
    print(f"reference.py: {e}", file=sys.stderr)
    sys.exit(77)

transformers.logging.set_verbosity_error()
TOLERANCE = 1e-5


# The Llama-like shape every family is made in.
SMALL = dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=32, vocab_size=300, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)
# The hub's Llama-like families, each with the config features it ships: the
# config and model classes, and the features over SMALL. llama3's scaling
# (head_dim 16, original context 64) takes all three of its branches: the
# highest frequency kept, two smoothed, the rest divided by the factor.
FAMILIES = {
    "llama3": ("LlamaConfig", "LlamaForCausalLM",
               dict(tie_word_embeddings=True,
                    rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0,
                                         high_freq_factor=4.0, original_max_position_embeddings=64))),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=32, tie_word_embeddings=False)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",
              dict(tie_word_embeddings=True, rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0))),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=32, tie_word_embeddings=False)),
    # fused qkv_proj and gate_up_proj; Phi-3 mini's window (2047 of 4096) here as long as the context
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(sliding_window=32, pad_token_id=0, tie_word_embeddings=False)),
}


def make(kind, folder):
    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=32, vocab_size=300,
                                         activation_function="gelu_new", bos_token_id=299, eos_token_id=299)
        model = transformers.GPT2LMHeadModel(config)
    elif kind == "llama":
        config = transformers.LlamaConfig(**SMALL, rope_theta=10000.0, tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(config)
    else:  # a family of FAMILIES: its config features on the small shape
        config_class, model_class, features = FAMILIES[kind]
        model = getattr(transformers, model_class)(getattr(transformers, config_class)(**SMALL, **features))
    with torch.no_grad():  # biases and norms away from their zeros and ones, so that a mix-up shows
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    if kind == "qwen2":  # as the hub ships every large model: shards and model.safetensors.index.json
        model.save_pretrained(folder, safe_serialization=True, max_shard_size="100KB")
    elif kind == "mistral":  # as most downloads are stored: BF16
        model.to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
    else:
        model.save_pretrained(folder, safe_serialization=True)


def compare(folder, logits_path):
    model, info = transformers.AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True,
                                                                     torch_dtype=torch.float32)
    problems = {k: v for k, v in info.items() if v}
    if problems:
        print(f"from_pretrained({folder}) reports {problems}", file=sys.stderr)
        return 1
    model.eval()
    with open(logits_path) as f:
        theirs = json.load(f)
    tokens = torch.tensor([theirs["tokens"]])
    with torch.no_grad():
        ours = model(tokens).logits[0]
    diff = (ours - torch.tensor(theirs["logits"])).abs().max().item()
    print(f"max abs logit difference {diff:.3g} over {ours.numel()} logits ({type(model).__name__})")
    return 0 if diff <= TOLERANCE else 1


def load_weights(path):
    """A safetensors file's tensors, or those of every .safetensors file of a folder."""
    from safetensors.torch import load_file
    if not os.path.isdir(path):
        return load_file(path)
    tensors = {}
    for name in sorted(os.listdir(path)):
        if name.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(path, name)))
    return tensors


def same(a_path, b_path):
    a, b = load_weights(a_path), load_weights(b_path)
    if a.keys() != b.keys():
        print(f"{a_path} and {b_path} name other tensors: {sorted(a.keys() ^ b.keys())}", file=sys.stderr)
        return 1
    bad = [k for k in a if a[k].dtype != b[k].dtype or not a[k].equal(b[k])]
    if bad:
        print(f"{a_path} and {b_path} differ: {bad}", file=sys.stderr)
        return 1
    print(f"  {len(a)} tensors equal: {a_path.split('/')[-2:]} and {b_path.split('/')[-2:]}")
    return 0


def hub(src, dst):
    import shutil
    from safetensors.torch import load_file, save_file
    os.makedirs(dst)
    tensors = {k.removeprefix("transformer."): v for k, v in load_file(f"{src}/model.safetensors").items()}
    tensors.update({f"h.{i}.attn.bias": torch.ones(1, 1, 32, 32) for i in range(2)})  # old files' buffers
    save_file(tensors, f"{dst}/model.safetensors", metadata={"format": "pt"})
    shutil.copy(f"{src}/config.json", dst)
    save_file({k: v.bfloat16() for k, v in tensors.items()}, f"{dst}/bf16.safetensors", metadata={"format": "pt"})
    with open(f"{src}/config.json") as f:
        config = json.load(f)
    for name, change in {"relu": {"activation_function": "relu"}, "eps": {"layer_norm_epsilon": 1e-6},
                         "untied": {"tie_word_embeddings": False}}.items():
        os.makedirs(f"{dst}-{name}")
        shutil.copy(f"{dst}/model.safetensors", f"{dst}-{name}")
        with open(f"{dst}-{name}/config.json", "w") as f:
            json.dump({**config, **change}, f)
    os.makedirs(f"{dst}-sharded")
    shutil.copy(f"{src}/config.json", f"{dst}-sharded")
    with open(f"{dst}-sharded/model.safetensors.index.json", "w") as f:
        f.write("{}")


def base_model(folder):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)


def peft_make(base, targets, folder):
    import peft
    model = base_model(base)
    gpt2 = model.config.model_type == "gpt2"
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets.split(","), lora_dropout=0.0,
                             fan_in_fan_out=gpt2, task_type="CAUSAL_LM")
    model = peft.get_peft_model(model, config)
    torch.manual_seed(1)
    with torch.no_grad():  # B starts at zero: random, so that the adapters change the logits
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(0.1 * torch.randn_like(p))
    model.save_pretrained(folder)


def peft_compare(base, adapter, logits_path):
    import peft
    with open(os.path.join(adapter, "adapter_config.json")) as f:
        ours = json.load(f)
    written = peft.LoraConfig(r=4, target_modules=["x"], task_type="CAUSAL_LM").to_dict()
    missing = set(written) - set(ours) - {"peft_version"}  # to_dict() has no version; save_pretrained adds it
    if missing or set(ours) - set(written) - {"peft_version"}:
        print(f"{adapter}/adapter_config.json lacks {sorted(missing)}, has extra "
              f"{sorted(set(ours) - set(written) - {'peft_version'})}", file=sys.stderr)
        return 1
    model = peft.PeftModel.from_pretrained(base_model(base), adapter)
    model.eval()
    with open(logits_path) as f:
        theirs = json.load(f)
    tokens = torch.tensor([theirs["tokens"]])
    with torch.no_grad():
        logits = model(tokens).logits[0]
    diff = (logits - torch.tensor(theirs["logits"])).abs().max().item()
    print(f"max abs logit difference {diff:.3g} over {logits.numel()} logits (PEFT's LoRA over "
          f"{type(model.base_model.model).__name__}, {adapter.split('/')[-1]})")
    return 0 if diff <= TOLERANCE else 1


COMMANDS = {"make": (make, 2), "compare": (compare, 2), "same": (same, 2), "hub": (hub, 2),
            "peft-make": (peft_make, 3), "peft-compare": (peft_compare, 3)}

if __name__ == "__main__":
    args = sys.argv[1:]
    while args:
        name, args = args[0], args[1:]
        if name not in COMMANDS:
            sys.exit(f"reference.py: unknown command {name} (expected one of {', '.join(COMMANDS)})")
        function, arity = COMMANDS[name]
        if len(args) < arity or (len(args) > arity and args[arity] != "+"):
            sys.exit(f"reference.py: {name} takes {arity} arguments, got {args}")
        if function(*args[:arity]):
            sys.exit(1)
        args = args[arity + 1:]
